# The tuning stage (fedrepro.configure.tuning; docs/configuration.md "Tuning"): a params file's tune blocks name values the papers
# picked from a grid. Their tuning runs are ordinary runs (rule train) scored on a validation split; `tune`
# ranks each tuning's candidates, and the checkpoint `tuned_manifest` writes the manifest with the final runs
# the choices give. Those runs' ids hold the chosen values, so they are known only after the checkpoint:
# `snakemake -n` shows the tuning work, and Snakemake adds the final runs once the choices exist.
# The checkpoint's manifest (TUNED_MANIFEST, the Snakefile's): the final runs the choices give. Snakemake
# examines a job that depends on a checkpoint only once the checkpoint has run, and replaces such jobs after
# it; so one job depends on it, `tuned_runs`, which waits for the final runs and writes the manifest the
# report, tracking and collect steps read (REPORT_MANIFEST: both paths carry the manifest's hash, so a
# changed grid is new work).
REPORT_MANIFEST = MANIFEST_PATH[: -len(".json")] + ".final.json" if TUNINGS else MANIFEST_PATH
TUNING_RUNS = {run_id for run_id, run in RUNS.items() if run.tuning}
OWN_RUNS = [run_id for run_id in RUNS if run_id not in TUNING_RUNS]  # tuning runs belong to no experiment
# experiments whose grid has points a tuning decides (their final runs follow the checkpoint)
TUNED_EXPERIMENTS = {name for tuning in TUNINGS.values() for name in tuning["experiments"]}


def final_runs(wildcards=None):
    """The final runs of the tunings (raises Snakemake's incomplete-checkpoint signal until they are known)."""
    if not TUNINGS:
        return []
    checkpoints.tuned_manifest.get()
    return RUNS.final_ids()


def run_manifest_of(wildcards):
    """The manifest that lists a run: the params file's for its own runs, the checkpoint's for a final run."""
    return MANIFEST_PATH if wildcards.run in OWN_RUNS else TUNED_MANIFEST


def tuning_run_summaries(wildcards):
    selection = TUNINGS[wildcards.tuning]["selection"]
    return [f"results/runs/{run_id}/summary.json" for c in selection["candidates"] for run_id in c["runs"]]


localrules:
    tune,


# The choice of one tuning. Its path is a hash of the candidates' runs and the criterion: a changed tuning
# grid is a new choice, next to the old one.
rule tune:
    input:
        manifest=ancient(MANIFEST_PATH),
        summaries=ancient(tuning_run_summaries),
    output:
        "results/tuning/{tuning}.json",
    log:
        "logs/tune/{tuning}.log",
    benchmark:
        "benchmarks/tune/{tuning}.tsv"
    wildcard_constraints:
        tuning="tune-[A-Za-z0-9_.+-]+",
    shell:
        "{FEDREPRO} tune select --manifest {input.manifest:q} --tuning {wildcards.tuning:q} --out {output:q} > {log:q} 2>&1"


if TUNINGS:

    localrules:
        tuned_manifest,

    checkpoint tuned_manifest:
        input:
            manifest=ancient(MANIFEST_PATH),
            # content-addressed (their tunings' runs and criterion): ancient, as the runs' summaries are
            choices=ancient(expand("results/tuning/{tuning}.json", tuning=TUNINGS)),
        output:
            TUNED_MANIFEST,
        log:
            f"logs/tune/{CONFIG_NAME}.manifest.log",
        benchmark:
            f"benchmarks/tuned_manifest/{CONFIG_NAME}.tsv"
        shell:
            "{FEDREPRO} tune manifest --manifest {input.manifest:q} --choices {input.choices:q} --out {output:q} "
            "> {log:q} 2>&1"

    localrules:
        tuned_runs,

    # Once the final runs are trained and tracked: the manifest with them, for the steps after.
    rule tuned_runs:
        input:
            manifest=ancient(TUNED_MANIFEST),
            # not ancient: Snakemake 9 loses the steps after this one when an ancient input awaits the checkpoint
            summaries=lambda w: expand("results/runs/{run}/summary.json", run=final_runs()),
            tracking=lambda w: expand(f"results/tracking/{CONFIG_NAME}/{{run}}.json", run=final_runs()),
        output:
            REPORT_MANIFEST,
        log:
            f"logs/tune/{CONFIG_NAME}.final.log",
        benchmark:
            f"benchmarks/tuned_runs/{CONFIG_NAME}.tsv"
        shell:
            "{FEDREPRO} tune final --manifest {input.manifest:q} --out {output:q} > {log:q} 2>&1"
