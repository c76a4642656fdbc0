"""The report builds from fabricated run outputs, shows the paper's numbers beside ours, and lists missing runs."""

import json
import re
import shutil

import pandas as pd
import pytest
import yaml

from conftest import fabricate
from fedrepro.configure import expansion, paramsfile, tuning
from fedrepro.configure.paramsfile import ROOT
from fedrepro.report import page, plots


@pytest.fixture
def ima_fmnist_runs():
    params = paramsfile.load_params(ROOT / "params" / "ima.yaml")
    params["only"] = "ima_table1_fmnist"
    tunings: dict = {}
    runs = expansion.expand(params, tunings)
    # the experiment's runs once its tunings chose (FedProx's and FedFA's values; which one does not matter here)
    choices = {tid: {"chosen": entry["selection"]["candidates"][1]["point"]} for tid, entry in tunings.items()}
    return params, [r for r in runs if not r.tuning] + [r for r, _ in tuning.final_runs(tunings, choices)]


def shards_run(runs, algorithm, plugins, seed):
    (run,) = [
        r
        for r in runs
        if r.setting["algorithm"] == algorithm
        and r.setting["plugins"] == plugins
        and r.setting["partition"]["kind"] == "shards"
        and r.setting["seed"] == seed
    ]
    return run


def test_report_puts_paper_numbers_beside_ours_and_lists_missing(tmp_path, ima_fmnist_runs):
    params, runs = ima_fmnist_runs
    runs_dir = tmp_path / "runs"
    # FedAvg FMA on #C=2: seeds at 0.80 and 0.82 -> ours 81.00 ± 1.41 against the paper's 81.17 (Δ -0.17)
    fabricate(shards_run(runs, "fedavg", [], 1), runs_dir, 0.80)
    fabricate(shards_run(runs, "fedavg", [], 2), runs_dir, 0.82)
    # FedAvg +IMA: one seed at 0.90 -> 90.00 against 84.68 (Δ +5.32, outside tolerance), and IMA beats FMA
    fabricate(shards_run(runs, "fedavg", ["ima"], 1), runs_dir, 0.90)
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    out = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "reports" / "ima.html")
    html = out.read_text()

    assert "IMA Table 1" in html
    # ours emphasised; the strict gap is 1.5 whatever our spread; two seeds: the 95% t interval is
    # t(0.975, 1) x 1.41 / sqrt(2) = 12.71
    fedavg_cell = (
        '<td class="ok"><b class="ours">81.00</b> ± 1.41 <span class="muted">(n=2)</span>'
        "<small>paper 81.17</small><small>Δ -0.17 (strict ±1.50; 95% t ±12.71)</small></td>"
    )
    assert fedavg_cell in html, "the FedAvg #C=2 FMA cell: ours 81.00 ± 1.41 over 2 seeds, paper 81.17, Δ -0.17"
    assert (
        '<td class="off"><b class="ours">90.00</b> <span class="muted">(n=1)</span><small>paper 84.68</small>'
        "<small>Δ +5.32 (strict ±1.50)</small></td>"
    ) in html
    # 95 comparisons lack a cell of ours: 15 of them in this experiment's scope (not run yet), 80 need
    # CIFAR/other cells that this params file (only=ima_table1_fmnist) never runs
    # beside ours, the paper's own numbers on the one comparison ours makes (1/1)
    assert (
        '<td>+IMA beats FMA (per method and setting)</td><td>96/96</td><td class="ok">1/1</td><td>1/1</td>'
        '<td class="ok">1/1</td><td>15 <small>(+80 outside this params file)</small></td>'
    ) in html
    assert (
        "1/2 cells run so far are reproduced (|Δ| ≤ 1.5 points). Separately, 1/1 with two or more seeds are "
        "consistent within seed noise"
    ) in html
    # the other cells and runs of the experiment are reported as missing, not dropped
    assert html.count('class="none"') > 0
    n_missing = len(expansion.unique_runs(runs)) - 3
    assert f"missing runs ({n_missing})" in html


def test_report_without_any_finished_run_still_builds(tmp_path, ima_fmnist_runs):
    params, runs = ima_fmnist_runs
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, tmp_path / "runs", tmp_path / "partitions", tmp_path / "r.html").read_text()
    assert "0/" in html and "0/0 cells run so far are reproduced" in html
    # nothing has run: no empty provenance rows for commits, machines, versions or time
    provenance = html[html.index('id="provenance"') :]
    assert "params hash" in provenance
    assert not any(row in provenance for row in ("git commit", "machine(s)", "package versions", "training time"))
    assert not re.search(r"<td>[^<]*</td><td>\s*</td>", provenance), "a provenance row without a value"


def test_partial_grid_report_straight_from_params_files(tmp_path, ima_fmnist_runs):
    """`fedrepro report --configfile paper.yaml subset.yaml` reports whatever exists and lists the rest."""
    from fedrepro import cli

    params, runs = ima_fmnist_runs
    subset = tmp_path / "subset.yaml"
    subset.write_text("only: ima_table1_fmnist\nexperiments:\n  ima_table1_fmnist:\n    grid:\n      seed: [1]\n")
    run = shards_run(runs, "fedavg", [], 1)
    fabricate(run, tmp_path / "runs", 0.81)
    out = tmp_path / "reports" / "subset.html"
    cli.main(
        [
            "report",
            "--configfile",
            str(ROOT / "params" / "ima.yaml"),
            str(subset),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--partitions-dir",
            str(tmp_path / "partitions"),
            "--out",
            str(out),
        ]
    )
    html = out.read_text()
    n_seed1 = len({r.id for r in runs if r.setting["seed"] == 1})
    assert f"1/{n_seed1} runs done" in html and f"missing runs ({n_seed1 - 1})" in html
    assert '<b class="ours">81.00</b> <span class="muted">(n=1)</span><small>paper 81.17</small>' in html
    # FedAvg's other cells of the subset's scope (seed 1, FMNIST) are pending; Table 1's CIFAR cells are not
    # this subset's to run, and are marked so, not "not run yet"
    table1 = html[html.index('id="ima_table1"') : html.index("</table>", html.index("<th></th>"))]
    assert table1.count('<td class="none">not run yet') == 31  # 32 cells in scope, 1 run
    assert table1.count('<td class="outside">outside this params file') == 160


