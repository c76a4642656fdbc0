"""``fedrepro train`` and ``fedrepro fork``: one training run, and the state runs fork from."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _json_arg, _number, _output, finish


def add_parsers(sub) -> None:
    """train, train-pack, fork."""
    add_train(sub)
    add_train_pack(sub)
    add_take_packed(sub)
    add_fork(sub)


def _rounds(text: str) -> list[int]:
    try:
        rounds = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated round numbers, e.g. 150,200") from None
    if any(r < 1 for r in rounds):
        raise argparse.ArgumentTypeError(f"{text!r}: rounds must be >= 1")
    return rounds


def add_train(sub) -> None:
    """One federated training run."""
    p = sub.add_parser("train", help="run one federated training run")
    p.add_argument("--setting", required=True, type=_json_arg, help="run setting as JSON (or a JSON file)")
    p.add_argument("--partition", required=True, type=_existing("folder"), help="partition folder")
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder (after download)")
    p.add_argument("--out", required=True, type=_output("folder"), help="run folder")
    p.add_argument("--checkpoint-every", type=_number(int, 0), default=10, help="rounds between checkpoints (0: never)")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the setting's device")
    p.add_argument("--stop-after", type=_number(int, 1), help="checkpoint and stop after this many rounds (for tests)")
    p.add_argument("--no-progress", action="store_true", help="no per-round progress line")
    p.add_argument(
        "--keep-forks",
        type=_rounds,
        default=[],
        help="comma-separated rounds after which to keep this "
        "run's state for runs that fork from it (fork/kept-<round>.pt)",
    )
    p.add_argument(
        "--fork-history",
        type=_number(int, 0),
        default=0,
        help="last global models each kept state holds (the children's parts need them: IMA's window)",
    )
    p.add_argument(
        "--fork-from",
        type=_existing("file"),
        help="a parent run's fork state to start from (when this run has no checkpoint)",
    )
    p.add_argument("--mlflow-experiment", help="log the run live into this MLflow experiment (default: no tracking)")
    p.add_argument(
        "--mlflow-manifest",
        type=_absent_or("file"),
        help="the params file's manifest, when it is there yet (a run trained before it is written is tracked "
        "ungrouped): the run is nested under the parent run of the first experiment that holds it (not part of the "
        "run's identity)",
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.set_defaults(func=cmd_train)
    finish(p, EXAMPLES["train"])


def cmd_train(args) -> None:
    import torch

    from fedrepro.configure.settings import resolve
    from fedrepro.run.jobs import train
    from fedrepro.run.process import die_with_parent

    die_with_parent()  # killing Snakemake stops its training jobs too
    if args.threads:
        torch.set_num_threads(args.threads)
    setting = resolve(args.setting)
    _check_run_folder(setting, args.out)
    if args.device:
        setting["device"] = args.device
    if setting["device"] != "cpu":  # several GPUs here: this job takes its own (fedrepro.ops.slots)
        from fedrepro.ops import slots

        bound = slots.bind_gpu()
        if bound:
            print(bound, file=sys.stderr, flush=True)
    tracker = None
    if args.mlflow_experiment:
        from fedrepro.tracking import live

        tracker = live.live_run(
            args.out, args.tracking_uri, args.mlflow_experiment, args.mlflow_manifest, args.partition
        )
    from fedrepro.configure import forks

    summary = train(
        setting,
        args.out,
        args.partition,
        args.data_root,
        args.checkpoint_every,
        progress=not args.no_progress,
        stop_after=args.stop_after,
        tracker=tracker,
        keep_forks=args.keep_forks,
        history=args.fork_history,
        fork_from=args.fork_from,
        accepts=lambda parent, rounds: forks.shares_prefix(setting, parent, rounds),
    )
    print(json.dumps({k: summary.get(k) for k in ("run", "status", "final_acc", "best_acc", "runtime_s")}))


def add_train_pack(sub) -> None:
    """Several runs in one process, their clients trained as one computation (run/packed.py)."""
    p = sub.add_parser("train-pack", help="train several runs of one model architecture in one process as a pack")
    p.add_argument(
        "--members",
        required=True,
        type=_json_list,
        help="the runs as a JSON list (or a JSON file): each "
        "{setting, out, partition, data_root}; a run whose folder holds its summary is left alone",
    )
    p.add_argument("--checkpoint-every", type=_number(int, 0), default=10, help="rounds between checkpoints (0: never)")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--report", type=_output("file"), help="write each run's outcome here as JSON")
    p.add_argument(
        "--done-dir",
        type=_output("folder"),
        help="write <run>.json here for each run trained or found done (a failed run none)",
    )
    p.set_defaults(func=cmd_train_pack)
    finish(
        p,
        "fedrepro train-pack --members pack.json --done-dir results/packs/fmnist-mlp-cpu-0/done  "
        '(pack.json: [{"setting": {...}, "out": ..., "partition": ..., "data_root": ...}, ...])',
    )


def _json_list(text: str) -> list:
    """A non-empty JSON list given inline or as a file."""
    if not text.lstrip().startswith("["):
        if not Path(text).is_file():
            raise argparse.ArgumentTypeError(f"'{text}' is neither a JSON list nor an existing JSON file")
        text = Path(text).read_text()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err})") from None
    if not isinstance(value, list) or not value:
        raise argparse.ArgumentTypeError("must be a non-empty JSON list [...]")
    return value


def cmd_train_pack(args) -> None:
    import torch

    from fedrepro.configure import forks
    from fedrepro.configure.settings import resolve
    from fedrepro.errors import SetupError
    from fedrepro.run.jobs import train_pack
    from fedrepro.run.process import die_with_parent

    die_with_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    members = []
    for i, m in enumerate(args.members):
        missing = {"setting", "out", "partition", "data_root"} - set(m)
        if missing:
            raise SetupError(f"--members[{i}]: missing {', '.join(sorted(missing))}")
        setting = resolve(m["setting"])
        _check_run_folder(setting, m["out"])
        members.append(
            {
                **m,
                "setting": setting,
                "accepts": lambda parent, rounds, s=setting: forks.shares_prefix(s, parent, rounds),
            }
        )
    outcomes = train_pack(members, args.checkpoint_every)
    shown = [
        {k: o.get(k) for k in ("run", "status", "final_acc", "runtime_s")}
        if isinstance(o, dict)
        else {"status": "failed", "error": f"{type(o).__name__}: {o}"}
        for o in outcomes
    ]
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(shown, indent=1))
    print(json.dumps(shown))
    if args.done_dir:
        Path(args.done_dir).mkdir(parents=True, exist_ok=True)
        for m, s in zip(members, shown):
            if s["status"] != "failed":
                (Path(args.done_dir) / f"{Path(m['out']).name}.json").write_text(json.dumps(s))
    if any(s["status"] == "failed" for s in shown):
        sys.exit(1)


def add_take_packed(sub) -> None:
    """A run trained in a pack, moved from the pack's staging folder into its own run folder."""
    p = sub.add_parser("take-packed", help="move a run a pack trained into its own run folder")
    p.add_argument("--setting", required=True, type=_json_arg, help="the run's setting as JSON (or a JSON file)")
    p.add_argument("--staged", required=True, type=_existing("folder"), help="the folder the pack trained it in")
    p.add_argument("--out", required=True, type=_output("folder"), help="the run's folder")
    p.set_defaults(func=cmd_take_packed)
    finish(
        p,
        "fedrepro take-packed --setting setting.json --staged results/packs/<pack>/runs/<run> --out results/runs/<run>",
    )


