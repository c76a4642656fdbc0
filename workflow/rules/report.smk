rule manifest:
    output:
        MANIFEST_PATH,
    run:
        Path(output[0]).write_text(json.dumps(MANIFEST, indent=2, sort_keys=True))


rule track:
    input:
        manifest=ancient(MANIFEST_PATH),
        summaries=ancient(expand("results/runs/{run}/summary.json", run=RUNS)),
    output:
        f"results/tracking/{CONFIG_NAME}.json",
    params:
        enabled=config["tracking"]["enabled"],
    log:
        f"logs/track/{CONFIG_NAME}.log",
    shell:
        "if [ {params.enabled} = True ]; then fedrepro track --manifest {input.manifest:q} --out {output:q} > {log:q} 2>&1; "
        "else echo '{{\"disabled\": true}}' > {output:q}; fi"


from fedrepro import index as findex

# The index surveys every params file of the project, and this run's own when it lives elsewhere.
INDEX_PARAMS = [str(p) for p in findex.params_files(Path(workflow.basedir) / "params")]
if len(CONFIG_FILES) == 1 and Path(workflow.basedir, CONFIG_FILE).resolve() not in map(Path, INDEX_PARAMS):
    INDEX_PARAMS.append(str(Path(workflow.basedir, CONFIG_FILE).resolve()))


rule report:
    input:
        manifest=ancient(MANIFEST_PATH),
        # run and partition paths are content hashes: a new or changed run is a new path (input trigger)
        summaries=ancient(expand("results/runs/{run}/summary.json", run=RUNS)),
        partitions=ancient(expand("results/partitions/{partition}/heatmap.png", partition=PARTITIONS)),
        paper_figures=expand(f"{FIGURES_DIR}/{{figure}}.png", figure=FIGURES),  # figures.smk
    output:
        page=report(f"reports/{CONFIG_NAME}.html", caption="../report/index.rst", category="Report"),
        index="reports/index.html",
        # the page's figures as files, so that `snakemake --report` packs them with their captions
        figures=report(
            directory(f"reports/{CONFIG_NAME}_figures"),
            patterns=["{experiment,[A-Za-z0-9_]+}.{kind}.png"],
            caption="../report/figure.rst",
            category=CONFIG_NAME,
            subcategory="{experiment}",
            labels={"experiment": "{experiment}", "figure": "{kind}"},
        ),
    log:
        f"logs/report/{CONFIG_NAME}.log",
    params:
        index_params=INDEX_PARAMS,
        paper_figures=FIGURES_DIR,
    shell:
        "(fedrepro report --manifest {input.manifest:q} --out {output.page:q} --figures {output.figures:q} "
        "--paper-figures {params.paper_figures:q} && "
        "fedrepro index --out {output.index:q} --params {params.index_params:q}) > {log:q} 2>&1"


rule collect:
    input:
        manifest=ancient(MANIFEST_PATH),
        summaries=ancient(expand("results/runs/{run}/summary.json", run=RUNS)),
    output:
        # one file per experiment and variant: a row of `dvc metrics show`, a plot of `dvc plots show`
        metrics=directory(f"results/metrics/{CONFIG_NAME}"),
        curves=directory(f"results/curves/{CONFIG_NAME}"),
    log:
        f"logs/collect/{CONFIG_NAME}.log",
    shell:
        "fedrepro collect --manifest {input.manifest:q} --metrics {output.metrics:q} --curves {output.curves:q} > {log:q} 2>&1"
