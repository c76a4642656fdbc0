"""The command line refuses bad arguments with a message naming the argument and what is allowed,
before any work starts; every sub-command's --help ends with an example; --version answers."""

import pytest

from fedrepro import __version__, cli


def fails(capsys, argv: list[str]) -> str:
    """Run ``fedrepro argv``; it must exit with status 2 (usage error); return what it printed."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2, f"fedrepro {' '.join(argv)} exited {exit_.value.code}"
    return capsys.readouterr().err


def test_unknown_dataset_is_a_usage_error_listing_the_datasets(capsys, tmp_path):
    err = fails(capsys, ["download", "--dataset", "cifar11", "--root", str(tmp_path)])
    assert "argument --dataset: invalid choice: 'cifar11'" in err
    assert all(name in err for name in ("fmnist", "cifar10", "cifar100", "agnews"))
    assert not list(tmp_path.iterdir()), "nothing is written before the arguments are checked"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["partition", "--setting", '{"kind": "iid"}', "--data-root", ".", "--out", "x"],
            "argument --setting: the partition setting needs dataset",
        ),
        (
            ["partition", "--setting", '{"dataset": "mnist", "kind": "iid"}', "--data-root", ".", "--out", "x"],
            "dataset 'mnist' is not one of agnews, cifar10",
        ),
        (
            ["train", "--setting", '{"rounds": 3,}', "--partition", ".", "--data-root", ".", "--out", "x"],
            "argument --setting: not valid JSON",
        ),
        (
            ["train", "--setting", "nowhere.json", "--partition", ".", "--data-root", ".", "--out", "x"],
            "'nowhere.json' is neither a JSON object nor an existing JSON file",
        ),
        (
            ["train", "--setting", "{}", "--partition", "no/such/partition", "--data-root", ".", "--out", "x"],
            "argument --partition: no such folder: no/such/partition",
        ),
        (
            ["train", "--setting", "{}", "--partition", ".", "--data-root", ".", "--out", "x", "--threads", "-1"],
            "argument --threads: -1 must be >= 0",
        ),
        (
            ["report", "--manifest", "no/such/manifest.json", "--out", "r.html"],
            "argument --manifest: no such file: no/such/manifest.json",
        ),
        (["expand", "--configfile", "params/nope.yaml"], "argument --configfile: no such file: params/nope.yaml"),
        (["bench", "--rounds", "0"], "argument --rounds: 0 must be >= 1"),
        (["download", "--timeout", "0"], "argument --timeout: 0.0 must be > 0"),
        (["download", "--timeout", "soon"], "argument --timeout: 'soon' is not a number"),
        (
            ["evidence", "keep", "--configfile", "params/default.yaml", "--name", "../x"],
            "argument --name: evidence folder name '../x' is not allowed: use letters, digits and _ . + - only",
        ),
        (["download", "--timeout", "inf"], "argument --timeout: 'inf' is not a finite number"),
        (
            ["evidence", "compare", "evidence", "--configfile", "params/default.yaml", "--tolerance", "-1"],
            "argument --tolerance: -1.0 must be >= 0",
        ),
        (
            ["evidence", "compare", "evidence", "--configfile", "params/default.yaml", "--tolerance", "nan"],
            "argument --tolerance: 'nan' is not a finite number",
        ),
    ],
)
def test_bad_arguments_name_the_argument_and_what_is_allowed(capsys, argv, message):
    assert message in fails(capsys, argv)


def test_evidence_report_of_a_folder_that_is_not_one(capsys, tmp_path):
    err = fails(capsys, ["evidence", "report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert f"{tmp_path} is not an evidence folder (no manifest.json)" in err


def test_every_sub_command_help_ends_with_an_example(capsys):
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"download", "partition", "train", "report", "evidence"} <= set(commands)
    for name, sub in commands.items():
        if name == "evidence":  # its actions carry the examples
            subs = sub._subparsers._group_actions[0].choices
            helps = {f"evidence {a}": p.format_help() for a, p in subs.items()}
        else:
            helps = {name: sub.format_help()}
        for command, text in helps.items():
            assert f"example:\n  fedrepro {command}" in text, f"`fedrepro {command} --help` has no example"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedrepro {__version__}"


# --------------------------------------------------------------------------- errors raised on purpose


def _error_classes():
    """Every exception class fedrepro defines (grep "class .*Error"), found in the source, not listed by hand."""
    import importlib
    import re
    from pathlib import Path

    src = Path(cli.__file__).parents[1]
    found = {}
    for path in sorted(src.rglob("*.py")):
        module = ".".join(("fedrepro", *path.relative_to(src).with_suffix("").parts)).removesuffix(".__init__")
        for name in re.findall(
            r"^class (\w+)\((?:[\w.]*(?:Error|Exception)[\w.]*,?\s*)+\):", path.read_text(), flags=re.MULTILINE
        ):
            found[name] = getattr(importlib.import_module(module), name)
    return found


def test_every_error_fedrepro_defines_is_one_it_raises_on_purpose():
    from fedrepro.errors import FedreproError

    classes = _error_classes()
    assert {
        "ConfigError",
        "EvidenceError",
        "PartitionError",
        "CheckpointError",
        "DataError",
        "CorruptFileError",
        "DownloadError",
        "FragmentError",
        "ConditionError",
        "MissingInput",
        "Preempted",
    } <= set(classes)
    assert [n for n, c in classes.items() if not issubclass(c, FedreproError)] == []
    assert issubclass(classes["ConfigError"], ValueError) and issubclass(classes["CheckpointError"], RuntimeError), (
        "the old bases stay, for the callers that catch them"
    )


@pytest.mark.parametrize("name", sorted(_error_classes()))
def test_each_error_ends_in_one_line_with_status_2(capsys, monkeypatch, name):
    """Once only ConfigError and EvidenceError did; PartitionError, CheckpointError, DataError and the rest
    ended in a traceback."""
    cls = _error_classes()[name]

    def raising(args):
        raise cls(f"results/x.json: what went wrong ({name}); what to do")

    monkeypatch.setattr(cli.reports, "cmd_index", raising)  # the module that adds the index command
    monkeypatch.delenv("FEDREPRO_DEBUG", raising=False)
    assert fails(capsys, ["index"]).splitlines() == [
        f"fedrepro index: results/x.json: what went wrong ({name}); what to do"
    ]
    for argv, env in ((["--debug", "index"], None), (["index", "--debug"], None), (["index"], "1")):
        if env:
            monkeypatch.setenv("FEDREPRO_DEBUG", env)
        with pytest.raises(cls):  # the traceback, for a bug report
            cli.main(argv)


def test_a_partition_that_cannot_be_made_ends_the_job_in_one_line(tmp_path, tiny_data_root):
    """Through the real command as the partition rule runs it (`> log 2>&1`): the log ends with the line."""
    import subprocess
    import sys

    from conftest import subprocess_env

    setting = (
        '{"dataset": "fmnist", "kind": "shards", "num_clients": 4, "classes_per_client": 11, "distinct": true, '
        '"seed": 1}'
    )
    log = tmp_path / "partition.log"
    with open(log, "w") as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedrepro",
                "partition",
                "--setting",
                setting,
                "--data-root",
                str(tiny_data_root),
                "--out",
                str(tmp_path / "p"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(FEDREPRO_DEBUG=""),
            timeout=120,
        )
    text = log.read_text()
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert text.strip().splitlines()[-1] == (
        "fedrepro partition: partition.classes_per_client = 11 exceeds the 10 classes; choose at most 10"
    )


def test_a_data_root_without_the_dataset_names_the_folder_and_the_download(capsys, tmp_path):
    """Once torchvision's 'Dataset not found' traceback."""
    setting = '{"dataset": "fmnist", "kind": "iid", "num_clients": 4, "seed": 1}'
    err = fails(capsys, ["partition", "--setting", setting, "--data-root", str(tmp_path), "--out", str(tmp_path / "p")])
    assert err.startswith(f"fedrepro partition: {tmp_path}: no fmnist files to read (") and "Traceback" not in err
    assert err.strip().endswith(
        f"run `fedrepro download --dataset fmnist --root {tmp_path}` (snakemake does, when "
        "the params file's data.root names this folder)"
    )
    assert len(err.strip().splitlines()) == 1
