"""Hostile input and faults (issue #15): every bad params file is refused before any job, naming its key;
names and paths from a params file never reach a shell unquoted or leave the project; corrupt files
are named; every fault recovers in one rerun.

tests/hostile_params/*.yaml each start with ``# expect: TEXT``: the error must contain TEXT (the key).
"""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, snakemake_cmd, subprocess_env
from fedrepro import cli

HOSTILE = Path(__file__).parent / "hostile_params"
BAD_FILES = sorted(HOSTILE.glob("*.yaml"))
GOOD = "experiments:\n  a: {base: {num_clients: 4, rounds: 2}, grid: {seed: [1]}}\n"


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first[len("# expect: "):]


def expand_error(capsys, *files) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["expand", "--configfile", *map(str, files)])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(workdir, "-n", "-p", *args), capture_output=True, text=True,
                          env=subprocess_env(), timeout=300)


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
    from fedrepro import config
    path = tmp_path / "p.yaml"
    path.write_text("base: &b {num_clients: 4, rounds: 2}\nexperiments:\n  a:\n    base:\n      <<: *b\n"
                    "      rounds: 3\n    grid: {seed: [1]}\n")
    assert config.read_yaml(path)["experiments"]["a"]["base"] == {"num_clients": 4, "rounds": 3}


# ------------------------------------------------------------------ snakemake -n: refused before any job

SNAKEMAKE_FAST = ["root_command", "experiment_traversal", "duplicate_key", "nonfinite_participation_nan",
                  "python_tuple"]


def _refused_by_snakemake(path: Path, tmp_path: Path):
    proc = dry_run(tmp_path, "--configfile", str(path))
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert expected(path) in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert not (tmp_path / "pwned").exists() and not (tmp_path.parent / "pwned").exists()


@pytest.mark.parametrize("name", SNAKEMAKE_FAST)
def test_snakemake_refuses(name, tmp_path):
    _refused_by_snakemake(HOSTILE / f"{name}.yaml", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in BAD_FILES if p.stem not in SNAKEMAKE_FAST], ids=lambda p: p.stem)
def test_snakemake_refuses_every_bad_file(path, tmp_path):
    _refused_by_snakemake(path, tmp_path)


def _shell_commands(output: str) -> list[list[str]]:
    """The shell commands of a `snakemake -n -p`, split as a POSIX shell splits them."""
    commands = []
    for line in output.splitlines():
        line = line.strip().removeprefix("Shell command:").strip()
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
    unquoted_ok = {"threads", "params.rounds", "params.repeats", "params.enabled"}
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.findall(r"shell:\n((?:\s+\".*\"\n?)+)", text):
            for field in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", block):
                assert field.endswith(":q") or field in unquoted_ok, (smk.name, field)
