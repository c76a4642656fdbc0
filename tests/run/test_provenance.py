"""provenance: what a run's summary records about the software and the machine it ran on, the GPU stack and
the determinism switches included (a fake GPU record stands in for a GPU on a machine without one)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_partition
from fedrepro import cli
from fedrepro.run import provenance

FAKE_GPU = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2, "driver": "570.86.15"}
SETTING = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 2,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
    "algorithm": "fedavg",
}


def test_a_runs_summary_records_torch_cuda_cudnn_driver_gpu_and_the_determinism_switches(
    tiny_data_root, tmp_path, monkeypatch
):
    monkeypatch.setattr(provenance, "gpu_record", lambda device: dict(FAKE_GPU))
    part = make_partition(tiny_data_root, tmp_path / "part", num_clients=4)
    out = tmp_path / "run"
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(SETTING),
            "--partition",
            str(part),
            "--data-root",
            str(tiny_data_root),
            "--out",
            str(out),
            "--no-progress",
            "--threads",
            "1",
        ]
    )
    record = json.loads((out / "summary.json").read_text())["accelerator"]
    assert record["torch"] == torch.__version__
    assert record["cuda"] == torch.version.cuda and record["cudnn"] == (
        torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    )
    assert record["gpu"] == FAKE_GPU
    flags = record["determinism"]
    assert flags["deterministic_algorithms"] is torch.are_deterministic_algorithms_enabled()
    assert {
        "cudnn_deterministic",
        "cudnn_benchmark",
        "matmul_allow_tf32",
        "cudnn_allow_tf32",
        "float32_matmul_precision",
        "cublas_workspace_config",
    } <= set(flags)


def test_the_determinism_record_follows_the_switches(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    benchmark = torch.backends.cudnn.benchmark
    try:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = True
        flags = provenance.determinism()
    finally:
        torch.use_deterministic_algorithms(before)
        torch.backends.cudnn.benchmark = benchmark
    assert flags["deterministic_algorithms"] is True and flags["cudnn_benchmark"] is True
    assert flags["cublas_workspace_config"] == ":4096:8"
    assert provenance.determinism()["deterministic_algorithms"] is before


def test_on_the_cpu_there_is_no_gpu_record():
    assert provenance.gpu_record("cpu") is None
    assert provenance.accelerator("cpu")["gpu"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_the_gpu_record_names_the_real_gpu_and_its_driver():
    record = provenance.gpu_record("cuda")
    assert record["name"] == torch.cuda.get_device_name()
    assert record["driver"] and record["driver"][0].isdigit()


def test_the_driver_release_is_read_from_the_kernel_module(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
        "(dvs-builder@U16-A24-23-2)  Thu Jan 16 2025\nGCC version:  gcc version 12.3.0\n"
    )
    assert provenance.driver_version(proc) == "570.86.15"
