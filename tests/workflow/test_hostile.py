"""Hostile input and faults (issue #15): every bad params file is refused before any job, naming its key;
names and paths from a params file never reach a shell unquoted or leave the project; corrupt files
are named; every fault recovers in one rerun.

tests/hostile_params/*.yaml each start with ``# expect: TEXT``: the error must contain TEXT (the key).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, snakemake_cmd, subprocess_env
from fedrepro import cli

HOSTILE = ROOT / "tests" / "hostile_params"
BAD_FILES = sorted(HOSTILE.glob("*.yaml"))
GOOD = "experiments:\n  a: {base: {num_clients: 4, rounds: 2}, grid: {seed: [1]}}\n"


def expected(path: Path, by: str = "expect") -> str:
    """The text the error must contain; ``# snakemake: TEXT`` where Snakemake's own config loader
    refuses the file before the Snakefile runs (it cannot name our keys)."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# expect: "), path
    for line in lines:
        if line.startswith(f"# {by}: "):
            return line[len(f"# {by}: ") :]
    return lines[0][len("# expect: ") :]


def expand_error(capsys, *files) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["expand", "--configfile", *map(str, files)])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_cmd(workdir, "-n", "-p", *args), capture_output=True, text=True, env=subprocess_env(), timeout=300
    )


def test_there_are_many_bad_files():
    assert len(BAD_FILES) >= 30


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_expand_refuses_naming_the_key(path, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = expand_error(capsys, path)
    assert expected(path) in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir()), "nothing is written"


def test_a_typo_is_reported_once_not_once_per_grid_point(capsys):
    err = expand_error(capsys, HOSTILE / "typo_top_level.yaml")
    assert err.count("clients_per_round") == 1, err
    assert len(err) < 1500, "the whole resolved setting is not printed"
    assert "allowed keys" in err


def test_merge_keys_are_not_duplicates(tmp_path):
    from fedrepro.configure import paramsfile

    path = tmp_path / "p.yaml"
    path.write_text(
        "base: &b {num_clients: 4, rounds: 2}\nexperiments:\n  a:\n    base:\n      <<: *b\n"
        "      rounds: 3\n    grid: {seed: [1]}\n"
    )
    assert paramsfile.read_yaml(path)["experiments"]["a"]["base"] == {"num_clients": 4, "rounds": 3}


# ------------------------------------------------------------------ snakemake -n: refused before any job

SNAKEMAKE_FAST = ["root_command", "experiment_traversal", "duplicate_key"]


def _check_refused(path: Path, workdir: Path, proc: subprocess.CompletedProcess):
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert expected(path, "snakemake") in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert not (workdir / "pwned").exists() and not (workdir.parent / "pwned").exists()


@pytest.mark.parametrize("name", SNAKEMAKE_FAST)
def test_snakemake_refuses(name, tmp_path):
    path = HOSTILE / f"{name}.yaml"
    _check_refused(path, tmp_path, dry_run(tmp_path, "--configfile", str(path)))


# Snakemake reads a params file with its own loader and hands the result to the checks `fedrepro expand` runs
# (tested above on every file). A file both loaders read alike meets the same checks either way, so `snakemake
# -n` runs on the files the two loaders read differently, on those whose values would reach a shell, and on
# one file for each stage of the Snakefile's checks after loading.
LOADERS_DIFFER = {
    "alias_bomb",
    "duplicate_key",
    "not_a_mapping",
    "python_object",
    "python_tuple",
    "recursive_alias",
    "yte",
}
REACH_A_SHELL = {"root_command", "experiment_command", "unknown_algorithm"}
ONE_PER_STAGE = {"grid_not_list", "nonfinite_in_grid", "duplicate_point", "root_escape"}  # schema, expansion, root
SNAKEMAKE_REST = [
    p for p in BAD_FILES if p.stem in LOADERS_DIFFER | REACH_A_SHELL | ONE_PER_STAGE and p.stem not in SNAKEMAKE_FAST
]


