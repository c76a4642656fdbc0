"""Devices: which one a job trains on, what its log says, several runs per GPU, and (marker ``gpu``)
correctness on CUDA.

The unmarked tests run everywhere. The ``gpu`` tests need CUDA and skip with the reason otherwise;
``fedrepro check-gpu`` (or ``pytest -m gpu``) runs them. They import only torch, torchvision and the
package (no snakemake, mlflow), so a GPU node with only a site PyTorch runs them from a checkout
with ``PYTHONPATH=src``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import ROOT, make_partition, train_args
from fedrepro import cli, identity
from fedrepro.configure import settings
from fedrepro.ops import slots
from fedrepro.run.process import pick_device

BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 4,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
    "algorithm": "fedavg",
}

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


# --------------------------------------------------------------------------- device choice (CPU)


@no_cuda
@pytest.mark.parametrize(
    "grant",
    [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"SLURM_JOB_GPUS": "3"},
        {"SLURM_STEP_GPUS": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "GPU-5ad1"},
    ],
)
def test_job_given_a_gpu_without_cuda_fails_clearly(grant):
    with pytest.raises(RuntimeError) as err:
        pick_device("auto", environ=grant)
    message = str(err.value)
    name = next(iter(grant))
    assert "given a GPU" in message and name in message and torch.__version__ in message
    assert "device: cpu" in message  # the way out is named


@no_cuda
@pytest.mark.parametrize(
    "environ", [{}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"}, {"SLURM_JOB_ID": "7"}]
)
def test_auto_without_a_gpu_grant_trains_on_cpu(environ):
    assert pick_device("auto", environ=environ) == torch.device("cpu")


@no_cuda
def test_cuda_asked_for_without_cuda_fails():
    with pytest.raises(RuntimeError, match="device: cuda was asked for"):
        pick_device("cuda", environ={})


def test_cpu_is_cpu_even_with_a_gpu_grant():
    assert pick_device("cpu", environ={"CUDA_VISIBLE_DEVICES": "0"}) == torch.device("cpu")


def test_train_log_starts_with_device_versions_and_resume(tmp_path, partition_dir, tiny_data_root, capfd):
    out = tmp_path / "run"
    cli.main(train_args(BASE, out, partition_dir, tiny_data_root, "--stop-after", "2"))
    first = capfd.readouterr().err.splitlines()[0]
    assert first == (
        f"fedrepro train: device cpu; torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}; fresh start"
    )
    cli.main(train_args(BASE, out, partition_dir, tiny_data_root))
    assert capfd.readouterr().err.splitlines()[0].endswith("; resumed at round 2")


@pytest.mark.parametrize("precision,tf32", [("float32", False), ("tf32", True)])
def test_precision_sets_the_process_arithmetic_and_names_the_run(
    precision, tf32, tmp_path, partition_dir, tiny_data_root
):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        # start from the opposite: float32 must switch off cuDNN's TF32, which torch leaves on by default
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
        cli.main(
            train_args({**BASE, "rounds": 1, "precision": precision}, tmp_path / "run", partition_dir, tiny_data_root)
        )
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    ids = {p: identity.run_id(settings.resolve({**BASE, "precision": p})) for p in ("float32", "tf32")}
    assert ids["float32"] != ids["tf32"]  # the arithmetic is part of what a run is
    assert settings.resolve(BASE)["precision"] == "float32"  # and float32 unless asked


# --------------------------------------------------------------------------- several runs per GPU (CPU)

HOLD = textwrap.dedent("""
    import sys, time
    from fedrepro.ops import slots
    print(slots.acquire(sys.argv[1]), flush=True)
    time.sleep(float(sys.argv[2]))