def test_ablation_plot_for_numeric_grid_axes(tmp_path):
    """An experiment whose grid varies a number over 3+ values (IMA's window P) gets an ablation plot;
    one that varies only methods and splits does not."""
    params = paramsfile.load_params(ROOT / "params" / "ima.yaml")
    params["only"] = "ima_fig7b_window,ima_table1_fmnist"
    runs = expansion.expand(params)
    for run in runs:
        if run.experiment == "ima_fig7b_window" and run.setting["seed"] in (1, 2):
            fabricate(run, tmp_path / "runs", 0.6 + 0.01 * run.setting["ima"]["window"])
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, tmp_path / "runs", tmp_path / "partitions", tmp_path / "r.html").read_text()
    assert 'alt="ablation plot of ima_fig7b_window"' in html
    assert 'alt="ablation plot of ima_table1_fmnist"' not in html


def test_a_diverged_run_shows_in_its_paper_cell(tmp_path, ima_fmnist_runs):
    params, runs = ima_fmnist_runs
    fabricate(shards_run(runs, "fedprox", [], 1), tmp_path / "runs", float("nan"), status="diverged")
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, tmp_path / "runs", tmp_path / "p", tmp_path / "r.html").read_text()
    assert '<td class="diverged"><b>diverged</b> (1 seed)<small>paper 79.78</small></td>' in html
    # run, and outside the gap: the verification matrix counts it so too
    assert "0/1 cells run so far are reproduced (|Δ| ≤ 1.5 points); 1 diverged at every seed." in html


def test_index_counts_every_experiments_runs_by_state(tmp_path):
    from fedrepro.report import index

    params = {
        "title": "two experiments",
        "experiments": {
            "first": {
                "base": {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "rounds": 2},
                "grid": {"algorithm": ["fedavg", "fedprox"], "seed": [1, 2]},
            },
            "second": {
                "base": {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "rounds": 2},
                "grid": {"algorithm": ["fedavg"], "seed": [3]},
            },
        },
    }
    path = tmp_path / "params" / "two.yaml"
    path.parent.mkdir()
    path.write_text(json.dumps(params))
    runs = expansion.expand(paramsfile.load_params(path))
    first = [r for r in runs if r.experiment == "first"]
    runs_dir = tmp_path / "results" / "runs"
    fabricate(first[0], runs_dir, 0.8)
    fabricate(first[1], runs_dir, 0.1, status="diverged")
    (runs_dir / first[2].id).mkdir()
    (runs_dir / first[2].id / "checkpoint.pt").write_bytes(b"")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "two_subset.html").write_text("a partial report")

    (runs_dir / "fedavg-of-older-code-0123456789").mkdir()
    broken = tmp_path / "params" / "broken.yaml"
    broken.write_text(json.dumps({"experiments": {"x": {"base": {"dataset": "fmnist", "rounds": -1}}}}))
    out = index.build(reports / "index.html", [path, broken], runs_dir)
    survey = index.survey(path, runs_dir, reports)
    by_name = {e["name"]: e for e in survey["experiments"]}
    assert by_name["first"] | {"title": None} == {
        "name": "first",
        "title": None,
        "runs": 4,
        "done": 1,
        "diverged": 1,
        "interrupted": 1,
        "missing": 1,
        "state": "partial",
    }
    assert by_name["second"]["state"] == "missing" and by_name["second"]["missing"] == 1
    assert (survey["runs"], survey["done"], survey["missing"]) == (5, 1, 2)
    assert survey["report"] is None and "fedrepro report --configfile" in survey["report_command"]
    html = out.read_text()
    assert '<a href="two_subset.html">' in html, "reports of subsets are linked"
    assert "This params file does not validate" in html and "rounds" in html, "a broken file is shown, not fatal"
    assert "1 run folder in" in html and "<code>fedavg-of-older-code-0123456789</code>" in html
    assert re.search(r'<td class="partial">partial</td>\s*<td>4</td><td>1</td><td>1</td><td>1</td><td>1</td>', html)
    shutil.rmtree(runs_dir / first[2].id)
    for run in first[2:]:
        fabricate(run, runs_dir, 0.7)
    (reports / "two.html").write_text("the report")
    done = index.survey(path, runs_dir, reports)
    assert [e["state"] for e in done["experiments"]] == ["done", "missing"] and done["report"] == "two.html"


def test_two_verdicts_the_strict_gap_and_the_seed_noise_interval_never_merge():
    """Reproduced: |Δ| <= 1.5 whatever our spread. Consistent within seed noise: the paper's value inside the 95%
    t interval of our mean (and of the difference of means where the paper prints a std). Hand-computed:
    seeds 62, 64 -> mean 63, s sqrt(2), t(0.975, 1) = 12.706: half width 12.706, so Δ +2.32 is noise only;
    seeds 62.0, 62.2, 62.4 -> s 0.2, t(0.975, 2) = 4.303: half width 4.303 x 0.2 / sqrt(3) = 0.497, so Δ +1.52
    is neither. The interval agrees with scipy's own t tests: inside exactly when p >= 0.05."""
    from scipy import stats

    from fedrepro.report import paper

    cells = [
        paper.Cell("t", "p", "FedAvg", "a", {}, {}, 60.68, None, ours=[62.0, 64.0]),
        paper.Cell("t", "p", "FedAvg", "b", {}, {}, 60.68, None, ours=[62.0, 62.2, 62.4]),
        paper.Cell("t", "p", "FedAvg", "c", {}, {}, 60.68, None, ours=[62.5]),
        paper.Cell("t", "p", "FedAvg", "d", {}, {}, 60.68, None, ours=[61.5, 61.9]),
        paper.Cell("t", "p", "FedAvg", "e", {}, {}, 60.68, 1.05, ours=[62.0, 64.0]),
    ]
    frame = paper.table_frame(cells, "t", tolerance=1.5, paper_seeds=3).set_index("column")
    assert frame.loc["a", "interval"] == pytest.approx(12.706, abs=1e-3)
    assert list(frame["allowed"]) == [1.5] * 5  # our spread never widens the strict gap
    assert frame.loc["b", "interval"] == pytest.approx(0.4969, abs=1e-4)
    assert list(frame["verdict"]) == ["seed noise only", "neither", "no interval", "reproduced", "seed noise only"]
    assert list(frame["within"]) == [False, False, False, True, False]
    assert frame.loc["c", "consistent"] is None or pd.isna(frame.loc["c", "consistent"])
    # one sample against the paper's value; Welch's two samples where the paper prints a std (3 seeds)
    for column, values in (("a", [62.0, 64.0]), ("b", [62.0, 62.2, 62.4]), ("d", [61.5, 61.9])):
        p = stats.ttest_1samp(values, 60.68).pvalue
        assert bool(frame.loc[column, "consistent"]) == (p >= 0.05), column
    welch = stats.ttest_ind_from_stats(63.0, 2**0.5, 2, 60.68, 1.05, 3, equal_var=False).pvalue
    assert bool(frame.loc["e", "consistent"]) == (welch >= 0.05)
    # the Welch interval is the difference's, not our mean's alone
    assert frame.loc["e", "interval"] != pytest.approx(frame.loc["a", "interval"])


