# The papers' analysis figures (docs/figures.md): one job per entry of the params file's `figures:`
# section, each a call of `fedrepro figures`. Figures of experiments left out by `only` are skipped.
from fedrepro.report import figures as ffigures

try:
    FIGURES = {
        name: spec
        for name, spec in ffigures.check(config.get("figures", {}), config["experiments"]).items()
        if spec["kind"] in ffigures.NO_RUNS or spec["experiment"] in fparams.selected_experiments(config)
    }
except fschema.ConfigError as err:
    raise WorkflowError(f"invalid figures section:\n{err}")
FIGURES_DIR = f"results/figures/{CONFIG_NAME}"
# Each figure reads the slice of the manifest of its experiment (none for a figure of no runs), content-addressed:
# an edit to another experiment leaves its path, and so the figure, alone (rule manifest_slice, report.smk).
FIGURE_SLICES, SLICE_EXPERIMENTS = {}, {}
for _name, _spec in FIGURES.items():
    _experiments = [] if _spec["kind"] in ffigures.NO_RUNS else [_spec["experiment"]]
    FIGURE_SLICES[_name] = fexpansion.slice_path(fexpansion.experiment_slice(MANIFEST, _experiments))
    SLICE_EXPERIMENTS[Path(FIGURE_SLICES[_name]).stem] = _experiments


rule figure:
    input:
        manifest=ancient(figure_manifest),
        summaries=ancient(lambda w: expand("results/runs/{run}/summary.json", run=figure_runs(w))),
        data=ancient(figure_data),
    output:
        png=f"{FIGURES_DIR}/{{figure}}.png",
        caption=f"{FIGURES_DIR}/{{figure}}.json",
    log:
        f"logs/figures/{CONFIG_NAME}/{{figure}}.log",
    benchmark:
        f"benchmarks/figure/{CONFIG_NAME}/{{figure}}.tsv"
    wildcard_constraints:
        figure="[A-Za-z0-9_]+",
    # landscapes evaluate hundreds of models: both cores of a small machine
    threads: lambda w: 2 if FIGURES[w.figure]["kind"] in ffigures.EVALUATES else 1
    resources:
        # landscapes and interpolations evaluate models: a GPU on a cluster, the CPU otherwise
        gpu=lambda w: int(FIGURES[w.figure]["kind"] in ffigures.EVALUATES),
    params:
        spec=lambda w: json.dumps(FIGURES[w.figure], sort_keys=True),
    shell:
        "{FEDREPRO} figures --name {wildcards.figure:q} --spec {params.spec:q} --manifest {input.manifest:q} "
        "--data-root {DATA_ROOT:q} --threads {threads} --out {output.png:q} > {log:q} 2>&1"