def _same(a, b) -> bool:
    """Equal values of the same types (nan equal to nan: the loaders read `.nan` alike)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_the_loaders_differ_exactly_on_the_files_snakemake_is_run_on_for_that(path):
    """Every bad file both loaders read alike is left to the in-process check; every other one is in
    LOADERS_DIFFER, and so is dry-run through Snakemake."""
    from snakemake.common.configfile import load_configfile

    from fedrepro.configure import paramsfile

    def read(loader):
        try:
            return loader(path)
        except Exception:  # noqa: BLE001 - a refusal of either loader, whatever its type, is a difference
            return None

    ours, theirs = read(paramsfile.read_yaml), read(lambda p: load_configfile(str(p)))
    alike = ours is not None and theirs is not None and _same(ours, theirs)
    assert (path.stem in LOADERS_DIFFER) == (not alike), (ours, theirs)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """`snakemake -n` of every other bad file, each in its own folder, side by side: each one is a fresh
    interpreter (about 12 s of imports), so running them one at a time would cost minutes of CI."""
    from concurrent.futures import ThreadPoolExecutor

    def one(path: Path):
        workdir = tmp_path_factory.mktemp(path.stem)
        return path.stem, (workdir, dry_run(workdir, "--configfile", str(path)))

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, SNAKEMAKE_REST))


@pytest.mark.slow
@pytest.mark.parametrize("path", SNAKEMAKE_REST, ids=lambda p: p.stem)
def test_snakemake_refuses_every_bad_file(path, dry_runs):
    _check_refused(path, *dry_runs[path.stem])


def _shell_commands(output: str) -> list[list[str]]:
    """The shell commands of a `snakemake -n -p`, split as a POSIX shell splits them."""
    commands = []
    for line in output.splitlines():
        line = line.strip().removeprefix("Shell command:").strip().removeprefix("exec ")
        # rules call `<this Python> -m fedrepro` (common.smk's FEDREPRO): read it as `fedrepro`
        line = re.sub(r"^(\(?)(?:'[^']*'|\S+) -m fedrepro ", r"\1fedrepro ", line)
        if line.startswith(("fedrepro ", "(fedrepro ", "if [ ")):
            commands.append(shlex.split(line))
    return commands


def test_a_data_root_with_a_command_and_a_space_is_one_argument(tmp_path):
    root = "my data/$(touch pwned)x"
    params = tmp_path / "p.yaml"
    params.write_text(f"data: {{root: '{root}'}}\n" + GOOD)
    proc = dry_run(tmp_path, "--configfile", str(params))
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = _shell_commands(proc.stdout + proc.stderr)
    assert {c[1] for c in commands} >= {"partition", "train"}
    for words in commands:
        if "--data-root" in words:
            assert words[words.index("--data-root") + 1] == f"{root}/fmnist", words


@pytest.mark.parametrize("name", ["x$(touch y)", "with space"])
def test_a_hostile_params_file_name_is_refused(name, tmp_path):
    params = tmp_path / f"{name}.yaml"
    params.write_text(GOOD)
    proc = dry_run(tmp_path, "--configfile", str(params))
    assert proc.returncode != 0
    assert "params file name" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
    assert not (tmp_path / "y").exists()


def test_every_value_reaching_a_shell_is_quoted():
    """Every placeholder of a shell command in the rules is quoted (``:q``), except numbers."""
    import re

    # TRACK_LIVE is an argument list that train.smk builds with shlex.join (quoted where it is made)
    # FEDREPRO is this Python's path and `-m fedrepro`, the path quoted with shlex.quote in common.smk
    # params.forks: shlex.join of WorkflowForks.train_args; wildcards.round is constrained to digits, params.history
    # an int
    # params.experiments: a manifest slice's experiment names, shlex.join-ed in report.smk; params.source: a
    # tracking job's --record or --manifest, its value shlex.quote-d in common.smk's track_source
    unquoted_ok = {
        "threads",
        "params.rounds",
        "params.repeats",
        "params.enabled",
        "TRACK_LIVE",
        "FEDREPRO",
        "params.forks",
        "params.history",
        "wildcards.round",
        "params.experiments",
        "params.source",
    }
    assert "--record {shlex.quote(" in (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert "--manifest {shlex.quote(" in (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert "experiments=lambda w: shlex.join(" in (ROOT / "workflow" / "rules" / "report.smk").read_text()
    assert "shlex.join(" in (ROOT / "workflow" / "rules" / "train.smk").read_text()
    assert (
        "forks=lambda w, input: shlex.join(FORKS.train_args(" in (ROOT / "workflow" / "rules" / "train.smk").read_text()
    )
    assert 'FEDREPRO = shlex.quote(sys.executable) + " -m fedrepro"' in (ROOT / "workflow/rules/common.smk").read_text()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.findall(r"shell:\n((?:\s+\".*\"\n?)+)", text):
            for field in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", block):
                assert field.endswith(":q") or field in unquoted_ok, (smk.name, field)


# ------------------------------------------------------------------ runs: checkpoints, partitions, divergence

import json  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from conftest import make_partition, train_args  # noqa: E402
from fedrepro.run import checkpoint  # noqa: E402

RUN = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 4,
    "local_epochs": 1,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
}


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


def _train(setting, out, partition_dir, data_root, *extra):
    cli.main(train_args(setting, out, partition_dir, data_root, *extra))
    return json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None


def _flip_a_bit_in_a_tensor(path: Path) -> None:
    """Flip one bit inside the stored model vector, leaving torch's zip structure intact."""
    raw = bytearray(path.read_bytes())
    x = checkpoint.load(path)["x"]
    needle = x[:4].numpy().tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at + 1] ^= 0x10
    path.write_bytes(bytes(raw))


