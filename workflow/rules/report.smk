# Built by the library function the Snakefile hashed for MANIFEST_PATH; --check-name refuses a
# manifest whose content does not hash to that path.
rule manifest:
    output:
        MANIFEST_PATH,
    log:
        f"logs/manifest/{CONFIG_NAME}.log",
    benchmark:
        f"benchmarks/manifest/{CONFIG_NAME}.tsv"
    # params are harmless here: what they change, the manifest's content, is in its path already
    params:
        configfiles=CONFIG_FILES,
        base=workflow.basedir,
        overrides=CONFIG_OVERRIDES,
        command=MANIFEST_COMMAND,
    shell:
        "{FEDREPRO} manifest --configfile {params.configfiles:q} --base {params.base:q} --overrides {params.overrides:q} "
        "--command {params.command:q} --out {output:q} --check-name > {log:q} 2>&1"


# A slice of the manifest, one experiment's (a figure's input): written from the params as the manifest is, not
# from the manifest file, so that an edit to another experiment, which gives the manifest a new path, leaves the
# slice's job and path alone.
localrules:
    manifest_slice,


rule manifest_slice:
    output:
        f"results/manifests/{CONFIG_NAME}/{{slice}}.json",
    log:
        f"logs/manifest/{CONFIG_NAME}/{{slice}}.log",
    benchmark:
        f"benchmarks/manifest_slice/{CONFIG_NAME}/{{slice}}.tsv"
    wildcard_constraints:
        slice="[0-9a-f]{10}",
    params:
        configfiles=CONFIG_FILES,
        base=workflow.basedir,
        overrides=CONFIG_OVERRIDES,
        command=MANIFEST_COMMAND,
        experiments=lambda w: shlex.join(SLICE_EXPERIMENTS[w.slice]),
    shell:
        "{FEDREPRO} manifest --configfile {params.configfiles:q} --base {params.base:q} --overrides {params.overrides:q} "
        "--command {params.command:q} --experiments {params.experiments} --out {output:q} --check-name > {log:q} 2>&1"


# REPORT_MANIFEST (tune.smk) is MANIFEST_PATH, or where the params file tunes, the manifest with the final
# runs, written once they are trained and tracked.


# MLflow: each training job logs its own run live; these steps reconcile MLflow with the files
# afterwards. One job per run, so that a failed run blocks only its own: the others are tracked
# (a run the training job logged completely costs no store call). A job whose store is unreachable
# fails without writing its output, and the next snakemake call retries it. A run of the params file's own
# is tracked from its record (common.smk's track_source), a tuning's final run from the checkpoint's manifest.
localrules:
    track_run,


rule track_run:
    input:
        manifest=ancient(lambda w: [] if w.run in RUN_RECORDS else run_manifest_of(w)),  # tune.smk
        summary=ancient("results/runs/{run}/summary.json"),
    output:
        f"results/tracking/{CONFIG_NAME}/{{run}}.json",
    log:
        f"logs/track/{CONFIG_NAME}/{{run}}.log",
    benchmark:
        f"benchmarks/track_run/{CONFIG_NAME}/{{run}}.tsv"
    params:
        enabled=config["tracking"]["enabled"],
        source=track_source,
    shell:
        "if [ {params.enabled} = True ]; then "
        "{FEDREPRO} track {params.source} --run {wildcards.run:q} --out {output:q} > {log:q} 2>&1; "
        "else echo '{{\"disabled\": true}}' > {output:q}; fi"


# Closes the parent run of each experiment once all its runs are tracked.
rule track:
    input:
        manifest=ancient(REPORT_MANIFEST),
        runs=ancient(expand(f"results/tracking/{CONFIG_NAME}/{{run}}.json", run=OWN_RUNS)),  # tune.smk
    output:
        f"results/tracking/{CONFIG_NAME}.json",
    log:
        f"logs/track/{CONFIG_NAME}.log",
    benchmark:
        f"benchmarks/track/{CONFIG_NAME}.tsv"
    params:
        enabled=config["tracking"]["enabled"],
    shell:
        "if [ {params.enabled} = True ]; then {FEDREPRO} track --manifest {input.manifest:q} --out {output:q} > {log:q} 2>&1; "
        "else echo '{{\"disabled\": true}}' > {output:q}; fi"


from fedrepro.report import index as findex

# The index surveys every params file of the project, and this run's own when it lives elsewhere.
INDEX_PARAMS = [str(p) for p in findex.params_files(Path(workflow.basedir) / "params")]
if len(CONFIG_FILES) == 1 and Path(workflow.basedir, CONFIG_FILE).resolve() not in map(Path, INDEX_PARAMS):
    INDEX_PARAMS.append(str(Path(workflow.basedir, CONFIG_FILE).resolve()))


