# fedrepro: data -> partitions -> one training job per run -> tracking -> report.
# Thin by design: the grid expansion and every step live in the fedrepro library.
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")

# `snakemake --configfile params/X.yaml` runs X alone; without one, the quick default.
if "experiments" not in config:

    configfile: "params/default.yaml"


sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from fedrepro import identity as fidentity
from fedrepro.errors import FedreproError
from fedrepro.configure import expansion as fexpansion, paramsfile as fparams, schema as fschema, tuning as ftuning

# The params files as the workflow names them: --configfile's, else the directive's (which Snakemake reads
# relative to the working directory). Both spellings of one file give the same names, so that neither
# makes the other rerun a job whose params record them.
CONFIG_PATHS = [os.path.abspath(f) for f in (workflow.overwrite_configfiles or workflow.configfiles)]
CONFIG_FILES = [os.path.relpath(f, workflow.basedir) for f in CONFIG_PATHS]
CONFIG_FILE = CONFIG_FILES[-1]
CONFIG_NAME = Path(CONFIG_FILE).stem

try:
    # Snakemake's own loader lets a repeated key win silently and knows no file of ours by name;
    # ours refuses what `fedrepro expand` refuses. (A YTE template ran already when Snakemake read it:
    # see docs/guarantees.md.)
    for path in CONFIG_PATHS:
        fparams.read_yaml(path)
    fparams.check_name(CONFIG_NAME, "params file name")
    fschema.validate(config, "params.schema.yaml", " ".join(CONFIG_FILES))
    TUNINGS = {}  # the tuning stage's tunings (workflow/rules/tune.smk), filled by expand
    EXPANDED = fexpansion.expand(config, TUNINGS)
    RUNS = fexpansion.unique_runs(EXPANDED)
    EXPERIMENT_RUNS = fexpansion.runs_by_experiment(EXPANDED)  # a run two experiments share is in both
    DATA_ROOT = fparams.data_root(config)
except FedreproError as err:  # a params file (or a fragment of the registry) that cannot run
    raise WorkflowError(f"invalid params file:\n{err}")

PARTITIONS = {run.partition: fidentity.partition_setting(run.setting) for run in RUNS.values()}
# One library function builds the manifest here and in `fedrepro manifest`, which writes it (and checks
# that its content hashes to this path); --config values travel to it as JSON.
MANIFEST_COMMAND = "snakemake --configfile " + " ".join(CONFIG_FILES)
# only --config's values: Snakemake's overwrite_config also holds the --configfile contents, which the
# directive's spelling lacks
CONFIG_OVERRIDES = json.dumps(dict(workflow.config_settings.config), sort_keys=True)
MANIFEST = fexpansion.run_manifest(config, CONFIG_FILES, MANIFEST_COMMAND, CONFIG_NAME, (EXPANDED, TUNINGS))
MANIFEST_PATH = fexpansion.manifest_path(MANIFEST)
# The run table the rules look runs up in: the params files' runs, and the final runs of their tunings
# (workflow/rules/tune.smk) once the checkpoint's manifest, TUNED_MANIFEST, names them.
TUNED_MANIFEST = ftuning.tuned_manifest_path(MANIFEST_PATH)
RUNS = ftuning.RunTable(RUNS, TUNED_MANIFEST)


# The image every job runs in under `--software-deployment-method apptainer` (ignored otherwise, and then no
# part of any job's software record): fedrepro.sif in the working directory, built from the Apptainer
# definition in workflow/container/ (docs/environment.md). One image for every rule: they all run `fedrepro`.
container: "fedrepro.sif"


# `snakemake --lint` warnings left on purpose:
# - "Shell command directly uses variable FEDREPRO from outside of the rule": FEDREPRO is how a job calls
#   fedrepro (the interpreter that runs Snakemake, or the image's), not a value it computes with; as a param it
#   would rerun every job whenever the virtual environment moved.
# - "Mixed rules and functions in same snakefile" (train.smk, tune.smk): their input functions serve the rules
#   beside them and no other file; common.smk holds the ones several files share.
# - "Shell command directly uses variable TRACK_LIVE / MIRRORS / DATA_ROOT from outside of the rule":
#   deliberately no params, since params are a rerun trigger: where the data lives, the mirrors it
#   came from and how a run is grouped in MLflow are no part of what a run computes.
# - "Param data_root / paper_figures is a prefix of input or output file but hardcoded": the workflow
#   runs on a shared file system (locally or on Slurm, docs/cluster.md); paper_figures names the
#   folder of the figure rule's outputs, which are this rule's inputs.
include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/bench.smk"


report: "workflow/report/workflow.rst"


localrules:
    all,
    download,
    manifest,
    track,
    report,
    index,
    collect,


rule all:
    input:
        f"reports/{CONFIG_NAME}.html",
        f"results/tracking/{CONFIG_NAME}.json",
        f"results/index/{CONFIG_NAME}.done",
        f"results/metrics/{CONFIG_NAME}",
