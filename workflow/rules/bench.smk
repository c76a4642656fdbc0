# `snakemake bench`: seconds per round of the engine, a reference-style loop and the compute floor.
# Not part of `all`: it measures the machine, not the papers. One job with every core, so that
# nothing else runs beside it; cpu always, cuda when torch sees a GPU on the node.
BENCH_ROUNDS = 3
BENCH_REPEATS = 3


rule bench:
    input:
        f"{DATA_ROOT}/fmnist/download.json",
    output:
        json="results/bench/bench.json",
        page="reports/bench.html",
    log:
        "logs/bench/bench.log",
    benchmark:
        "benchmarks/bench/bench.tsv"
    # every core (Snakemake caps threads at --cores); workflow.cores is undefined under a cluster executor
    threads: os.cpu_count() or 1
    params:
        data_root=f"{DATA_ROOT}/fmnist",
        rounds=BENCH_ROUNDS,
        repeats=BENCH_REPEATS,
    shell:
        "{FEDREPRO} bench --rounds {params.rounds} --repeats {params.repeats} --threads {threads} "
        "--data-root {params.data_root:q} --out {output.json:q} --html {output.page:q} > {log:q} 2>&1"