def cmd_take_packed(args) -> None:
    import shutil

    from fedrepro.configure.settings import resolve
    from fedrepro.errors import SetupError
    from fedrepro.identity import stable_hash
    from fedrepro.records import read_json
    from fedrepro.run.rundir import RunDir

    setting, staged = resolve(args.setting), RunDir(Path(args.staged))
    if not staged.summary.exists() or read_json(staged.summary).get("setting_hash") != stable_hash(setting):
        raise SetupError(
            f"--staged {args.staged}: holds no finished run of this setting (its pack did not "
            f"finish it: see the pack's log)"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(staged.root.iterdir(), key=lambda p: p.name == staged.summary.name):  # the summary last
        shutil.move(str(item), str(out / item.name))
    staged.root.rmdir()
    print(json.dumps({"run": out.name, "from": str(staged.root)}))


RUN_FOLDER = re.compile(r".+-s-?\d+-[0-9a-f]{10}")


def _check_run_folder(setting: dict, out: str) -> None:
    """A run folder named by a run id holds the run of that id: a setting that now hashes to another id (the
    code changed since the grid was expanded) must not train into it."""
    from fedrepro.errors import SetupError
    from fedrepro.identity import run_id

    name = Path(out).name
    if RUN_FOLDER.fullmatch(name) and run_id(setting) != name:
        raise SetupError(
            f"--out {out}: the setting hashes to run id {run_id(setting)}, not to the folder's name; "
            f"the code or the setting changed since the grid was expanded: expand it again (snakemake -n)"
        )


def add_fork(sub) -> None:
    """The state of a run after some rounds."""
    p = sub.add_parser(
        "fork",
        help="the state of a run after some rounds, for the runs that fork from it "
        "(the one it kept while training, else its first rounds trained again)",
    )
    p.add_argument("--setting", required=True, type=_json_arg, help="the parent run's setting as JSON (or a JSON file)")
    p.add_argument("--run-dir", required=True, type=_absent_or("folder"), help="the parent run's folder")
    p.add_argument("--round", required=True, type=_number(int, 1), help="rounds the children share")
    p.add_argument("--history", type=_number(int, 0), default=0, help="last global models the state holds")
    p.add_argument("--partition", required=True, type=_existing("folder"), help="partition folder")
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder")
    p.add_argument("--out", required=True, type=_output("file"), help="the fork state file")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.set_defaults(func=cmd_fork)
    finish(p, EXAMPLES["fork"])


def cmd_fork(args) -> None:
    import torch

    from fedrepro.configure.settings import resolve
    from fedrepro.run.jobs import fork_state
    from fedrepro.run.process import die_with_parent

    die_with_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    how = fork_state(
        resolve(args.setting), args.run_dir, args.round, args.history, args.out, args.partition, args.data_root
    )
    print(
        f"fork state of {Path(args.run_dir).name} after {args.round} rounds: {args.out} "
        f"({'kept by the run' if how == 'kept' else 'its first rounds trained again'})"
    )
