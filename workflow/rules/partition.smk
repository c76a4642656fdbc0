rule partition:
    input:
        ancient(lambda w: f"{DATA_ROOT}/{PARTITIONS[w.partition]['dataset']}/download.json"),
    output:
        indices="results/partitions/{partition}/clients.npz",
        counts="results/partitions/{partition}/counts.csv",
        heatmap="results/partitions/{partition}/heatmap.png",
        info="results/partitions/{partition}/partition.json",
    log:
        "logs/partition/{partition}.log",
    benchmark:
        "benchmarks/partition/{partition}.tsv"
    params:
        setting=lambda w: json.dumps(PARTITIONS[w.partition], sort_keys=True),
        data_root=lambda w: f"{DATA_ROOT}/{PARTITIONS[w.partition]['dataset']}",
        out=lambda w: f"results/partitions/{w.partition}",
    shell:
        "{FEDREPRO} partition --setting {params.setting:q} --data-root {params.data_root:q} "
        "--out {params.out:q} > {log:q} 2>&1"
