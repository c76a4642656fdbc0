# Live MLflow logging. Its grouping (an MLflow experiment per params file, the parent run named in
# the manifest) comes from globals, not params: it is no part of the run's identity, and a run that
# several params files share must not rerun because another file tracks it.
TRACK_LIVE = (
    shlex.join(
        [
            "--mlflow-experiment",
            f"{config['tracking']['experiment_prefix']}/{CONFIG_NAME}",
            "--mlflow-manifest",
            MANIFEST_PATH,
        ]
    )
    if config["tracking"]["enabled"] and config["tracking"]["live"]
    else ""
)

# Runtime requests: each run's estimated steps x seconds per step on the device it trains on x a margin
# (fedrepro plan). Per device, so that a CPU benchmark never shortens a GPU job's request or the reverse.
from fedrepro.ops import plan as fplan, pricing as fpricing

STEP_COSTS = fpricing.step_costs_by_device()


def run_step_costs(setting):
    return STEP_COSTS[fpricing.run_device(setting)]


# Grids as trees (fedrepro.spec.forks): a run whose first rounds another run of this invocation trains (an +ima
# run, its host's run up to t_s) starts from that run's state there. The parent keeps it while it trains,
# the fork rule makes it a temporary output, removed once every child is done.
from fedrepro.spec import forks as fforks
from fedrepro.records import read_json
from fedrepro.rundir import RunDir

_FORKS_CACHE = {}


def current_forks():
    """(forks, kept) of every run known now: the params files' runs, and once the tuning checkpoint has
    chosen (workflow/rules/tune.smk), the final runs it gives, so that a tuned +ima run forks from its
    tuned host too. Computed once per set of final runs."""
    finals = tuple(RUNS.final_ids()) if hasattr(RUNS, "final_ids") else ()
    if finals not in _FORKS_CACHE:
        runs = {**RUNS, **{run_id: RUNS[run_id] for run_id in finals}}
        forks = fforks.of_params(config, list(runs.values()))
        _FORKS_CACHE[finals] = (forks, fforks.kept(forks))
    return _FORKS_CACHE[finals]


def finished_summary(run_id):
    """A finished run's summary, else None: what its job was given is kept there, so that a run done in
    another invocation (another params file, sharing off, a subset) keeps the inputs and params Snakemake
    recorded for it and does not rerun."""
    run = RunDir(f"results/runs/{run_id}")
    return run.read_summary() if run.finished() else None


def recorded_parents():
    """Settings of the parents that finished runs of this invocation forked from, where the parent is in no
    params file of it (a subset): the fork rule names their files, so Snakemake must know them."""
    parents = {}
    for run in RUNS.values():
        fork = (finished_summary(run.id) or {}).get("forked_from")
        if fork and fork["run"] not in RUNS:
            for setting, _, _ in fforks.prefix_parents(run.setting):
                if fidentity.run_id(setting) == fork["run"]:
                    parents[fork["run"]] = setting
    return parents


PARENT_SETTINGS = recorded_parents()


def run_fork(wildcards):
    """(parent, round) of the fork state this run starts from, or None."""
    summary = finished_summary(wildcards.run)
    if summary is not None:
        fork = summary.get("forked_from")
        return None if not fork else (fork["run"], fork["round"])
    fork = current_forks()[0].get(wildcards.run)
    return None if fork is None else (fork.parent, fork.round)


def fork_input(wildcards):
    """The parent's fork state this run starts from, or nothing."""
    fork = run_fork(wildcards)
    return [] if fork is None else f"results/runs/{fork[0]}/fork/{fork[1]}.pt"


def train_minutes(wildcards, attempt):
    """The job's runtime request: the rounds it trains, from its fork round for a child (fedrepro plan)."""
    fork = run_fork(wildcards)
    setting = run_setting(wildcards)
    return fplan.run_minutes(setting, run_step_costs(setting), start=fork[1] if fork else 0) * attempt


def fork_minutes(wildcards, rounds):
    """The fork step's runtime request: at most the parent's first ``rounds`` rounds again."""
    setting = run_setting(wildcards)
    return fplan.run_minutes(setting, run_step_costs(setting), stop=rounds)


def fork_args(wildcards, input):
    """``--keep-forks`` for a parent (the rounds its children start at), ``--fork-from`` for a child."""
    summary = finished_summary(wildcards.run)
    if summary is not None:
        kept = summary.get("kept_forks") or {"rounds": [], "history": 0}
        rounds, history = kept["rounds"], kept["history"]
    else:
        rounds, history = current_forks()[1].get(wildcards.run, ([], 0))
    args = ["--keep-forks", ",".join(map(str, rounds)), "--fork-history", str(history)] if rounds else []
    return shlex.join(args + (["--fork-from", input.fork] if input.fork else []))