def test_a_checkpoint_with_a_flipped_bit_is_refused_named_and_set_aside(
    tmp_path, partition_dir, tiny_data_root, capsys
):
    out = tmp_path / "run"
    ref = _train(RUN, tmp_path / "ref", partition_dir, tiny_data_root)
    _train(RUN, out, partition_dir, tiny_data_root, "--stop-after", "2")
    _flip_a_bit_in_a_tensor(out / "checkpoint.pt")
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint.pt"):
        checkpoint.load(out / "checkpoint.pt")
    summary = _train(RUN, out, partition_dir, tiny_data_root)
    assert summary["resumed"] is False and summary["status"] == "finished"
    assert summary["final_acc"] == ref["final_acc"], "started over: the same numbers as an uninterrupted run"
    assert len(list(out.glob("checkpoint.pt.corrupt-*"))) == 1
    assert "checkpoint.pt" in capsys.readouterr().err


def test_a_truncated_checkpoint_does_not_block_the_rerun(tmp_path, partition_dir, tiny_data_root):
    out = tmp_path / "run"
    ref = _train(RUN, tmp_path / "ref", partition_dir, tiny_data_root)
    _train(RUN, out, partition_dir, tiny_data_root, "--stop-after", "2")
    raw = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(raw[: len(raw) // 2])
    summary = _train(RUN, out, partition_dir, tiny_data_root)
    assert summary["status"] == "finished" and summary["rounds_done"] == 4
    # starting over is an uninterrupted run from round 0: the same model bit for bit, the same scores
    assert torch.equal(checkpoint.load(out / "model.pt")["x"], checkpoint.load(tmp_path / "ref" / "model.pt")["x"])
    assert summary["final_acc"] == ref["final_acc"]


def test_a_plain_truncated_torch_file_is_named(tmp_path):
    path = tmp_path / "model.pt"
    checkpoint.save({"x": torch.arange(1000.0)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(checkpoint.CheckpointError, match=str(path)):
        checkpoint.load(path)


class _RunsCodeWhenUnpickled:
    """An object whose unpickling calls open(marker, "w"): any code could run there instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_checkpoint_with_a_pickled_object_is_refused_by_weights_only(tmp_path):
    """A checkpoint whose digest is right (written by someone, not damaged) but which holds a pickled
    object: torch.load(weights_only=True) refuses to build it, so its code never runs, and the error
    names the file."""
    marker = tmp_path / "code-ran"
    path = tmp_path / "checkpoint.pt"
    checkpoint.save({"x": torch.zeros(3), "payload": _RunsCodeWhenUnpickled(marker)}, path, digest=True)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load(path)
    assert str(err.value).startswith(f"{path}: not a readable checkpoint (UnpicklingError: Weights only load failed")
    assert not marker.exists(), "unpickling ran the object's code"
    checkpoint.save({"x": torch.zeros(3)}, path, digest=True)  # the same file without the object loads
    assert torch.equal(checkpoint.load(path)["x"], torch.zeros(3))


def test_partial_checkpoint_writes_are_removed_on_the_next_start(tmp_path, partition_dir, tiny_data_root):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".checkpoint.pt.abc123.part").write_bytes(b"half a checkpoint")
    (out / ".model.pt.def456.part").write_bytes(b"half a model")
    _train(RUN, out, partition_dir, tiny_data_root)
    assert not list(out.glob(".*.part"))


def test_a_run_refuses_a_partition_that_is_not_the_one_it_names(tmp_path, partition_dir, tiny_data_root, capsys):
    from fedrepro.partitions.base import PartitionError

    other = make_partition(tiny_data_root, tmp_path / "other", num_clients=4, kind="iid", seed=2)
    with pytest.raises(SystemExit) as exit_:  # the command's one line, status 2
        _train(RUN, tmp_path / "run", other, tiny_data_root)
    assert exit_.value.code == 2 and f"fedrepro train: {other / 'partition.json'} describes" in capsys.readouterr().err
    with pytest.raises(PartitionError, match="partition.json"):  # --debug: the exception itself
        _train(RUN, tmp_path / "run", other, tiny_data_root, "--debug")
    # same setting, altered indices: partition.json's content hash no longer matches
    altered = make_partition(tiny_data_root, tmp_path / "altered", num_clients=4)
    with np.load(altered / "clients.npz") as data:
        parts = {k: data[k] for k in data.files}
    parts["client_0"], parts["client_1"] = parts["client_1"], parts["client_0"]
    np.savez_compressed(altered / "clients.npz", **parts)
    with pytest.raises(PartitionError, match="content hash"):
        _train(RUN, tmp_path / "run2", altered, tiny_data_root, "--debug")


def test_a_corrupt_partition_file_is_named(tmp_path, tiny_data_root):
    from fedrepro.partitions import records as partition_records
    from fedrepro.partitions.base import PartitionError

    folder = make_partition(tiny_data_root, tmp_path / "p", num_clients=4)
    raw = (folder / "clients.npz").read_bytes()
    (folder / "clients.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(PartitionError, match="clients.npz"):
        partition_records.load(folder)


def test_a_blow_up_in_the_last_round_is_diverged_not_finished(tmp_path, partition_dir, tiny_data_root):
    """Server lr 1e30: the local training loss of the last round is finite (it trains from the previous
    model), but the model after the server step is not."""
    setting = {**RUN, "rounds": 1, "server": {"lr": 1.0e30}}
    summary = _train(setting, tmp_path / "run", partition_dir, tiny_data_root)
    rows = json.loads(json.dumps(summary))
    assert math.isfinite(float(__import__("pandas").read_csv(tmp_path / "run" / "metrics.csv")["train_loss"].iloc[-1]))
    assert rows["status"] == "diverged"
    assert math.isnan(rows["final_acc"])


def test_the_divergence_rule_reads_every_quantity():
    from fedrepro.run.rows import diverged

    fine = {
        "train_loss": 1.0,
        "step_norm": 1.0,
        "global_norm": 1.0,
        "test_acc": float("nan"),
        "test_loss": float("nan"),
        "pseudo_grad_norm": float("nan"),
    }
    x = torch.ones(3)
    assert not diverged(fine, x), "NaN test metrics of a round without evaluation are not divergence"
    assert diverged({**fine, "step_norm": float("inf")}, x)
    assert diverged({**fine, "test_acc": 0.1, "test_loss": float("nan")}, x)
    assert diverged({**fine, "fedlaw_gamma": float("-inf")}, x)
    assert diverged(fine, torch.tensor([1.0, float("nan"), 0.0]))


# ------------------------------------------------------------------ data: size limit, loaded bytes

from conftest import FMNIST_FILES  # noqa: E402
from fedrepro import data  # noqa: E402
from fedrepro.data import base, fmnist  # noqa: E402


def test_a_download_stops_at_the_expected_size(tmp_path, serve, fmnist_mirror):
    """A mirror serving a much larger file: no more than the file's size is ever written."""
    big = tmp_path / "big"
    big.mkdir()
    for name in FMNIST_FILES:
        (big / name).write_bytes((fmnist_mirror / name).read_bytes() + b"\0" * (8 << 20))
    written = []
    real_fetch = base._fetch

    def spy(mirror, filename, dest, timeout, max_bytes=base.DEFAULT_MAX_BYTES):
        try:
            real_fetch(mirror, filename, dest, timeout, max_bytes)
        finally:
            written.append(dest.stat().st_size if dest.exists() else 0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base, "_fetch", spy)
        with pytest.raises(data.DownloadError, match="stopped there"):
            data.download("fmnist", tmp_path / "root", [serve(big)])
    assert written and max(written) <= max(fmnist.FMNIST_BYTES.values())


def test_overwritten_labels_after_download_are_found_before_training(tmp_path, fmnist_mirror):
    root = tmp_path / "root"
    folder = data.download("fmnist", root, [str(fmnist_mirror)])
    data.load("fmnist", root, train=True)  # fine as downloaded
    labels = folder / "train-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[8:30] = bytes(22)  # overwrite labels in place
    labels.write_bytes(bytes(raw))
    with pytest.raises(data.DataError, match="train-labels-idx1-ubyte"):
        data.load("fmnist", root, train=True)
    data.download("fmnist", root, [str(fmnist_mirror)])  # the download decompresses it anew
    base.verify_loaded(folder)


# ------------------------------------------------------------------ corrupt results are named, and stop nothing else

from conftest import fabricate  # noqa: E402


def _two_params_files(tmp_path):
    from fedrepro.configure import expansion, paramsfile

    files, runs = [], {}
    for name, seed in (("one", 1), ("two", 2)):
        path = tmp_path / "params" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            f"experiments:\n  e_{name}: {{base: {{num_clients: 4, rounds: 12}}, grid: {{seed: [{seed}]}}}}\n"
        )
        files.append(path)
        runs[name] = expansion.expand(paramsfile.load_params(path))[0]
    return files, runs


def test_a_truncated_summary_is_named_and_stops_no_other_params_file(tmp_path):
    from fedrepro.report import index

    files, runs = _two_params_files(tmp_path)
    runs_dir = tmp_path / "runs"
    for run in runs.values():
        fabricate(run, runs_dir, 0.7)
    bad = runs_dir / runs["one"].id / "summary.json"
    bad.write_text(bad.read_text()[:40])
    out = index.build(tmp_path / "reports" / "index.html", files, runs_dir)
    one, two = (index.survey(p, runs_dir, tmp_path / "reports") for p in files)
    assert str(bad) in one["error"]
    assert "error" not in two and two["done"] == 1
    assert str(bad) in out.read_text()


def test_a_truncated_summary_is_named_by_the_report(tmp_path):
    from fedrepro import records
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.report import frames

    files, runs = _two_params_files(tmp_path)
    runs_dir = tmp_path / "runs"
    fabricate(runs["one"], runs_dir, 0.7)
    bad = runs_dir / runs["one"].id / "summary.json"
    bad.write_text('{"run": ')
    params = paramsfile.load_params(files[0])
    manifest = expansion.manifest(params, expansion.expand(params), "one")
    with pytest.raises(records.CorruptFileError, match=str(bad)):
        frames.load_runs(manifest, runs_dir)


def test_paper_numbers_skip_a_truncated_summary(tmp_path, capsys):
    from fedrepro.report import paper

    _, runs = _two_params_files(tmp_path)
    runs_dir = tmp_path / "runs"
    for run in runs.values():
        fabricate(run, runs_dir, 0.7)
    bad = runs_dir / runs["one"].id / "summary.json"
    bad.write_text("{")
    assert [r["id"] for r in paper.load_runs(runs_dir)] == [runs["two"].id]
    assert str(bad) in capsys.readouterr().err


# ------------------------------------------------------------------ every fault recovers in one rerun

import fcntl  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import yaml  # noqa: E402


def test_the_local_profile_reruns_incomplete_jobs():
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    assert profile.get("rerun-incomplete") is True and profile.get("keep-going") is True


def _project_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    for name in ("Snakefile", "Makefile"):
        shutil.copy(ROOT / name, copy / name if copy.exists() else (copy.mkdir() or copy / name))
    for name in ("workflow", "src", "params"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "p.yaml").write_text(GOOD)
    return copy


def _stale_lock(project: Path) -> Path:
    """What a kill -9 of Snakemake leaves: its lock files, with no process behind them."""
    locks = project / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("reports/p.html\nresults/metrics/p.json\n")
    return locks


def _make_run(project: Path) -> subprocess.CompletedProcess:
    env = subprocess_env(PYTHONPATH=str(project / "src"))
    return subprocess.run(
        ["make", "-C", str(project), "--no-print-directory", "recover-run", "CONFIG=p.yaml", "SNAKEMAKE_ARGS=-n"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_make_run_removes_a_stale_lock(tmp_path):
    project = _project_copy(tmp_path)
    locks = _stale_lock(project)
    proc = _make_run(project)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "stale Snakemake lock" in proc.stdout
    assert not list(locks.iterdir())


@pytest.mark.slow
def test_make_run_leaves_the_lock_of_a_running_make_run(tmp_path):
    project = _project_copy(tmp_path)
    locks = _stale_lock(project)
    with open(project / ".snakemake" / "make-run.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another `make run` is working here
        proc = _make_run(project)
    assert proc.returncode != 0
    assert "another 'make run' is working" in proc.stderr
    assert list(locks.iterdir()), "a live run's lock is kept"


@pytest.mark.slow
def test_training_stops_with_a_checkpoint_when_its_parent_is_killed(tmp_path, partition_dir, tiny_data_root):
    """kill -9 of Snakemake (here: the process that started `fedrepro train`) stops the training job."""
    out = tmp_path / "run"
    setting = {**RUN, "rounds": 100000, "eval_every": 1000}
    child_log = tmp_path / "child.log"
    script = (
        f"import subprocess, sys\n"
        f"log = open({str(child_log)!r}, 'w')\n"
        f"p = subprocess.Popen(['fedrepro', 'train', '--setting', {json.dumps(setting)!r}, '--partition', "
        f"{str(partition_dir)!r}, '--data-root', {str(tiny_data_root)!r}, '--out', {str(out)!r}, "
        f"'--no-progress', '--threads', '1', '--checkpoint-every', '5'], stdout=log, stderr=log)\n"
        f"print(p.pid, flush=True)\n"
        f"p.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=subprocess_env())
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.pt").exists():
            assert time.monotonic() < deadline, child_log.read_text()[-2000:]
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while _alive(child):
            assert time.monotonic() < deadline, "the training job outlived its parent"
            time.sleep(0.1)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
    assert "SIGTERM" in child_log.read_text()
    assert checkpoint.load(out / "checkpoint.pt")["next_round"] > 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped: its parent is gone and init reaps it soon) is not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


KILLED_GRID = """title: killed grid
data:
  root: data
  mirrors:
    fmnist: [/usr/share/datasets/fashion-mnist/]
experiments:
  k:
    base: {dataset: fmnist, model: mlp, num_clients: 40, participation: 0.05, rounds: 14, batch_size: 256,
           device: cpu, partition: {kind: iid, seed: 1}}
    grid: {seed: [1, 2]}
"""


def _processes(wanted) -> list[str]:
    """The /proc entries of the processes for which ``wanted(folder)`` holds (vanishing ones skipped)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and wanted(proc):
                found.append(proc.name)
        except OSError:
            continue
    return found


def _trainers_in(project: Path) -> list[str]:
    """Live `fedrepro train` processes working in ``project``."""

    def trainer(proc: Path) -> bool:
        words = (proc / "cmdline").read_bytes().split(b"\0")
        return (
            b"train" in words
            and any(w.endswith(b"fedrepro") for w in words)
            and Path(os.readlink(proc / "cwd")) == project
            and _alive(int(proc.name))
        )

    return _processes(trainer)


def _holders(project: Path) -> list[str]:
    """The processes holding `make run`'s flock file open (for the failure message)."""
    flock, named = str(project / ".snakemake" / "make-run.flock"), {}

    def holds(proc: Path) -> bool:
        named[proc.name] = (proc / "cmdline").read_bytes()[:200]
        return any(os.readlink(fd) == flock for fd in (proc / "fd").iterdir())

    return [f"{pid} {named[pid]!r}" for pid in _processes(holds)]


@pytest.mark.slow
def test_one_make_run_after_a_kill_9_of_the_whole_run_finishes_the_grid(tmp_path, fmnist_data):
    """kill -9 of `make run` with Snakemake and its jobs mid-training; then one `make run` (no --unlock,
    no --rerun-incomplete by hand) finishes every run, resuming the killed ones from their checkpoints."""
    project = _project_copy(tmp_path)
    (project / "k.yaml").write_text(fmnist_data.params_text(KILLED_GRID))
    env = subprocess_env(f"sqlite:///{project / 'mlflow.db'}", fmnist=fmnist_data, PYTHONPATH=str(project / "src"))
    make = ["make", "-C", str(project), "--no-print-directory", "recover-run", "CONFIG=k.yaml"]
    first = subprocess.Popen(
        make, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while not list((project / "results" / "runs").glob("*/checkpoint.pt")):
            assert first.poll() is None, "the first make run ended before any checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # make, Snakemake and every job it started
        first.wait()
    deadline = time.monotonic() + 60
    while _trainers_in(project):
        assert time.monotonic() < deadline, "training jobs outlived the killed Snakemake"
        time.sleep(0.2)
    assert list((project / ".snakemake" / "locks").iterdir()), "the kill left Snakemake's lock behind"
    second = subprocess.run(make, capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:] + str(_holders(project))
    assert "stale Snakemake lock" in second.stdout
    summaries = [json.loads(p.read_text()) for p in (project / "results" / "runs").glob("*/summary.json")]
    assert len(summaries) == 2 and all(s["status"] == "finished" and s["rounds_done"] == 14 for s in summaries)
    logs = "".join(p.read_text() for p in (project / "logs" / "train").glob("*.log"))
    assert "resumed at round 10" in logs, logs[-2000:]
    assert (project / "reports" / "k.html").exists() and (project / "reports" / "index.html").exists()
    locks = project / ".snakemake" / "locks"
    assert not (locks.exists() and list(locks.iterdir())), "the finished run released Snakemake's lock"


ENDLESS_RUN = """title: endless run
data:
  root: data
  mirrors:
    fmnist: [/usr/share/datasets/fashion-mnist/]
experiments:
  endless:
    base: {dataset: fmnist, model: mlp, num_clients: 40, participation: 0.05, rounds: 100000, eval_every: 1000,
           batch_size: 256, device: cpu, partition: {kind: iid, seed: 1}}
    grid: {seed: [1]}
"""


@pytest.mark.slow
@pytest.mark.parametrize("shell_exec", [True, False], ids=["exec", "without-exec"])
def test_killing_snakemake_alone_makes_its_training_job_checkpoint_and_stop(shell_exec, tmp_path, fmnist_data):
    """SIGKILL to the Snakemake process only (not its process group, as a crash or an OOM kill would
    do): the train rule's `exec` makes `fedrepro train` Snakemake's own child, so the parent-death signal
    reaches it, and it saves a checkpoint at the end of its round and exits. Without `exec` its parent is
    the job's shell, which outlives Snakemake, and the job trains on: the second case shows the first
    depends on that word."""
    from conftest import BIN

    project = _project_copy(tmp_path)
    (project / "k.yaml").write_text(fmnist_data.params_text(ENDLESS_RUN))
    rule = project / "workflow" / "rules" / "train.smk"
    if not shell_exec:
        text = rule.read_text()
        assert '"exec {FEDREPRO} train' in text
        rule.write_text(text.replace('"exec {FEDREPRO} train', '"{FEDREPRO} train'))
    env = subprocess_env(f"sqlite:///{project / 'mlflow.db'}", fmnist=fmnist_data, PYTHONPATH=str(project / "src"))
    cmd = [
        str(BIN / "snakemake"),
        "--snakefile",
        str(project / "Snakefile"),
        "--directory",
        str(project),
        "--configfile",
        str(project / "k.yaml"),
        "--workflow-profile",
        str(project / "workflow/profiles/ci"),
        "--cores",
        "1",
    ]
    snakemake = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    logs = project / "logs" / "train"
    try:
        deadline = time.monotonic() + 300
        # the job is in its round loop once its first periodic checkpoint (round 10) is written; a SIGTERM
        # before that (loading data) ends it at once, with nothing to save
        while not list((project / "results" / "runs").glob("*/checkpoint.pt")):
            assert snakemake.poll() is None, "Snakemake ended before its training job trained"
            assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
            time.sleep(0.2)
        trainers = _trainers_in(project)
        assert len(trainers) == 1
        os.kill(snakemake.pid, signal.SIGKILL)  # Snakemake alone: its jobs stay in the process group
        snakemake.wait()
        (log,) = logs.glob("*.log")
        if shell_exec:
            deadline = time.monotonic() + 60
            while _trainers_in(project):
                assert time.monotonic() < deadline, "the training job outlived Snakemake"
                time.sleep(0.2)
            stopped = [line for line in log.read_text().splitlines() if "checkpoint saved" in line]
            assert stopped and "SIGTERM after round" in stopped[-1], log.read_text()[-2000:]
            done = int(stopped[-1].split("SIGTERM after round ")[1].split(";")[0])
            (ckpt,) = (project / "results" / "runs").glob("*/checkpoint.pt")
            assert done >= 10 and checkpoint.load(ckpt)["next_round"] == done
        else:
            time.sleep(15)  # the exec case stops within a round; here the job is still training
            assert _trainers_in(project) == trainers, "without exec the job should have outlived Snakemake"
            assert "SIGTERM" not in log.read_text()
    finally:
        for pid in _trainers_in(project):
            os.kill(int(pid), signal.SIGKILL)
        if snakemake.poll() is None:
            snakemake.kill()
            snakemake.wait()


def test_every_rule_calls_the_environments_fedrepro():
    """A rule's command starts with {FEDREPRO} (this Python's ``-m fedrepro``), never a bare ``fedrepro`` that
    PATH may not hold (`.venv/bin/snakemake` without an activated environment, a Slurm job's shell)."""
    import re

    bare = re.compile(r"(?:^|[;&|(]\s*|\bthen\s+|\bexec\s+)fedrepro\b")
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")) + [ROOT / "Snakefile"]:
        for block in re.findall(r"shell:\n((?:\s+\".*\"\n?)+)", smk.read_text()):
            for literal in re.findall(r"\"(.*)\"", block):
                assert not bare.search(literal), f"{smk.name}: bare fedrepro in {literal!r}"