rule report:
    input:
        manifest=ancient(REPORT_MANIFEST),
        # run and partition paths are content hashes: a new or changed run is a new path (input trigger)
        summaries=ancient(expand("results/runs/{run}/summary.json", run=RUNS)),
        partitions=ancient(expand("results/partitions/{partition}/heatmap.png", partition=PARTITIONS)),
        paper_figures=expand(f"{FIGURES_DIR}/{{figure}}.png", figure=FIGURES),  # figures.smk
    output:
        page=report(f"reports/{CONFIG_NAME}.html", caption="../report/index.rst", category="Report"),
        # the page's figures as files, so that `snakemake --report` packs them with their captions
        figures=report(
            directory(f"reports/{CONFIG_NAME}_figures"),
            patterns=["{experiment,[A-Za-z0-9_]+}.{kind}.png"],
            caption="../report/figure.rst",
            category=CONFIG_NAME,
            subcategory="{experiment}",
            labels={"experiment": "{experiment}", "figure": "{kind}"},
        ),
        # the paper-vs-ours tables as CSV, LaTeX and Markdown, which the page links (report.tables_folder)
        tables=directory(f"reports/{CONFIG_NAME}_tables"),
    log:
        f"logs/report/{CONFIG_NAME}.log",
    benchmark:
        f"benchmarks/report/{CONFIG_NAME}.tsv"
    params:
        paper_figures=FIGURES_DIR,
    shell:
        "{FEDREPRO} report --manifest {input.manifest:q} --out {output.page:q} --figures {output.figures:q} "
        "--paper-figures {params.paper_figures:q} > {log:q} 2>&1"


# The page of each evidence folder of the repository (the kept records of runs at the papers' settings), rebuilt
# from the folder alone, no training; reports/index.html opens with their verified results and links them.
# Built where the workflow runs in the repository itself (`make run`, `snakemake` in its root), beside the
# repository's own results; run in another working directory (--directory), the workflow leaves them out
# and the index names the command that builds each (`fedrepro evidence report`).
EVIDENCE_PAGES = (
    [f.name for f in findex.evidence_folders(Path(workflow.basedir) / "evidence")]
    if Path.cwd().resolve() == Path(workflow.basedir).resolve()
    else []
)


localrules:
    evidence_page,


rule evidence_page:
    input:
        # the folder's every file: a record kept again, added or removed rebuilds its page
        lambda w: sorted(str(p) for p in Path("evidence", w.name).rglob("*") if p.is_file()),
    output:
        page="reports/evidence/{name}.html",
        tables=directory("reports/evidence/{name}_tables"),
    log:
        "logs/evidence_page/{name}.log",
    benchmark:
        "benchmarks/evidence_page/{name}.tsv"
    wildcard_constraints:
        name="[A-Za-z0-9_.-]+",
    params:
        folder=lambda w: f"evidence/{w.name}",
    shell:
        "{FEDREPRO} evidence report {params.folder:q} --out {output.page:q} > {log:q} 2>&1"


# reports/index.html surveys every params file, so every params file's workflow writes it: it is no
# declared output (Snakemake would refuse to run two params files side by side, each locking it),
# `fedrepro index` replaces it atomically (the last writer wins with a whole page), and this rule's
# output is a per-params-file record that it was written after this file's report.
rule index:
    input:
        manifest=ancient(REPORT_MANIFEST),
        # ancient: the index only has to follow them, and files restored by `dvc pull` carry new mtimes
        page=ancient(f"reports/{CONFIG_NAME}.html"),
        tracking=ancient(f"results/tracking/{CONFIG_NAME}.json"),
        evidence_pages=expand("reports/evidence/{name}.html", name=EVIDENCE_PAGES),
    output:
        # a marker DVC keeps with the results (dvc.yaml), so a pulled clone has nothing left to do
        touch(f"results/index/{CONFIG_NAME}.done"),
    log:
        f"logs/index/{CONFIG_NAME}.log",
    benchmark:
        f"benchmarks/index/{CONFIG_NAME}.tsv"
    params:
        index_params=INDEX_PARAMS,
    shell:
        "{FEDREPRO} index --out reports/index.html --params {params.index_params:q} > {log:q} 2>&1"


rule collect:
    input:
        manifest=ancient(REPORT_MANIFEST),
        summaries=ancient(expand("results/runs/{run}/summary.json", run=OWN_RUNS)),  # tune.smk
    output:
        # one file per experiment and variant: a row of `dvc metrics show`, a plot of `dvc plots show`
        metrics=directory(f"results/metrics/{CONFIG_NAME}"),
        curves=directory(f"results/curves/{CONFIG_NAME}"),
    log:
        f"logs/collect/{CONFIG_NAME}.log",
    benchmark:
        f"benchmarks/collect/{CONFIG_NAME}.tsv"
    shell:
        "{FEDREPRO} collect --manifest {input.manifest:q} --metrics {output.metrics:q} --curves {output.curves:q} > {log:q} 2>&1"