def test_short_labels_drop_what_every_line_shares():
    short, common = plots.short_labels(
        ["fedavg · dir0.1 · client.lr=0.01", "fedlaw · dir0.1 · client.lr=0.01", "fednova · dir0.1 · client.lr=0.01"]
    )
    assert short == {
        "fedavg · dir0.1 · client.lr=0.01": "fedavg",
        "fedlaw · dir0.1 · client.lr=0.01": "fedlaw",
        "fednova · dir0.1 · client.lr=0.01": "fednova",
    }
    assert common == ["dir0.1", "client.lr=0.01"]
    assert plots.short_labels(["fedavg · a"]) == ({"fedavg · a": "fedavg · a"}, [])
    assert "95%" not in plots.band_text(2) and "lowest to highest" in plots.band_text(2)
    assert plots.band_text(1) == "one seed per line, no band"


def _two_method_params(tmp_path):
    params = {
        "title": "two methods",
        "experiments": {
            "pair": {
                "base": {
                    "dataset": "fmnist",
                    "model": "mlp",
                    "num_clients": 4,
                    "rounds": 12,
                    "partition": {"kind": "shards", "classes_per_client": 2},
                },
                "grid": {"algorithm": ["fedavg", "fednova", "fedprox"], "seed": [1, 2]},
            }
        },
    }
    path = tmp_path / "two.yaml"
    path.write_text(json.dumps(params))
    return path


def test_methods_that_coincide_are_named_not_hidden(tmp_path):
    """FedNova's curves equal FedAvg's in every seed (same number of steps everywhere): the page says so
    and marks the row; FedProx, a different curve, is not named."""
    path = _two_method_params(tmp_path)
    params = paramsfile.load_params(path)
    runs = expansion.expand(params)
    for run in runs:
        fabricate(run, tmp_path / "runs", {"fedavg": 0.7, "fednova": 0.7, "fedprox": 0.6}[run.setting["algorithm"]])
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(expansion.manifest(params, runs, "two")))
    html = page.build(manifest, tmp_path / "runs", tmp_path / "p", tmp_path / "r.html").read_text()
    assert (
        '<p class="note">fednova coincides with fedavg: the same test accuracy (within 0.2 points) in every '
        "round of every seed"
    ) in html and "FedNova normalises each client&#39;s update" in html
    assert '<td>fednova <small class="muted">(= fedavg, identical curves)</small></td>' in html
    assert "fedprox coincides" not in html and "coincides with fedprox" not in html
    assert "{&#39;" not in html and "{'" not in html, "no Python dict repr on the page"
    assert "<code>algorithm</code> = fedavg, fednova, fedprox" in html


def test_evidence_rebuilds_the_same_page_without_results(tmp_path):
    """keep the compact records, delete results/, rebuild from evidence/ alone: the same numbers."""
    from fedrepro import cli

    path = _two_method_params(tmp_path)
    runs = expansion.expand(paramsfile.load_params(path))
    results = tmp_path / "results"
    for i, run in enumerate(runs[:4]):  # two runs are left missing: the page must still list them
        fabricate(run, results / "runs", 0.5 + 0.05 * i)
        (results / "runs" / run.id / "model.pt").write_bytes(b"weights")
    cli.main(
        [
            "report",
            "--configfile",
            str(path),
            "--runs-dir",
            str(results / "runs"),
            "--partitions-dir",
            str(results / "partitions"),
            "--out",
            str(tmp_path / "before.html"),
        ]
    )
    cli.main(
        [
            "evidence",
            "keep",
            "--configfile",
            str(path),
            "--name",
            "two",
            "--runs-dir",
            str(results / "runs"),
            "--partitions-dir",
            str(results / "partitions"),
            "--root",
            str(tmp_path / "evidence"),
        ]
    )
    kept = tmp_path / "evidence" / "two"
    assert sorted(p.name for p in (kept / "runs").iterdir()) == sorted(r.id for r in runs[:4])
    assert {p.name for p in kept.rglob("*") if p.is_file()} == {
        "manifest.json",
        "0_two.yaml",
        "summary.json",
        "metrics.csv",
    }, "no model, no checkpoint"
    shutil.rmtree(results)
    cli.main(["evidence", "report", str(kept), "--out", str(tmp_path / "after.html")])
    numbers = lambda page: re.findall(r"<td>(\d+\.\d\d(?: ± \d+\.\d\d)?|\d+/\d+)</td>", page)
    before, after = (tmp_path / "before.html").read_text(), (tmp_path / "after.html").read_text()
    assert numbers(before) and numbers(after) == numbers(before)
    assert "4/6 runs done" in after and "missing runs (2)" in after
    assert "evidence folder two: 4 of 6 runs kept" in after


