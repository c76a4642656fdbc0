# Every rule calls the fedrepro of the Python that runs Snakemake (so `.venv/bin/snakemake` works without
# activating the environment, and Slurm jobs, which rerun this file there, do likewise), never a `fedrepro`
# found on PATH. In a container (`--software-deployment-method apptainer`, the Snakefile's `container:`),
# the image's Python, which holds the locked dependencies, runs this checkout's code.
from snakemake.settings.types import DeploymentMethod

if DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method:
    FEDREPRO = "PYTHONPATH=" + shlex.quote(str(Path(workflow.basedir) / "src")) + " python -m fedrepro"
else:
    FEDREPRO = shlex.quote(sys.executable) + " -m fedrepro"


def run_setting(wildcards):
    # a parent that only finished runs of this invocation forked from (train.smk) is known by its setting
    return RUNS[wildcards.run].setting if wildcards.run in RUNS else PARENT_SETTINGS[wildcards.run]


def run_partition(wildcards):
    return fidentity.partition_id(run_setting(wildcards))


# figures.smk
def figure_tuned(wildcards) -> bool:
    """Whether the figure's experiment has tuned runs (tune.smk): they are known only after the checkpoint."""
    return FIGURES[wildcards.figure].get("experiment") in TUNED_EXPERIMENTS


def figure_runs(wildcards):
    spec = FIGURES[wildcards.figure]
    if spec["kind"] in ffigures.NO_RUNS:
        return []
    # a run two experiments share is in both (EXPERIMENT_RUNS); a tuning run belongs to no figure
    own = [i for i in EXPERIMENT_RUNS.get(spec["experiment"], []) if i not in TUNING_RUNS]
    return own + (
        [i for i in final_runs() if RUNS[i].experiment == spec["experiment"]] if figure_tuned(wildcards) else []
    )


def figure_manifest(wildcards):
    """The manifest that lists the figure's runs: its experiment's slice (figures.smk), or the checkpoint's when
    its experiment has tuned runs."""
    return TUNED_MANIFEST if figure_tuned(wildcards) else FIGURE_SLICES[wildcards.figure]


def figure_data(wildcards):
    if FIGURES[wildcards.figure]["kind"] not in ffigures.EVALUATES:
        return []
    return sorted({f"{DATA_ROOT}/{RUNS[i].setting['dataset']}/download.json" for i in figure_runs(wildcards)})


# report.smk's track_run: a run of the params file's own is tracked from its record (fedrepro.configure.expansion.
# run_records), a params value, so the job reruns when the record changes and not when another run's does; a
# tuning's final run from the checkpoint's manifest (tune.smk).
RUN_RECORDS = fexpansion.run_records(MANIFEST)


def track_source(wildcards, input):
    if wildcards.run in RUN_RECORDS:
        return f"--record {shlex.quote(json.dumps(RUN_RECORDS[wildcards.run], sort_keys=True))}"
    return f"--manifest {shlex.quote(input.manifest)}"
