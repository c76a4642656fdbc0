"""Every ``fedrepro`` command's arguments are checked like a params value: an output path that cannot be
written (a folder where a file goes, inside /proc, below a file), an input that is not a regular file (a
device, a folder) or not there, a name against the project's naming rule. Each ends in one line on stderr
naming the argument, exit status 2, no traceback and nothing written."""

import os

import pytest

from fedrepro import cli

SETTING = '{"dataset": "fmnist", "kind": "iid", "num_clients": 2}'


def _cases(folder: str) -> list[tuple[list[str], str]]:
    """(argv, the argument the refusal must name); ``folder`` is an existing folder, where files go."""
    params = "params/default.yaml"
    return [
        (["download", "--root", "/proc/fmnist"], "--root"),
        (["download", "--out", folder], "--out"),
        (["partition", "--setting", SETTING, "--data-root", "/dev/null", "--out", "p"], "--data-root"),
        (["partition", "--setting", SETTING, "--data-root", folder, "--out", "/proc/p"], "--out"),
        (["train", "--setting", "{}", "--partition", folder, "--data-root", folder, "--out", "/proc/r"], "--out"),
        (
            [
                "train",
                "--setting",
                "{}",
                "--partition",
                folder,
                "--data-root",
                folder,
                "--out",
                f"{folder}/r",
                "--fork-from",
                "/dev/zero",
            ],
            "--fork-from",
        ),
        (["train-pack", "--members", "[{}]", "--report", "/proc/pack.json"], "--report"),
        (["train-pack", "--members", "[{}]", "--done-dir", "/proc/done"], "--done-dir"),
        (["take-packed", "--setting", "{}", "--staged", "/dev/null", "--out", "r"], "--staged"),
        (["take-packed", "--setting", "{}", "--staged", folder, "--out", "/proc/r"], "--out"),
        (
            [
                "fork",
                "--setting",
                "{}",
                "--run-dir",
                "/dev/null",
                "--round",
                "1",
                "--partition",
                folder,
                "--data-root",
                folder,
                "--out",
                "f.pt",
            ],
            "--run-dir",
        ),
        (
            [
                "fork",
                "--setting",
                "{}",
                "--run-dir",
                folder,
                "--round",
                "1",
                "--partition",
                folder,
                "--data-root",
                folder,
                "--out",
                folder,
            ],
            "--out",
        ),
        (["expand", "--configfile", "/dev/null"], "--configfile"),
        (["expand", "--configfile", folder], "--configfile"),
        (["plan", "--configfile", "/dev/zero"], "--configfile"),
        (["plan", "--configfile", params, "--walltime", "0"], "--walltime"),
        (["plan", "--configfile", params, "--bench", folder], "--bench"),
        (["track", "--manifest", "/dev/null"], "--manifest"),
        (["track", "--configfile", params, "--out", "/proc/t.json"], "--out"),
        (["manifest", "--configfile", "/dev/zero"], "--configfile"),
        (["manifest", "--configfile", params, "--out", folder], "--out"),
        (["tune", "select", "--manifest", "/dev/null", "--tuning", "t", "--out", "c.json"], "--manifest"),
        (["tune", "select", "--manifest", params, "--tuning", "a b", "--out", "c.json"], "--tuning"),
        (["tune", "manifest", "--manifest", params, "--out", "/proc/m.json"], "--out"),
        (["tune", "final", "--manifest", params, "--out", folder], "--out"),
        (["report", "--configfile", params, "--out", "/proc/nope.html"], "--out"),
        (["report", "--configfile", params, "--out", folder], "--out"),
        (["report", "--configfile", params, "--out", f"{params}/r.html"], "--out"),
        (["report", "--manifest", params, "--out", "r.html", "--figures", "/proc/figs"], "--figures"),
        (["tables", "--configfile", "/dev/zero"], "--configfile"),
        (["tables", "--configfile", params, "--runs-dir", "/dev/null"], "--runs-dir"),
        (["figures", "--name", "a b", "--spec", "{}", "--out", "f.png"], "--name"),
        (["figures", "--name", "f", "--spec", "{}", "--out", "/proc/f.png"], "--out"),
        (["index", "--out", "/proc/index.html"], "--out"),
        (["index", "--params", "/dev/zero"], "--params"),
        (["collect", "--manifest", "/dev/null", "--metrics", "m", "--curves", "c"], "--manifest"),
        (["collect", "--manifest", params, "--metrics", "/proc/m", "--curves", "c"], "--metrics"),
        (["bench", "--out", "/proc/b.json"], "--out"),
        (["bench", "--html", folder], "--html"),
        (["check-gpu", "--out", "/proc/g.json"], "--out"),
        (["check-gpu", "--rounds", "0"], "--rounds"),
        (["check-gpu", "--packed-out", "/proc/p.json"], "--packed-out"),
        (["check-gpu", "--packed-budget", "0"], "--packed-budget"),
        (["check-gpu", "--skip", "checks"], "--skip"),
        (["bench-table", "--seconds", "0"], "--seconds"),
        (["bench-table", "--set", "precision"], "--set"),
        (["bench-table", "--out", "/proc/t.json"], "--out"),
        (["evidence", "keep", "--configfile", params, "--name", "a b"], "--name"),
        (["evidence", "keep", "--configfile", params, "--name", "k", "--root", "/proc/e"], "--root"),
        (["evidence", "matrix", "--root", "/dev/null"], "--root"),
        (["evidence", "report", folder, "--out", "/proc/e.html"], "--out"),
        (["evidence", "compare", "/dev/null", "--configfile", params], "folder"),
        (["evidence", "collapses", "/dev/zero"], "folder"),
    ]