def test_evidence_keep_leaves_a_folder_that_holds_the_same_records_untouched(tmp_path, capsys):
    """Keeping every folder again after some runs finish must rewrite only the folders whose records changed:
    a keep that differs from the folder only in when and by which command it ran leaves the folder as it is."""
    from fedrepro import cli

    path = _two_method_params(tmp_path)
    runs = expansion.expand(paramsfile.load_params(path))
    results = tmp_path / "results"
    for i, run in enumerate(runs[:3]):
        fabricate(run, results / "runs", 0.5 + 0.05 * i)
    keep = [
        "evidence",
        "keep",
        "--configfile",
        str(path),
        "--name",
        "two",
        "--runs-dir",
        str(results / "runs"),
        "--partitions-dir",
        str(results / "partitions"),
        "--root",
        str(tmp_path / "ev"),
    ]
    cli.main(keep)
    folder = tmp_path / "ev" / "two"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["evidence"]["kept"] = "2000-01-01T00:00:00+00:00"  # an earlier keep, by other words
    manifest["evidence"]["kept_by"] = manifest["command"] = "fedrepro evidence keep --manifest elsewhere.json"
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    before = (folder / "manifest.json").read_bytes()
    capsys.readouterr()
    cli.main(keep)
    assert (folder / "manifest.json").read_bytes() == before
    assert "unchanged" in capsys.readouterr().out
    fabricate(runs[3], results / "runs", 0.8)  # one more run finished: now the folder is rewritten
    cli.main(keep)
    assert (folder / "manifest.json").read_bytes() != before and len(list((folder / "runs").iterdir())) == 4
    assert "4 runs" in capsys.readouterr().out
    (results / "runs" / runs[3].id / "metrics.csv").write_text("round,test_acc\n1,0.1\n")  # a record changed
    cli.main(keep)
    assert (folder / "runs" / runs[3].id / "metrics.csv").read_text() == "round,test_acc\n1,0.1\n"


def test_evidence_keeps_the_runs_a_manifest_names_when_they_ran_with_earlier_code(tmp_path, capsys):
    """A run's id hashes the code it ran: runs of an earlier commit are kept by the manifest written when
    they ran (results/manifests/), not by today's expansion, which names other ids."""
    import dataclasses

    from fedrepro import cli

    path = _two_method_params(tmp_path)
    params = paramsfile.load_params(path)
    earlier = [dataclasses.replace(r, id=r.id[:-4] + "0ld0") for r in expansion.expand(params)]  # other code, other ids
    project = tmp_path / "then"
    for i, run in enumerate(earlier[:3]):
        fabricate(run, project / "results" / "runs", 0.6 + 0.05 * i)
    (project / "params").mkdir()
    shutil.copy(path, project / "params" / path.name)
    manifest = expansion.run_manifest(params, [f"params/{path.name}"], "snakemake --configfile ...", "two")
    for exp in manifest["experiments"].values():
        for run in exp["runs"]:
            run["id"] = run["id"][:-4] + "0ld0"
    (project / "results" / "manifests").mkdir(parents=True)
    written = project / "results" / "manifests" / "two-0123456789.json"
    written.write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as exit_:  # today's ids find none of them
        cli.main(
            [
                "evidence",
                "keep",
                "--configfile",
                str(path),
                "--name",
                "two",
                "--root",
                str(tmp_path / "ev"),
                "--runs-dir",
                str(project / "results" / "runs"),
            ]
        )
    assert exit_.value.code == 2 and "nothing to keep" in capsys.readouterr().err
    cli.main(
        [
            "evidence",
            "keep",
            "--manifest",
            str(written),
            "--name",
            "two",
            "--root",
            str(tmp_path / "ev"),
            "--runs-dir",
            str(project / "results" / "runs"),
            "--partitions-dir",
            str(project / "results" / "partitions"),
        ]
    )
    kept = tmp_path / "ev" / "two"
    assert sorted(p.name for p in (kept / "runs").iterdir()) == sorted(r.id for r in earlier[:3])
    assert (kept / "params" / f"0_{path.name}").is_file()
    cli.main(["evidence", "report", str(kept), "--out", str(tmp_path / "page.html")])
    page = (tmp_path / "page.html").read_text()
    assert "3/6 runs done" in page and "62.50 ± 3.54" in page and "70.00" in page