def fork_history(wildcards):
    """The last models the children starting at this round need (IMA's window); at least what a finished
    parent kept there, so that its children, done in another invocation, see the params they were made with."""
    round_ = int(wildcards.round)
    needs = [f.history for f in current_forks()[0].values() if f.parent == wildcards.run and f.round == round_]
    summary = finished_summary(wildcards.run)
    kept = (summary or {}).get("kept_forks") or {"rounds": [], "history": 0}
    return max([*needs, kept["history"] if round_ in kept["rounds"] else 0])


rule train:
    # The run's path carries a hash of its setting and of the code it depends on (editing one method
    # gives its runs new paths), the partition's path likewise; data is checksum-verified. So inputs
    # are judged by content, not mtime: a clone restored by `dvc pull` or a touched file reruns nothing.
    input:
        partition=ancient(lambda w: f"results/partitions/{run_partition(w)}/clients.npz"),
        data=ancient(lambda w: f"{DATA_ROOT}/{run_setting(w)['dataset']}/download.json"),
        fork=ancient(fork_input),
    output:
        summary="results/runs/{run}/summary.json",
        metrics="results/runs/{run}/metrics.csv",
        model="results/runs/{run}/model.pt",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    threads: 1
    resources:
        # "1" as a string: a Slurm group of runs sharing one GPU asks for one, not one per run. A device: cpu
        # run asks for none: inside a submission each job is its own srun step, and steps of CPU runs that
        # each asked for the submission's one GPU would wait for it (or fail) instead of running
        gpu=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        # one of the GPU slots the profile declares (GPUs x runs per GPU); device: cpu runs take none
        gpu_slot=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        mem_mb=lambda w, attempt: 4000 * attempt,
        runtime=train_minutes,
    params:
        setting=lambda w: json.dumps(run_setting(w), sort_keys=True),
        data_root=lambda w: f"{DATA_ROOT}/{run_setting(w)['dataset']}",
        partition_dir=lambda w: f"results/partitions/{run_partition(w)}",
        out=lambda w: f"results/runs/{w.run}",
        forks=fork_args,
    # exec: the shell becomes `fedrepro train`, whose parent is then Snakemake itself, so that it stops
    # (checkpoint first, as on SIGTERM) when Snakemake is killed (engine.die_with_parent)
    shell:
        "exec {FEDREPRO} train --setting {params.setting:q} --partition {params.partition_dir:q} "
        "--data-root {params.data_root:q} --out {params.out:q} --threads {threads} {params.forks} {TRACK_LIVE} > {log:q} 2>&1"


rule fork:
    # A parent's state after {round} rounds, for the runs that start there. Its training job kept it
    # (fork/kept-<round>.pt) and this step moves it here; a parent that finished before a child asked for
    # this round (or whose kept state a removed child used) has its first rounds trained again, into the
    # same bytes. Temporary: removed once every child is done, so a grid costs at most one state per
    # (parent, round) in flight; a later child of a finished parent trains the prefix again, which costs
    # no more than training it from round 0.
    input:
        summary=ancient("results/runs/{run}/summary.json"),
    output:
        temp("results/runs/{run}/fork/{round}.pt"),
    log:
        "logs/fork/{run}-{round}.log",
    benchmark:
        "benchmarks/fork/{run}-{round}.tsv"
    wildcard_constraints:
        round=r"\d+",
    threads: 1
    resources:
        gpu=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        gpu_slot=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        mem_mb=lambda w, attempt: 4000 * attempt,
        # at most the parent's first {round} rounds again (moving a kept state takes none of it)
        runtime=lambda w, attempt: fork_minutes(w, int(w.round)) * attempt,
    params:
        setting=lambda w: json.dumps(run_setting(w), sort_keys=True),
        data_root=lambda w: f"{DATA_ROOT}/{run_setting(w)['dataset']}",
        partition_dir=lambda w: f"results/partitions/{run_partition(w)}",
        history=fork_history,
    shell:
        "exec {FEDREPRO} fork --setting {params.setting:q} --run-dir results/runs/{wildcards.run:q} "
        "--round {wildcards.round} --history {params.history} --partition {params.partition_dir:q} "
        "--data-root {params.data_root:q} --out {output:q} --threads {threads} > {log:q} 2>&1"
