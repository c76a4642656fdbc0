# Live MLflow logging. Its grouping (an MLflow experiment per params file, the parent run named in
# the manifest) comes from globals, not params: it is no part of the run's identity, and a run that
# several params files share must not rerun because another file tracks it.
TRACK_LIVE = (
    shlex.join(["--mlflow-experiment", f"{config['tracking']['experiment_prefix']}/{CONFIG_NAME}",
                "--mlflow-manifest", MANIFEST_PATH])
    if config["tracking"]["enabled"] and config["tracking"]["live"]
    else ""
)

# Runtime requests: each run's estimated steps x measured seconds per step x a margin (fedrepro plan).
from fedrepro import plan as fplan

STEP_COSTS, _ = fplan.load_step_costs()


rule train:
    # The run's path carries a hash of its setting and of the code it depends on (editing one method
    # gives its runs new paths), the partition's path likewise; data is checksum-verified. So inputs
    # are judged by content, not mtime: a clone restored by `dvc pull` or a touched file reruns nothing.
    input:
        partition=ancient(lambda w: f"results/partitions/{run_partition(w)}/clients.npz"),
        data=ancient(lambda w: f"{DATA_ROOT}/{run_setting(w)['dataset']}/download.json"),
    output:
        summary="results/runs/{run}/summary.json",
        metrics="results/runs/{run}/metrics.csv",
        model="results/runs/{run}/model.pt",
    params:
        setting=lambda w: json.dumps(run_setting(w), sort_keys=True),
        data_root=lambda w: f"{DATA_ROOT}/{run_setting(w)['dataset']}",
        partition_dir=lambda w: f"results/partitions/{run_partition(w)}",
        out=lambda w: f"results/runs/{w.run}",
    threads: 1
    resources:
        # "1" as a string: a Slurm group of runs sharing one GPU asks for one, not one per run. A device: cpu
        # run asks for none: inside a submission each job is its own srun step, and steps of CPU runs that
        # each asked for the submission's one GPU would wait for it (or fail) instead of running
        gpu=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        # one of the GPU slots the profile declares (GPUs x runs per GPU); device: cpu runs take none
        gpu_slot=lambda w: 0 if run_setting(w)["device"] == "cpu" else 1,
        mem_mb=lambda w, attempt: 4000 * attempt,
        runtime=lambda w, attempt: fplan.run_minutes(run_setting(w), STEP_COSTS) * attempt,
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    # exec: the shell becomes `fedrepro train`, whose parent is then Snakemake itself, so that it stops
    # (checkpoint first, as on SIGTERM) when Snakemake is killed (engine.die_with_parent)
    shell:
        "exec {FEDREPRO} train --setting {params.setting:q} --partition {params.partition_dir:q} "
        "--data-root {params.data_root:q} --out {params.out:q} --threads {threads} {TRACK_LIVE} > {log:q} 2>&1"