def test_switch_experiments_show_each_switchs_effect_per_method(tmp_path):
    """params/subsets/fedlaw_protocol_switches.yaml (switches: true): one row per switch, one column per
    method, the final accuracy and its difference from the method's paper-protocol run. The FedLAW proxy
    switch (two keys) shares FedAvg's row (one key); the server-epoch switch is FedLAW's alone."""
    files = [ROOT / "params" / "fedlaw.yaml", ROOT / "params" / "subsets" / "fedlaw_protocol_switches.yaml"]
    params = paramsfile.load_params_files(files)
    runs = expansion.expand(params)
    accs = {
        "fedavg": 0.80,
        "fedavg · evaluation.proxy_holdout=200": 0.81,
        "fedavg · client.keep_momentum=True": 0.78,
        "fedlaw": 0.86,
        "fedlaw · evaluation.proxy_holdout=200 · fedlaw.proxy_size=200": 0.85,
        "fedlaw · fedlaw.server_epochs=20": 0.855,
        "fedavg · evaluation.proxy_holdout=200 · client.keep_momentum=True · client.holdout=0.3": 0.79,
        "fedlaw · evaluation.proxy_holdout=200 · fedlaw.proxy_size=200 · fedlaw.server_epochs=20 · "
        "client.keep_momentum=True · client.holdout=0.3": 0.84,
    }
    runs_dir = tmp_path / "runs"
    for run in runs:
        if run.label in accs:
            fabricate(run, runs_dir, accs[run.label])
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "switches")))
    html = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "r.html").read_text()
    table = html[html.index("What each switch does") :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", table)
    seeds = r' <small class="muted">n=1</small>'  # one seed each
    cells = {label: [c.replace(seeds, "") for c in re.findall(r"<td>(.*?)</td>", rest)] for label, rest in rows}
    assert cells["none (the paper&#39;s protocol)"] == ["80.00", "86.00"]
    assert cells["evaluation.proxy_holdout=200"] == ["81.00 <small>(+1.00)</small>", "85.00 <small>(-1.00)</small>"]
    assert cells["client.keep_momentum=True"] == ["78.00 <small>(-2.00)</small>", "—"]  # FedLAW's not run yet
    assert cells["fedlaw.server_epochs=20"] == ["—", "85.50 <small>(-0.50)</small>"]
    # the official protocol's runs: every switch of the method at once, one row for both methods
    assert cells["all switches together"] == ["79.00 <small>(-1.00)</small>", "84.00 <small>(-2.00)</small>"]
    assert set(accs) <= {r.label for r in runs}, "every fabricated label is a run of the subset"


def test_switch_keys_name_the_switch_and_leave_every_other_key_to_the_method(tmp_path):
    """params/subsets/fedlaw_table3_fmnist_mlp_partition_draw.yaml (switches: [partition.seed]): the paper's
    draw per seed (the grid's first value, run) is the row that switches nothing, the shared draw (1) the
    switch; FedLAW's SWA variant is a method of its own, not a switch of FedLAW's."""
    files = [
        ROOT / "params" / "fedlaw.yaml",
        ROOT / "params" / "subsets" / "fedlaw_table3_fmnist_mlp_partition_draw.yaml",
    ]
    params = paramsfile.load_params_files(files)
    runs = [r for r in expansion.expand(params) if r.experiment == "fedlaw_table3_fmnist_draw_dir01"]
    accs = {
        ("feddyn", "run"): [0.10, None, 0.30],
        ("feddyn", 1): [0.40, 0.50, 0.60],
        ("fedlaw", "run"): [0.85, 0.86, 0.87],
        ("fedlaw", 1): [0.86, 0.86, 0.86],
        ("swa", "run"): [0.80, 0.80, 0.83],
    }
    runs_dir = tmp_path / "runs"
    for run in runs:
        method = "swa" if run.variant.get("fedlaw.variant") == "swa" else run.variant["algorithm"]
        key = (method, run.variant["partition.seed"])
        if key in accs:
            acc = accs[key][run.setting["seed"] - 8]
            fabricate(
                run, runs_dir, float("nan") if acc is None else acc, status="diverged" if acc is None else "finished"
            )
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "draws")))
    html = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "r.html").read_text()
    table = html[html.index("What each switch does") :]
    table = table[: table.index("</table>")]
    heads = re.findall(r"<th>(.*?)</th>", table)[1:]
    assert heads == ["feddyn", "fedlaw", "fedlaw · fedlaw.variant=swa · fedlaw.swa_order=gamma_first"]
    cells = {
        label: re.findall(r"<td>(.*?)</td>", rest) for label, rest in re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", table)
    }
    n = lambda seeds: f' <small class="muted">n={seeds}</small>'
    # FedDyn's diverged seed is counted apart, not averaged in
    assert cells["none (the paper&#39;s protocol)"] == [
        f"20.00{n(2)} <small>1 diverged</small>",
        f"86.00{n(3)}",
        f"81.00{n(3)}",
    ]
    assert cells["partition.seed=1"] == [
        f"50.00 <small>(+30.00)</small>{n(3)}",
        f"86.00 <small>(+0.00)</small>{n(3)}",
        "—",
    ]
    assert len(cells) == 2


# --------------------------------------------------------------------------- exported tables


def _page_cells(html: str, table: str, marked: set | None = None) -> dict:
    """(row, column) -> (ours, ours std or None, paper) of the cells of ours on the report page; ``marked``
    collects the (row, column, side) cells the page marks as the best."""
    section = html[html.index(f'<h2 id="{table}">') :]
    section = section[: section.index("</table></div>")]
    columns = re.findall(r"<th>([^<]*)</th>", section[section.index('<table class="cells">') :])[1:]
    cells = {}
    for row in re.findall(r"<tr><td>([^<]*)</td>\n(.*?)</tr>", section, flags=re.S):
        label, tds = row
        for column, td in zip(columns, re.findall(r"<td[^>]*>.*?</td>", tds)):
            ours = re.search(
                r'<b class="ours( best)?"[^>]*>([\d.]+)</b>(?: ± ([\d.]+))?.*?'
                r'<small( class="best")?[^>]*>paper ([\d.]+)',
                td,
            )
            if ours:
                cells[(label, column)] = (ours[2], ours[3], ours[5])
            paper = re.search(r'<small class="best"[^>]*>paper ', td)
            for side, best in (("ours", ours and ours[1]), ("paper", paper)):
                if best and marked is not None:
                    marked.add((label, column, side))
    return cells


def _latex_cells(tex: str):
    """The same from a LaTeX export, and the (row, column, side) cells set in bold."""
    from fedrepro.report.tables import latex_text

    lines = tex.splitlines()
    head = lines[lines.index(r"\toprule") + 1]
    columns = [c.strip() for c in head.removesuffix(r" \\").split(" & ")[1:]]
    body = lines[lines.index(r"\midrule") + 1 : lines.index(r"\bottomrule")]
    number = r"\$(\\mathbf\{)?([\d.]+)(?: \\pm ([\d.]+))?\}?\$"
    cells, bold = {}, set()
    for line in body:
        label, *texts = line.removesuffix(r" \\").split(" & ")
        for column, text in zip(columns, texts):
            found = re.fullmatch(rf"{number} \({number}\)", text)
            if found:
                cells[(label, column)] = (found[2], found[3], found[5])
                bold |= {(label, column, side) for side, mark in (("ours", found[1]), ("paper", found[4])) if mark}
            elif text.startswith("--") and re.search(number, text) and "mathbf" in text:
                bold.add((label, column, "paper"))
    return cells, bold, latex_text


