# Every rule calls the fedrepro of the Python that runs Snakemake (so `.venv/bin/snakemake` works without
# activating the environment, and Slurm jobs, which rerun this file there, do likewise), never a `fedrepro`
# found on PATH.
FEDREPRO = shlex.quote(sys.executable) + " -m fedrepro"


def run_setting(wildcards):
    # a parent that only finished runs of this invocation forked from (train.smk) is known by its setting
    return RUNS[wildcards.run].setting if wildcards.run in RUNS else PARENT_SETTINGS[wildcards.run]


def run_partition(wildcards):
    return fconfig.partition_id(run_setting(wildcards))


# figures.smk
def figure_runs(wildcards):
    spec = FIGURES[wildcards.figure]
    return [] if spec["kind"] in ffigures.NO_RUNS else EXPERIMENT_RUNS.get(spec["experiment"], [])


def figure_data(wildcards):
    if FIGURES[wildcards.figure]["kind"] not in ffigures.EVALUATES:
        return []
    return sorted({f"{DATA_ROOT}/{RUNS[i].setting['dataset']}/download.json" for i in figure_runs(wildcards)})