""")


def test_concurrent_jobs_hold_distinct_slots_and_free_them(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "30"], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    try:
        taken = sorted(int(p.stdout.readline()) for p in holders)
        assert taken == [0, 1, 2]
        holders[1].kill()  # whichever slot it held is free again once the process is gone
        holders[1].wait()
        again = subprocess.run(
            [sys.executable, "-c", HOLD, str(tmp_path), "0"], capture_output=True, text=True, env=env, timeout=60
        )
        assert int(again.stdout) in taken and int(again.stdout) < 3
    finally:
        for p in holders:
            p.kill()
            p.wait()


@pytest.mark.parametrize("gpus,per_gpu", [(1, 4), (2, 3), (4, 2), (3, 1)])
def test_slots_spread_jobs_evenly_over_gpus(gpus, per_gpu):
    # Snakemake admits at most gpus x per_gpu jobs; any set of held slots below that bound
    # (the lowest free slot is always taken) puts at most per_gpu jobs on one GPU
    slots_in_use = range(gpus * per_gpu)
    load = [0] * gpus
    for slot in slots_in_use:
        load[slots.gpu_for_slot(slot, gpus)] += 1
    assert load == [per_gpu] * gpus


def test_slot_folder_is_per_slurm_allocation():
    assert slots.slot_dir({"SLURM_JOB_ID": "41"}) != slots.slot_dir({"SLURM_JOB_ID": "42"})
    assert slots.slot_dir({"FEDREPRO_SLOT_DIR": "/x/y"}) == Path("/x/y")


# --------------------------------------------------------------------------- correctness on CUDA (marker gpu)

from fedrepro.ops import gpucheck  # noqa: E402

cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'})",
)


@pytest.mark.gpu
@cuda
def test_every_model_family_forward_backward_on_cuda():
    assert len(gpucheck.check_models("cuda")) >= len(gpucheck.catalog.MODELS) - 1


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("method", gpucheck.method_names())
def test_every_method_and_plugin_runs_on_cuda(method):
    gpucheck.check_method(method, "cuda")


@pytest.mark.gpu
@cuda
def test_cohort_path_matches_sequential_on_cuda():
    gpucheck.check_cohort_matches_sequential("cuda")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("method", gpucheck.method_names())
def test_every_method_trains_batched_as_sequential_on_cuda(method):
    gpucheck.check_batched_matches_sequential(method, "cuda")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("step_graph", ["static", "compile"])
def test_the_static_step_trains_as_sequential_on_cuda(step_graph):
    """step_graph compile on CUDA: inductor with mode reduce-overhead, replayed as CUDA graphs."""
    assert gpucheck.check_batched_matches_sequential("fedavg", "cuda", step_graph=step_graph)["path"] == "batched"


@pytest.mark.gpu
@cuda
def test_exact_resume_on_cuda():
    gpucheck.check_exact_resume("cuda")


@pytest.mark.gpu
@cuda
def test_forked_child_on_cuda():
    gpucheck.check_fork_child("cuda")


@pytest.mark.gpu
@cuda
def test_evaluation_in_eval_mode_on_cuda():
    gpucheck.check_eval_mode("cuda")


# --------------------------------------------------------------------------- the same checks on the CPU


def test_checks_hold_on_cpu():
    """The GPU checks are known to run (and pass) before a GPU ever sees them."""
    assert "vgg11/cifar10" in gpucheck.check_models("cpu")
    assert gpucheck.check_cohort_matches_sequential("cpu") < 1e-4
    gpucheck.check_exact_resume("cpu")
    gpucheck.check_fork_child("cpu")
    gpucheck.check_eval_mode("cpu")


def test_batched_check_holds_on_cpu():
    """The device check of batched = sequential runs here first: a method with client state batches, and
    FedFA (a feature loss, per-step calibration, per-epoch anchors) too, its last round calibrating."""
    scaffold = gpucheck.check_batched_matches_sequential("scaffold", "cpu")
    assert scaffold["path"] == "batched" and scaffold["relative_gap"] < 1e-4
    assert len(set(scaffold["steps"])) > 1  # unequal clients: masked steps
    fedfa = gpucheck.check_batched_matches_sequential("fedfa", "cpu")
    assert fedfa["path"] == "batched" and fedfa["relative_gap"] < 1e-4
    # the static-shape step's device check (compile on CUDA; not compiled here: inductor takes minutes on a CPU)
    static = gpucheck.check_batched_matches_sequential("fedavg", "cpu", step_graph="static")
    assert static["path"] == "batched" and len(set(static["steps"])) > 1


@pytest.mark.slow
def test_every_method_check_runs_on_cpu():
    failures = {}
    for method in gpucheck.method_names():
        try:
            gpucheck.check_method(method, "cpu")
        except Exception as err:  # noqa: BLE001 (all failures at once)
            failures[method] = repr(err)[:300]
    assert not failures, failures


BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("snakemake", "mlflow"):
                raise ImportError(f"{name} is not installed on this GPU node")
    sys.meta_path.insert(0, Block())
""")