def test_every_paper_table_is_exported_as_latex_csv_and_markdown_with_the_pages_numbers(tmp_path, ima_fmnist_runs):
    """Beside the page, each paper-vs-ours table as LaTeX (booktabs; mean ± std over seeds, the paper's value,
    the best bold), CSV and Markdown, linked from the page; the numbers are the page's (both parsed)."""
    from fedrepro import cli

    params, runs = ima_fmnist_runs
    runs_dir = tmp_path / "runs"
    fabricate(shards_run(runs, "fedavg", [], 1), runs_dir, 0.80)
    fabricate(shards_run(runs, "fedavg", [], 2), runs_dir, 0.82)
    fabricate(shards_run(runs, "fedprox", [], 1), runs_dir, 0.86)  # the best of ours on the #C=2 FMA row
    fabricate(shards_run(runs, "fedavg", ["ima"], 1), runs_dir, 0.90)
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "reports" / "ima.html").read_text()
    folder = tmp_path / "reports" / "ima_tables"
    assert sorted(p.name for p in folder.iterdir()) == ["ima_table1.csv", "ima_table1.md", "ima_table1.tex"]
    for suffix in ("tex", "csv", "md"):
        assert f'href="ima_tables/ima_table1.{suffix}"' in html, "the page links each export"

    tex = (folder / "ima_table1.tex").read_text()
    latex, bold, latex_text = _latex_cells(tex)
    marked = set()
    on_page = {(latex_text(r), latex_text(c)): v for (r, c), v in _page_cells(html, "ima_table1", marked).items()}
    assert len(on_page) == 3 and latex == on_page
    assert {(latex_text(r), latex_text(c), side) for r, c, side in marked} == bold, "the page marks the export's bests"
    row, paper_row = (
        latex_text("FMNIST (CNN) #C=2, FMA"),
        page.paper_comparisons(json.loads(manifest_path.read_text()), runs_dir)[0]["rows"][0],
    )
    assert latex[(row, "FedAvg")] == ("81.00", "1.41", "81.17"), "mean ± std over the two seeds, then the paper's"
    # IMA Table 1 has its methods as columns: the best of each row is bold, ours and the paper's apart
    assert (row, "FedProx", "ours") in bold and (row, "FedAvg", "ours") not in bold
    best_paper = max((c["paper"], col) for c, col in zip(paper_row["cells"], tables_columns(tex)) if c["paper"])[1]
    assert (row, best_paper, "paper") in bold
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex

    frame = pd.read_csv(folder / "ima_table1.csv")
    fedavg = frame[(frame["row"] == "FMNIST (CNN) #C=2, FMA") & (frame["column"] == "FedAvg")].iloc[0]
    assert f"{fedavg['ours']:.2f}" == "81.00" and f"{fedavg['ours_std']:.2f}" == "1.41" and fedavg["seeds"] == 2
    assert frame["ours"].notna().sum() == 3 and frame["best_ours"].sum() == 1
    md = (folder / "ima_table1.md").read_text()
    assert "| FMNIST (CNN) #C=2, FMA | 81.00 ± 1.41 (81.17) | **86.00** (" in md

    # `fedrepro tables` prints the same files' content
    import contextlib
    import io

    for fmt, suffix in (("latex", "tex"), ("csv", "csv"), ("md", "md")):
        argv = ["tables", "--manifest", str(manifest_path), "--runs-dir", str(runs_dir), "--format", fmt]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(argv)
        assert out.getvalue() == (folder / f"ima_table1.{suffix}").read_text(), fmt


def tables_columns(tex: str) -> list[str]:
    lines = tex.splitlines()
    return [c.strip() for c in lines[lines.index(r"\toprule") + 1].removesuffix(r" \\").split(" & ")[1:]]


def _latex_is_installed() -> str | None:
    """Why LaTeX cannot be tested here, or None (Debian: texlive-latex-base, booktabs in -recommended)."""
    import shutil
    import subprocess

    if not shutil.which("pdflatex"):
        return "pdflatex is not installed (Debian: apt-get install texlive-latex-base texlive-latex-recommended)"
    found = subprocess.run(["kpsewhich", "booktabs.sty"], capture_output=True, text=True)
    if not found.stdout.strip():
        return "booktabs.sty is not installed (Debian: apt-get install texlive-latex-recommended)"
    return None