def _commands(parser) -> set[str]:
    """Every command's name, actions of a group included ("evidence keep")."""
    import argparse

    names = set()

    def walk(p, prefix):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
                return
        names.add(prefix)

    walk(parser, "")
    return names


def test_every_command_has_a_bad_argument_case(tmp_path):
    covered = {
        " ".join(a for a in argv[:2] if not a.startswith("-") and a not in ("/dev/null", "/dev/zero"))
        for argv, _ in _cases(str(tmp_path))
    }
    covered = {c if c in _commands(cli.build_parser()) else c.split()[0] for c in covered}
    assert _commands(cli.build_parser()) <= covered, "a command without a bad-argument case here"


@pytest.mark.parametrize("case", range(len(_cases("."))))
def test_a_bad_argument_is_one_line_naming_it(case, capsys, tmp_path, monkeypatch):
    project = os.getcwd()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    inside = tmp_path / "folder"
    inside.mkdir()
    argv, argument = _cases(str(inside))[case]
    argv = [os.path.join(project, a) if a.startswith("params/") else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert argument in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["folder"], "something was written"


def test_what_is_allowed_is_said(capsys, tmp_path):
    """The issue's cases: the kind of file found and the kind wanted, the pseudo file system, the rule."""
    for argv, words in [
        (["plan", "--configfile", "/dev/zero"], "/dev/zero is a character device; a regular file is expected"),
        (["expand", "--configfile", str(tmp_path)], "is a folder; a regular file is expected"),
        (
            ["report", "--configfile", "params/default.yaml", "--out", "/proc/nope.html"],
            "/proc/nope.html lies inside /proc, a pseudo file system",
        ),
        (
            ["evidence", "keep", "--configfile", "params/default.yaml", "--name", "a b"],
            "'a b' is not allowed: use letters, digits and _ . + - only",
        ),
    ]:
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert words in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_unreadable_input_and_unwritable_output_are_refused(capsys, tmp_path):
    locked = tmp_path / "locked.yaml"
    locked.write_text("experiments: {}\n")
    locked.chmod(0)
    shut = tmp_path / "shut"
    shut.mkdir(mode=0o500)
    for argv, words in [
        (["expand", "--configfile", str(locked)], "cannot be read"),
        (["index", "--out", str(shut / "index.html")], "cannot write in"),
    ]:
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert words in capsys.readouterr().err


def test_a_manifest_not_written_yet_leaves_training_alone(tmp_path):
    """The workflow passes every train job the params file's manifest for live tracking; a run asked for by its
    own summary (snakemake <run>/summary.json) starts before that manifest exists, and must train, ungrouped."""
    from fedrepro.cli import build_parser
    from fedrepro.cli.run import _absent_or  # the type --mlflow-manifest takes

    parser = build_parser()
    missing = tmp_path / "manifests" / "not-yet.json"
    args = parser.parse_args(
        [
            "train",
            "--setting",
            "{}",
            "--partition",
            str(tmp_path),
            "--data-root",
            str(tmp_path),
            "--out",
            str(tmp_path / "run"),
            "--mlflow-manifest",
            str(missing),
        ]
    )
    assert args.mlflow_manifest == str(missing)
    assert _absent_or("file")(str(missing)) == str(missing)
