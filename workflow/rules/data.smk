# The mirrors decide where the bytes come from, not what they are (checksums do), so they are no
# param: a changed mirror list reruns nothing. They reach the command as a global, all datasets' lists.
MIRRORS = json.dumps(config["data"]["mirrors"], sort_keys=True)


rule download:
    output:
        f"{DATA_ROOT}/{{dataset}}/download.json",
    log:
        "logs/download/{dataset}.log",
    benchmark:
        "benchmarks/download/{dataset}.tsv"
    params:
        root=lambda w: f"{DATA_ROOT}/{w.dataset}",
    shell:
        "{FEDREPRO} download --dataset {wildcards.dataset:q} --root {params.root:q} --mirror-map {MIRRORS:q} "
        "--out {output:q} > {log:q} 2>&1"