@pytest.mark.skipif(_latex_is_installed() is not None, reason=str(_latex_is_installed()))
def test_every_shipped_paper_table_compiles_with_latex(tmp_path):
    """Every table of params/paper_results.yaml (their labels' #, %, α, γ, ×, ±), bold cells included."""
    import subprocess

    from fedrepro.report import paper, tables

    results = paper.load_results()
    names = set(results) | {e for table in results.values() for e in table.get("experiments", [])}
    manifest = {"experiments": {name: {"runs": []} for name in names}}
    comparisons = page.paper_comparisons(manifest, tmp_path / "runs")
    assert len(comparisons) == len(paper.load_results())
    body = tables.render(comparisons, "latex")
    assert r"\mathbf{" in body, "the papers' best numbers are bold"
    (tmp_path / "tables.tex").write_text(body)
    (tmp_path / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage[margin=5mm,"
        "landscape]{geometry}\n\\begin{document}\n\\tiny\n\\input{tables.tex}\n"
        "\\end{document}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000
    assert "Missing character" not in (tmp_path / "doc.log").read_text(errors="replace")


def test_a_loss_table_bolds_the_lowest_and_an_accuracy_table_the_highest():
    """FedNova Fig. 5 is a loss (``better: lower``): in each setting the lower of FedAvg and FedNova is the best."""

    def rows():
        return [
            {"label": "E=5", "cells": [{"ours": 0.38, "paper": None}, {"ours": 0.27, "paper": None}]},
            {"label": "C=0.3", "cells": [{"ours": 0.33, "paper": None}, {"ours": 0.25, "paper": None}]},
        ]

    fig5 = yaml.safe_load((ROOT / "params" / "paper_results.yaml").read_text())["tables"]["fednova_fig5"]
    loss = rows()
    page.mark_best(loss, fig5["best_among"], [page.lower_is_better(fig5, fig5["metric"])] * 2)
    assert [[c["best_ours"] for c in r["cells"]] for r in loss] == [[False, True], [False, True]]
    accuracy = rows()
    page.mark_best(accuracy, "columns", [page.lower_is_better({}, {"kind": "mean_last_rounds"})] * 2)
    assert [[c["best_ours"] for c in r["cells"]] for r in accuracy] == [[True, False], [True, False]]
    assert page.lower_is_better({}, {"kind": "rounds_to_target"})


def test_evidence_carries_equal_runs_from_an_earlier_keep_and_nothing_else(tmp_path):
    """Runs kept by an earlier commit complete a later keep when their setting (resolved by today's code) and
    their partition's content equal a declared run's; a run kept on another partition draw is not carried."""
    from types import SimpleNamespace

    from fedrepro import cli
    from fedrepro.report import evidence

    path = _two_method_params(tmp_path)
    params = paramsfile.load_params(path)
    runs = expansion.expand(params)
    # earlier ids (earlier code); run 5 ran on another draw of the clients
    old_partition = lambda i, r: r.partition + ("-other" if i == 5 else "-old")
    earlier = [
        SimpleNamespace(id=r.id[:-4] + "0ld0", setting=r.setting, partition=old_partition(i, r))
        for i, r in enumerate(runs)
    ]

    then = tmp_path / "then"  # the earlier keep: runs 2..5 under their old ids
    for i, run in enumerate(earlier[2:], start=2):
        fabricate(run, then / "runs", 0.5 + 0.05 * i)
        _partition_record(then / "partitions", run.partition, "other-clients" if i == 5 else "same-clients")
    _keep_as_earlier(tmp_path, params, path, runs, earlier, then)
    assert len(list((tmp_path / "ev" / "two" / "runs").iterdir())) == 4
    results = tmp_path / "results"  # today: runs 0 and 1 finished under today's ids
    for run in runs[:2]:
        fabricate(run, results / "runs", 0.9)
    _partition_record(results / "partitions", runs[0].partition, "same-clients")
    cli.main(
        [
            "evidence",
            "keep",
            "--configfile",
            str(path),
            "--name",
            "both",
            "--root",
            str(tmp_path / "ev"),
            "--runs-dir",
            str(results / "runs"),
            "--partitions-dir",
            str(results / "partitions"),
            "--carry",
            str(tmp_path / "ev" / "two"),
        ]
    )
    kept = tmp_path / "ev" / "both"
    assert sorted(p.name for p in (kept / "runs").iterdir()) == sorted(
        [r.id for r in runs[:2]] + [r.id for r in earlier[2:5]]
    )
    out = json.loads((kept / "manifest.json").read_text())
    assert out["evidence"]["runs_kept"] == 5 and sorted(out["evidence"]["carried"]) == sorted(r.id for r in runs[2:5])
    assert {c["commit"] for c in out["evidence"]["carried"].values()} == {"abc"}
    listed = [r["id"] for exp in out["experiments"].values() for r in exp["runs"]]
    assert runs[5].id in listed and earlier[5].id not in listed, "the run on another draw stays missing"
    assert set(listed) >= {r.id for r in earlier[2:5]} and "--carry" in out["evidence"]["kept_by"]
    cli.main(["evidence", "report", str(kept), "--out", str(tmp_path / "page.html")])
    assert "5/6 runs done" in (tmp_path / "page.html").read_text()
    # without a record of the earlier partitions' clients nothing can be shown equal: nothing is carried
    shutil.copytree(tmp_path / "ev" / "two", tmp_path / "ev" / "bare")
    shutil.rmtree(tmp_path / "ev" / "bare" / "partitions")
    shutil.rmtree(results / "partitions")
    with pytest.raises(evidence.EvidenceError, match="nothing to keep"):
        evidence.keep(
            [path],
            "none",
            tmp_path / "nothing",
            results / "partitions",
            tmp_path / "ev",
            carry=[tmp_path / "ev" / "bare"],
        )


def _partition_record(folder, pid, content):
    """A partition's record, as far as equal-run matching reads it: its clients' content hash."""
    (folder / pid).mkdir(parents=True, exist_ok=True)
    (folder / pid / "partition.json").write_text(json.dumps({"content_hash": content}))


def _keep_as_earlier(tmp_path, params, path, runs, earlier, then):
    """Keep the runs finished in ``then`` as evidence folder ev/two, by the manifest an earlier commit wrote:
    today's runs under their ``earlier`` ids and partitions."""
    from fedrepro.report import evidence

    manifest = expansion.run_manifest(params, [str(path)], "earlier", "two")
    for exp in manifest["experiments"].values():
        for entry in exp["runs"]:
            i = [r.id for r in runs].index(entry["id"])
            entry["id"], entry["partition"] = earlier[i].id, earlier[i].partition
    evidence.keep(None, "two", then / "runs", then / "partitions", tmp_path / "ev", manifest=_write(tmp_path, manifest))


def _write(tmp_path, manifest):
    out = tmp_path / "project" / "results" / "manifests" / "two-0.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest))
    return out


def test_evidence_compare_confirms_a_rerun_bit_for_bit_and_names_what_differs(tmp_path, capsys):
    """Runs kept by an earlier commit (other ids), rerun today: each kept run meets the rerun of equal setting
    and partition; equal records confirm (exit 0), a difference beyond the tolerance does not (exit 1)."""
    from types import SimpleNamespace

    from fedrepro import cli

    path = _two_method_params(tmp_path)
    params = paramsfile.load_params(path)
    runs = expansion.expand(params)
    earlier = [SimpleNamespace(id=r.id[:-4] + "0ld0", setting=r.setting, partition=r.partition + "-old") for r in runs]

    then, today = tmp_path / "then", tmp_path / "today"
    for i, run in enumerate(earlier[:3]):
        fabricate(run, then / "runs", 0.5 + 0.05 * i)
        _partition_record(then / "partitions", run.partition, "same-clients")
    _keep_as_earlier(tmp_path, params, path, runs, earlier, then)
    for i, run in enumerate(runs[:2]):  # the rerun: runs 0 and 1 under today's ids; run 2 not yet
        fabricate(run, today / "runs", 0.5 + 0.05 * i)
        _partition_record(today / "partitions", run.partition, "same-clients")
    compare = [
        "evidence",
        "compare",
        str(tmp_path / "ev" / "two"),
        "--configfile",
        str(path),
        "--runs-dir",
        str(today / "runs"),
        "--partitions-dir",
        str(today / "partitions"),
    ]
    with pytest.raises(SystemExit) as exit_:
        cli.main(compare)
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    assert f"{earlier[0].id}  ->  {runs[0].id}: bit for bit, 12 rounds" in out
    assert f"{earlier[2].id}: not rerun ({runs[2].id})" in out
    assert "2 of 3 kept runs rerun; 2 bit for bit, 0 beyond the tolerance 0" in out
    assert "CPU kernels not recorded -> not recorded" in out and "last bits" not in out  # equal: nothing to explain
    summary = today / "runs" / runs[1].id / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "cpu_kernels": "AVX2"}))
    metrics = today / "runs" / runs[1].id / "metrics.csv"
    table = pd.read_csv(metrics)
    table.loc[3, "train_loss"] += 1e-6  # one value of one round, in its last digits
    table.to_csv(metrics, index=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(compare)
    out = capsys.readouterr().out
    assert exit_.value.code == 1 and f"{runs[1].id}: max |Δ| 1e-06 (train_loss), 12 rounds" in out
    assert "CPU kernels not recorded -> AVX2" in out and "float32's last bits" in out  # why it may differ
    with pytest.raises(SystemExit) as exit_:
        cli.main([*compare, "--tolerance", "1e-5"])
    assert exit_.value.code == 0 and "1 bit for bit, 0 beyond the tolerance 1e-05" in capsys.readouterr().out
    (today / "partitions" / runs[0].partition / "partition.json").write_text(json.dumps({"content_hash": "other"}))
    with pytest.raises(SystemExit) as exit_:  # another draw of the clients is not the kept run's rerun
        cli.main(compare)
    out = capsys.readouterr().out
    # the runs share that partition: none is declared any more, so nothing is compared, which is a failure
    assert f"{earlier[0].id}: not declared" in out and "0 of 3 kept runs rerun" in out
    assert exit_.value.code == 2


def test_the_provenance_names_the_gpu_stack_and_the_determinism_switches(tmp_path, ima_fmnist_runs):
    params, runs = ima_fmnist_runs
    runs_dir = tmp_path / "runs"
    run = shards_run(runs, "fedavg", [], 1)
    fabricate(run, runs_dir, 0.8)
    summary = json.loads((runs_dir / run.id / "summary.json").read_text())
    summary["accelerator"] = {
        "torch": "2.15.0+cu132",
        "cuda": "13.2",
        "cudnn": 92600,
        "gpu": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2, "driver": "570.86.15"},
        "determinism": {
            "deterministic_algorithms": False,
            "cudnn_benchmark": False,
            "matmul_allow_tf32": False,
            "cudnn_allow_tf32": True,
        },
    }
    (runs_dir / run.id / "summary.json").write_text(json.dumps(summary))
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "r.html").read_text()
    provenance = html[html.index('id="provenance"') :]
    assert (
        "<td>GPU stack and determinism switches</td><td>torch 2.15.0+cu132, CUDA 13.2, cuDNN 92600, GPU NVIDIA "
        "H100 80GB HBM3 (compute 9.0), driver 570.86.15; deterministic algorithms off, TF32 cuDNN</td>"
    ) in provenance