def test_gpu_check_imports_neither_snakemake_nor_mlflow(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'src'}"}
    probe = (
        "import sys\nfrom fedrepro import cli; from fedrepro.ops import gpucheck, bench, slots\n"
        "from fedrepro.run import jobs\n"
        "gpucheck.check_cohort_matches_sequential('cpu')\n"
        "assert not any(m.split('.')[0] in ('snakemake', 'mlflow') for m in sys.modules)\n"
        "import snakemake\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    # the block is active (the last import fails) and nothing before it needed those packages
    assert "snakemake is not installed on this GPU node" in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("Traceback") == 1 and "line 6" in proc.stderr, proc.stderr[-2000:]


@no_cuda
def test_check_gpu_without_cuda_says_so(capsys):
    with pytest.raises(SystemExit, match="sees no CUDA device; run it on a GPU node"):
        cli.main(["check-gpu", "--skip-bench"])


def test_step_costs_of_the_papers_in_plans_format(tmp_path, monkeypatch):
    """What check-gpu measures for `fedrepro plan` (here on the CPU, for a one-setting params file)."""
    import yaml

    from fedrepro.ops import pricing

    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "experiments": {
                    "e": {
                        "base": {"dataset": "fmnist", "model": "mlp", "num_clients": 10, "batch_size": 32},
                        "grid": {"seed": [1, 2]},
                    }
                }
            }
        )
    )
    monkeypatch.setattr(gpucheck, "PAPER_PARAMS", [str(params), str(tmp_path / "absent.yaml")])
    out = tmp_path / "step_costs.json"
    table = gpucheck.measure_step_costs("cpu", out, log=lambda line: None)
    assert list(table["step_seconds"]) == ["fmnist/mlp:32"] and table["step_seconds"]["fmnist/mlp:32"] > 0
    measured = pricing.step_costs("cpu", out).tables[0]
    assert measured.costs == table["step_seconds"] and measured.description.startswith("measured on cpu")


class _DeviceTensor(torch.Tensor):
    """A tensor that behaves as one on a GPU does: numpy() refuses it, cpu() gives a host tensor."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args, **kwargs):
        return torch.Tensor(self.as_subclass(torch.Tensor).clone())


def test_a_state_loaded_onto_a_gpu_restores(tmp_path):
    """A checkpoint or fork state is loaded onto the run's device; on CUDA its cosine and snapshot arrays
    arrive there too, and restoring them must copy them to the host (on an H200 every resume and every
    +IMA child failed here before). The tensors below refuse numpy() as CUDA tensors do."""
    from fedrepro.ops.gpucheck import _trainer, tiny_fmnist

    datasets = tiny_fmnist()
    trainer = _trainer(BASE, tmp_path / "a", "cpu", datasets)
    trainer.run(progress=False, stop_after=2)
    state = trainer.state(2)
    assert state["cosines"], "the run kept no cosine matrices, so nothing is checked"
    on_device = {
        key: {k: v.as_subclass(_DeviceTensor) for k, v in state[key].items()} for key in ("cosines", "snapshots")
    }
    with pytest.raises(TypeError):
        next(iter(on_device["cosines"].values())).numpy()
    resumed = _trainer(BASE, tmp_path / "b", "cpu", datasets)
    resumed.restore({**state, **on_device})
    assert resumed.cosines.matrices.keys() == trainer.cosines.matrices.keys()
    for k, v in trainer.cosines.matrices.items():
        assert (resumed.cosines.matrices[k] == v).all()
