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
from fedrepro.configure import forks as fforks

STEP_COSTS = fpricing.step_costs_by_device()


def run_step_costs(setting):
    return STEP_COSTS[fpricing.run_device(setting)]


# Grids as trees (fedrepro.configure.forks): a run whose first rounds another run of this invocation trains (an +ima
# run, its host's run up to t_s) starts from that run's state there. The parent keeps it while it trains,
# the fork rule makes it a temporary output, removed once every child is done.
FORKS = fforks.WorkflowForks(config, RUNS)
# parents in no params file of this invocation that its finished runs forked from (common.smk's run_setting)
PARENT_SETTINGS = FORKS.recorded_parents()


def fork_input(wildcards):
    """The parent's fork state this run starts from, or nothing."""
    fork = FORKS.of_run(wildcards.run)
    return [] if fork is None else f"results/runs/{fork[0]}/fork/{fork[1]}.pt"


def train_minutes(wildcards, attempt):
    """The job's runtime request: the rounds it trains, from its fork round for a child (fedrepro plan)."""
    fork = FORKS.of_run(wildcards.run)
    setting = run_setting(wildcards)
    return fplan.run_minutes(setting, run_step_costs(setting), start=fork[1] if fork else 0) * attempt


def fork_minutes(wildcards, rounds):
    """The fork step's runtime request: at most the parent's first ``rounds`` rounds again."""
    setting = run_setting(wildcards)
    return fplan.run_minutes(setting, run_step_costs(setting), stop=rounds)


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
        forks=lambda w, input: shlex.join(FORKS.train_args(w.run, input.fork)),
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
        history=lambda w: FORKS.history(w.run, int(w.round)),
    shell:
        "exec {FEDREPRO} fork --setting {params.setting:q} --run-dir results/runs/{wildcards.run:q} "
        "--round {wildcards.round} --history {params.history} --partition {params.partition_dir:q} "
        "--data-root {params.data_root:q} --out {output:q} --threads {threads} > {log:q} 2>&1"


# Packed runs (config pack.packs > 0; fedrepro.configure.packs): the runs of one dataset, model and device are spread
# over that many processes, each training its runs as one pack into staging folders; each run's own job then
# takes its result into its run folder. A run's pack is fixed by its own id, so a changed run retrains in its
# pack while its pack-mates' results (already in their run folders) stay; a killed pack resumes each run from
# its own checkpoint. Runs that fork or keep fork states train alone (rule train). pack.packs 0: no run packs.
import re

from fedrepro.configure import packs as fpacks

PACKS = fpacks.WorkflowPacks(
    {run: r.setting for run, r in dict.items(RUNS)},
    config["pack"]["packs"],
    {run for run in dict.keys(RUNS) if FORKS.of_run(run) is not None or FORKS.train_args(run, None)},
)


def pack_members(pack):
    return fpacks.WorkflowPacks.job_members(
        PACKS,
        pack,
        lambda run: f"results/partitions/{fidentity.partition_id(RUNS[run].setting)}",
        lambda run: f"{DATA_ROOT}/{RUNS[run].setting['dataset']}",
    )


ruleorder: take_packed > train


# One rule a pack, its outputs a marker per member: a pack whose member list grows has a missing marker, so its job
# reruns (training only the runs not yet in their run folders); a finished run's marker path never changes, so its
# take_packed job never reruns for a pack-mate.
for _pack, _members in PACKS.members.items():
    _pack_rule = re.sub(r"\W", "_", _pack)

    rule:
        name:
            f"train_pack_{_pack_rule}"
        input:
            partitions=ancient(sorted({f"{m['partition']}/clients.npz" for m in pack_members(_pack)})),
            data=ancient(sorted({f"{m['data_root']}/download.json" for m in pack_members(_pack)})),
        output:
            [PACKS.marker(run) for run in _members],
        log:
            f"logs/train_pack/{_pack}.log",
        benchmark:
            f"benchmarks/train_pack/{_pack}.tsv"
        threads: 1
        resources:
            gpu=0 if _pack.split("-")[-2] == "cpu" else 1,
            gpu_slot=0 if _pack.split("-")[-2] == "cpu" else 1,
            mem_mb=lambda w, attempt: 4000 * attempt,
        params:
            members=json.dumps(pack_members(_pack), sort_keys=True),
            done=f"results/packs/{_pack}/done",
        shell:
            "exec {FEDREPRO} train-pack --members {params.members:q} --done-dir {params.done:q} "
            "--threads {threads} > {log:q} 2>&1"


rule take_packed:
    input:
        pack=lambda w: ancient(PACKS.marker(w.run)),
    output:
        summary="results/runs/{run}/summary.json",
        metrics="results/runs/{run}/metrics.csv",
        model="results/runs/{run}/model.pt",
    log:
        "logs/take_packed/{run}.log",
    benchmark:
        "benchmarks/take_packed/{run}.tsv"
    wildcard_constraints:
        run=PACKS.run_pattern(),
    params:
        setting=lambda w: json.dumps(run_setting(w), sort_keys=True),
        staged=lambda w: PACKS.staged(w.run),
    shell:
        "{FEDREPRO} take-packed --setting {params.setting:q} --staged {params.staged:q} "
        "--out results/runs/{wildcards.run:q} > {log:q} 2>&1"