def test_the_index_opens_with_the_verified_results_of_the_evidence(tmp_path):
    """Built from evidence/ alone: per paper table the matrix's verdicts, each cell run beside the paper's number,
    the compute, and the evidence pages (linked where built, else the command that builds them)."""
    from markupsafe import escape

    from fedrepro.report import index, verification

    reports = tmp_path / "reports"
    (reports / "evidence").mkdir(parents=True)
    (reports / "evidence" / "fedlaw_table3_fmnist_mlp.html").write_text("a page")
    out = index.build(
        reports / "index.html", [ROOT / "params" / "default.yaml"], tmp_path / "runs", evidence=ROOT / "evidence"
    )
    html = out.read_text()
    assert html.index('id="verified"') < html.index('id="runs"'), "the verified results come first"
    rows = [r for r in verification.matrix() if r.run]
    assert rows
    for row in rows:
        assert str(escape(row.title)) in html
        if not row.figure_only:  # a cell with no number (every seed diverged) is said so
            no_number = f" ({row.diverged} with no number: every seed diverged)" if row.diverged else ""
            assert f">{row.within}/{row.run}{no_number}</td>" in html
    assert html.count(">reproduced (±") == sum(r.within for r in rows)
    assert html.count(">not reproduced (±") == sum(len([o for o in r.outside if o["delta"] is not None]) for r in rows)
    # the second verdict, counted apart: the cells whose paper value lies inside our 95% t interval
    assert html.count("· inside the 95% t interval") == sum(r.consistent for r in rows)
    # the cells consistent only through our spread are counted apart, in a column of their own
    for row in rows:
        if row.with_interval:
            assert (
                f"<td>{row.consistent - row.through_spread}/{row.with_interval}</td>\n"
                f"<td>{row.through_spread}/{row.with_interval}</td>"
            ) in html
    assert html.count("<i>inside the interval only through our spread</i>") == sum(r.through_spread for r in rows)
    trained = [r for r in rows if not r.computed]  # a closed-form figure (FedNova Figs. 2, 4) trains nothing
    assert html.count("device-hours over") >= 2 * len(trained)  # the summary table and each table's section
    assert html.count("none: computed in closed form from params/fednova.yaml") == 2 * (len(rows) - len(trained))
    assert '<a href="evidence/fedlaw_table3_fmnist_mlp.html">fedlaw_table3_fmnist_mlp</a>' in html
    assert "fedrepro evidence report evidence/ima_table1_fmnist --out" in html
    # without evidence, the page is the survey of the runs alone
    bare = index.build(reports / "bare.html", [ROOT / "params" / "default.yaml"], tmp_path / "runs").read_text()
    assert 'id="verified"' not in bare and 'id="runs"' in bare


def test_each_paper_table_states_the_compute_its_runs_took_and_the_plans_estimate(tmp_path, ima_fmnist_runs):
    params, runs = ima_fmnist_runs
    runs_dir = tmp_path / "runs"
    fabricate(shards_run(runs, "fedavg", [], 1), runs_dir, 0.80)  # 1.0 s of runtime each
    fabricate(shards_run(runs, "fedavg", [], 2), runs_dir, 0.82)
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(json.dumps(expansion.manifest(params, runs, "ima")))
    html = page.build(manifest_path, runs_dir, tmp_path / "partitions", tmp_path / "r.html").read_text()
    assert re.search(
        r"<b>Compute</b> of the runs these cells count: 0\.0 device-hours over 2 runs \(CPU 0\.0 h\); "
        r"the plan(?:'|&#39;)s estimate: \d+\.\d h",
        html,
    )
