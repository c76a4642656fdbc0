"""``fedrepro train`` and ``fedrepro fork``: one training run, and the state runs fork from."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _json_arg, _number, _output, finish


def add_parsers(sub) -> None:
    """train, fork."""
    add_train(sub)
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
    p.add_argument("--keep-forks", type=_rounds, default=[], help="comma-separated rounds after which to keep this "
                   "run's state for runs that fork from it (fork/kept-<round>.pt)")
    p.add_argument("--fork-history", type=_number(int, 0), default=0, help="last global models each kept state "
                   "holds (the children's parts need them: IMA's window)")
    p.add_argument("--fork-from", type=_existing("file"), help="a parent run's fork state to start from (when this run has no checkpoint)")
    p.add_argument("--mlflow-experiment", help="log the run live into this MLflow experiment (default: no tracking)")
    p.add_argument("--mlflow-manifest", type=_existing("file"), help="the params file's manifest: the run is nested under the parent run of "
                   "the first experiment that holds it (not part of the run's identity)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.set_defaults(func=cmd_train)
    finish(p, EXAMPLES["train"])


def cmd_train(args) -> None:
    import torch
    from fedrepro.run.jobs import train
    from fedrepro.run.process import die_with_parent
    from fedrepro.spec.settings import resolve
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
        tracker = live.live_run(args.out, args.tracking_uri, args.mlflow_experiment, args.mlflow_manifest,
                                args.partition)
    from fedrepro.spec import forks
    summary = train(setting, args.out, args.partition, args.data_root, args.checkpoint_every,
                    progress=not args.no_progress, stop_after=args.stop_after, tracker=tracker,
                    keep_forks=args.keep_forks, history=args.fork_history, fork_from=args.fork_from,
                    accepts=lambda parent, rounds: forks.shares_prefix(setting, parent, rounds))
    print(json.dumps({k: summary.get(k) for k in ("run", "status", "final_acc", "best_acc", "runtime_s")}))


RUN_FOLDER = re.compile(r".+-s-?\d+-[0-9a-f]{10}")


def _check_run_folder(setting: dict, out: str) -> None:
    """A run folder named by a run id holds the run of that id: a setting that now hashes to another id (the
    code changed since the grid was expanded) must not train into it."""
    from fedrepro.errors import SetupError
    from fedrepro.identity import run_id
    name = Path(out).name
    if RUN_FOLDER.fullmatch(name) and run_id(setting) != name:
        raise SetupError(f"--out {out}: the setting hashes to run id {run_id(setting)}, not to the folder's name; "
                         f"the code or the setting changed since the grid was expanded: expand it again (snakemake -n)")


def add_fork(sub) -> None:
    """The state of a run after some rounds."""
    p = sub.add_parser("fork", help="the state of a run after some rounds, for the runs that fork from it "
                       "(the one it kept while training, else its first rounds trained again)")
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
    from fedrepro.run.jobs import fork_state
    from fedrepro.run.process import die_with_parent
    from fedrepro.spec.settings import resolve
    die_with_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    how = fork_state(resolve(args.setting), args.run_dir, args.round, args.history, args.out, args.partition,
                            args.data_root)
    print(f"fork state of {Path(args.run_dir).name} after {args.round} rounds: {args.out} "
          f"({'kept by the run' if how == 'kept' else 'its first rounds trained again'})")
