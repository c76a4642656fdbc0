"""The verification matrix: generated from evidence/ alone, docs/verification.md holds exactly its output and
README.md exactly its summary per paper, and it counts, per paper table, the cells the paper-protocol evidence
reproduces within the allowed gap."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from fedrepro.configure.paramsfile import ROOT
from fedrepro.report import cites, matrix_text, verification

# A two-column table: cells match runs by algorithm; alpha selects the row.
TABLE = {
    "tables": {
        "toy_table1": {
            "paper": "toy",
            "title": "Toy Table 1",
            "metric": {"kind": "mean_last_rounds", "rounds": 10, "scale": 100},
            "columns": [
                {"label": "FedAvg", "match": {"algorithm": "fedavg"}},
                {"label": "FedLAW", "match": {"algorithm": "fedlaw"}},
            ],
            "rows": [
                {
                    "label": "FMNIST a=0.1",
                    "match": {"dataset": "fmnist", "partition.alpha": 0.1},
                    "values": [{"mean": 80.0, "std": 1.0}, 85.0],
                },
                {
                    "label": "CIFAR a=0.1",
                    "match": {"dataset": "cifar10", "partition.alpha": 0.1},
                    "values": [60.0, None],
                },
            ],
        }
    }
}


def _run(
    folder, run_id: str, algorithm: str, acc: float, status: str = "finished", seed: int | None = None, curve=None
) -> dict:
    out = folder / "runs" / run_id
    out.mkdir(parents=True)
    accs = np.full(12, acc) if curve is None else np.asarray(curve)
    pd.DataFrame({"round": np.arange(1, 13), "test_acc": accs}).to_csv(out / "metrics.csv", index=False)
    seed = int(run_id.rsplit("s", 1)[1]) if seed is None else seed
    setting = {"algorithm": algorithm, "plugins": [], "dataset": "fmnist", "partition": {"alpha": 0.1}, "seed": seed}
    (out / "summary.json").write_text(json.dumps({"run": run_id, "status": status, "setting": setting}))
    return {"id": run_id}


def _folder(root, name, runs, configfiles=("params/toy.yaml",), experiment="toy_table1_fmnist", kept="2026-01-01"):
    folder = root / name
    folder.mkdir(parents=True)
    declared = [_run(folder, *r) for r in runs]
    manifest = {
        "configfiles": list(configfiles),
        "experiments": {experiment: {"runs": declared}},
        "evidence": {"name": name, "kept": kept},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "paper_results.yaml"
    path.write_text(yaml.safe_dump(TABLE))
    return path


def test_counts_gaps_and_explanations_from_paper_protocol_evidence(tmp_path, results):
    root = tmp_path / "evidence"
    # FedAvg seeds 0.78, 0.80, 0.82: mean 80.00, std 2.00 -> allowed 2 sqrt(1 + 4) = 4.47, delta 0: within.
    _folder(root, "a", [("fedavg-s1", "fedavg", 0.78), ("fedavg-s2", "fedavg", 0.80)])
    # the same run kept twice counts once; fedavg-s3 comes from a second folder
    _folder(
        root,
        "b",
        [("fedavg-s2", "fedavg", 0.80), ("fedavg-s3", "fedavg", 0.82), ("fedlaw-s1", "fedlaw", 0.82)],
        kept="2026-01-02",
    )
    # an older keep of seed 1 under another id (an earlier commit): the newer keep of that seed counts
    _folder(root, "0old", [("fedavg-old-s1", "fedavg", 0.10, "finished", 1)], kept="2025-12-31")
    # official-protocol evidence never enters the matrix, nor do runs of other experiments
    _folder(
        root,
        "c",
        [("fedlaw-official-s1", "fedlaw", 0.20)],
        configfiles=("params/toy.yaml", "params/subsets/toy_official_protocol.yaml"),
    )
    _folder(root, "d", [("fedlaw-ablation-s1", "fedlaw", 0.10)], experiment="toy_switches")
    (root / verification.EXPLANATIONS).write_text(
        yaml.safe_dump(
            {
                "toy_table1": [
                    {
                        "row": "FMNIST a=0.1",
                        "column": "FedLAW",
                        "text": "a named, tested difference, at length",
                        "summary": "a named, tested difference",
                    }
                ]
            }
        )
    )

    (row,) = verification.matrix(root, results)
    assert sorted(row.seeds) == [1, 3]
    assert (row.reported, row.runnable, row.run) == (3, 2, 2)  # the CIFAR cell is not runnable; None is no cell
    assert sorted(row.seeds) == [1, 3] and row.within == 1
    # FedLAW: one seed at 82.00 against 85.00: delta -3.00 > 1.5, with its explanation
    assert row.outside == [
        {
            "row": "FMNIST a=0.1",
            "column": "FedLAW",
            "delta": pytest.approx(-3.0),
            "allowed": 1.5,
            "interval": None,
            "verdict": "no interval",
            "collapsed": [],
            "explanation": "a named, tested difference, at length",
            "summary": "a named, tested difference",
        }
    ]
    assert row.largest["column"] == "FedLAW" and row.folders == ["a", "b"]
    # FedAvg: 78, 80, 82 -> s = 2, t(0.975, 2) = 4.303: the interval ±4.97 holds the paper's 80.0
    assert (row.with_interval, row.consistent, row.noise_only) == (1, 1, 0)
    text = matrix_text.markdown([row])
    assert text.startswith("**Reproduced: 1 of the 2 cells run**")
    assert (
        "| Toy Table 1 | 3 | 2 | 2 | 1–3 | 1/2 | 1/1 | -3.00 (FMNIST a=0.1 / FedLAW): a named, tested difference | "
        "none | — | `evidence/a/`, `evidence/b/` |"
    ) in text
    # the matrix shows the summary; the list below it the whole text
    assert (
        "- toy_table1, FMNIST a=0.1 / FedLAW: -3.00 (strict ±1.50; one seed: no interval). a named, tested "
        "difference, at length"
    ) in text


def test_a_cell_outside_the_gap_without_an_explanation_says_so_and_diverged_cells_count(tmp_path, results):
    root = tmp_path / "evidence"
    _folder(root, "a", [("fedavg-s1", "fedavg", 0.90), ("fedlaw-s1", "fedlaw", 0.0, "diverged")])
    (row,) = verification.matrix(root, results)
    assert row.within == 0 and row.diverged == 1
    text = matrix_text.markdown([row])
    assert "+10.00 (strict ±1.50; one seed: no interval). unexplained" in text  # the paper's std widens nothing
    assert "FMNIST a=0.1 / FedLAW: all seeds diverged: no number. unexplained" in text
    # the cell with no number is named beside the largest gap, and in the README's summary
    assert (
        "+10.00 (FMNIST a=0.1 / FedAvg): unexplained; also no number: FMNIST a=0.1 / FedLAW (every seed diverged) |"
        in text
    )
    assert "| 0/2 (1 with no number: every seed diverged) |" in matrix_text.glance([row])
    assert "; 1 of them with no number (every seed diverged)." in text


@pytest.mark.parametrize(
    "fedlaw_seeds, verdict",
    [
        # FedAvg 79, 80, 81: s = 1, half-width 4.303 / sqrt 3 = 2.484. FedLAW 74, 78, 82: s = 4, half-width 9.937;
        # the table's median half-width (2.484 + 9.937) / 2 = 6.21 < |78 - 85| = 7 < 9.937: inside only through
        # our spread, counted apart from the consistent cells
        ((0.74, 0.78, 0.82), "through our spread"),
        # FedLAW 76, 78, 80: s = 2, half-width 4.969 < 7: outside the interval, no spread to blame
        ((0.76, 0.78, 0.80), "neither"),
        # FedLAW 70, 78, 86: s = 8, half-width 19.87, median 11.18 > 7: inside, as a typical cell's interval would be
        ((0.70, 0.78, 0.86), "seed noise only"),
    ],
)
def test_a_cell_consistent_only_through_our_spread_is_counted_apart(tmp_path, results, fedlaw_seeds, verdict):
    root = tmp_path / "evidence"
    _folder(
        root,
        "a",
        [("fedavg-s1", "fedavg", 0.79), ("fedavg-s2", "fedavg", 0.80), ("fedavg-s3", "fedavg", 0.81)]
        + [(f"fedlaw-s{i + 1}", "fedlaw", acc) for i, acc in enumerate(fedlaw_seeds)],
    )
    (row,) = verification.matrix(root, results)
    assert row.typical == pytest.approx(
        (4.302653 + 4.302653 * {0.74: 4, 0.76: 2, 0.70: 8}[fedlaw_seeds[0]]) / math.sqrt(3) / 2, rel=1e-5
    )
    (outside,) = row.outside
    assert outside["verdict"] == verdict
    through = verdict == "through our spread"
    consistent = 1 + (verdict != "neither")  # FedAvg, and FedLAW where inside its interval
    assert (row.with_interval, row.consistent, row.through_spread) == (2, consistent, int(through))
    text = matrix_text.markdown([row])
    shown = f"{consistent - through}/2" + (
        " (+1 only through our spread)" if through else " (1 of them only so)" if verdict == "seed noise only" else ""
    )
    assert f"| 1/2 | {shown} |" in text
    assert ("inside it only through our spread: the table's median half-width is ±6.21)" in text) is through
    assert f"| {consistent - through}/2 | {int(through)}/2 |" in matrix_text.glance([row])


def test_a_collapse_makes_a_consistent_cell_one_through_our_spread():
    """Through our spread: inside the interval, outside the strict gap, and beyond the typical half-width or
    holding a collapsed run; a reproduced cell, or one outside its interval, never is."""
    from fedrepro.report import paper

    assert paper.typical_half_width([3.0, None, 1.0, 2.0, float("nan")]) == 2.0
    assert paper.typical_half_width([1.0, 4.0]) == 2.5 and paper.typical_half_width([None]) is None
    assert paper.through_spread(-3.0, 1.5, 5.0, 4.0) is False
    assert paper.through_spread(-3.0, 1.5, 5.0, 4.0, collapsed=True) is True
    assert paper.through_spread(-4.5, 1.5, 5.0, 4.0) is True
    assert paper.through_spread(-1.0, 1.5, 5.0, 0.5, collapsed=True) is False  # reproduced
    assert paper.through_spread(-6.0, 1.5, 5.0, 4.0, collapsed=True) is False  # outside the interval
    assert paper.verdict(-3.0, 1.5, 5.0, 4.0, collapsed=True) == "through our spread"
    assert paper.verdict(-3.0, 1.5, 5.0, 4.0) == "seed noise only"


def test_the_newest_keep_of_a_seed_counts_even_where_it_diverged(tmp_path, results):
    """A seed kept again (another partition draw, another commit) counts as its newest keep: an older run
    that finished never stands in for a newer one that diverged, nor the other way round."""
    root = tmp_path / "evidence"
    _folder(
        root,
        "old",
        [("fedlaw-old-s1", "fedlaw", 0.85, "finished", 1), ("fedlaw-old-s2", "fedlaw", 0.0, "diverged", 2)],
        kept="2026-01-01",
    )
    _folder(
        root,
        "new",
        [("fedlaw-new-s1", "fedlaw", 0.0, "diverged", 1), ("fedlaw-new-s2", "fedlaw", 0.84, "finished", 2)],
        kept="2026-01-02",
    )
    (row,) = verification.matrix(root, results)
    (cell,) = [c for c in row.cells if c["column"] == "FedLAW"]
    assert (cell["seeds"], cell["diverged"], cell["ours"]) == (1, 1, pytest.approx(84.0))
    assert row.folders == ["new"]


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"row": "FMNIST a=0.1", "column": "FedLaw", "text": "a typo in the column"}, "names no cell"),
        ({"row": "FMNIST a=0.1", "column": "FedLAW", "text": "x", "summary": "two\nlines"}, "summary one line"),
    ],
)
def test_an_explanation_that_names_no_cell_is_refused_naming_the_file(tmp_path, results, entry, words):
    root = tmp_path / "evidence"
    _folder(root, "a", [("fedlaw-s1", "fedlaw", 0.82)])
    (root / verification.EXPLANATIONS).write_text(yaml.safe_dump({"toy_table1": [entry]}))
    with pytest.raises(ValueError, match=words) as error:
        verification.matrix(root, results)
    assert str(root / verification.EXPLANATIONS) in str(error.value) and "\n" not in str(error.value)


FIGURE = {
    "tables": {
        "toy_fig5": {
            "paper": "toy",
            "title": "Toy Fig. 5 (figure only)",
            "metric": {"kind": "mean_last_rounds", "rounds": 1, "scale": 100},
            "checks": [
                {
                    "text": "FedLAW beats FedAvg in every row",
                    "kind": "beats",
                    "winner": "FedLAW",
                    "loser": "FedAvg",
                    "stated": "Fig. 5",
                }
            ],
            "columns": [
                {"label": "FedAvg", "match": {"algorithm": "fedavg"}},
                {"label": "FedLAW", "match": {"algorithm": "fedlaw"}},
            ],
            "rows": [
                {"label": "FMNIST", "match": {"dataset": "fmnist"}},
                {"label": "CIFAR", "match": {"dataset": "cifar10"}},
            ],
        }
    }
}


@pytest.mark.parametrize("fedlaw_acc, holds", [(0.9, True), (0.5, False)])
def test_a_figure_only_table_is_judged_by_its_claims_on_our_runs(tmp_path, fedlaw_acc, holds):
    results = tmp_path / "paper_results.yaml"
    results.write_text(yaml.safe_dump(FIGURE))
    root = tmp_path / "evidence"
    _folder(
        root,
        "a",
        [
            ("fedavg-s1", "fedavg", 0.6),
            ("fedavg-s2", "fedavg", 0.8),
            ("fedlaw-s1", "fedlaw", fedlaw_acc),
            ("fedlaw-s2", "fedlaw", fedlaw_acc),
        ],
        experiment="toy_fig5",
    )
    (row,) = verification.matrix(root, results)
    # no paper numbers: two cells declared, the FMNIST pair offline and run at two seeds, nothing "within"
    assert row.figure_only and (row.reported, row.runnable, row.run, row.seeds) == (0, 2, 2, [2, 2])
    (check,) = row.checks
    # one comparison (FMNIST); the CIFAR row waits: mean 70 against 90 holds, against 50 does not
    assert (check.ours.holds, check.ours.total, check.pending) == (int(holds), 1, 1)
    text = matrix_text.markdown([row])
    assert (
        f"| Toy Fig. 5 (figure only) | figure | 2 | 2 | 2 | — | — | — | none | {int(holds)}/1 | `evidence/a/` |" in text
    )
    failing = "- toy_fig5: FedLAW beats FedAvg in every row: ours 0/1; the paper: stated in Fig. 5 (no numbers)"
    assert (failing in text) is not holds
    assert ("No claim check evaluated on our runs fails." in text) is holds


def test_a_collapsed_run_is_flagged_in_its_cell_and_in_the_list_of_cells_not_reproduced(tmp_path, results):
    root = tmp_path / "evidence"
    # seed 2 of FedLAW climbs to 85% and falls to 10% (chance) at round 4, then ends at 82%: a collapse
    fall = [0.5, 0.7, 0.85, 0.10, 0.6, 0.8] + [0.82] * 6
    _folder(
        root,
        "a",
        [
            ("fedavg-s1", "fedavg", 0.80),
            ("fedlaw-s1", "fedlaw", 0.82),
            ("fedlaw-s2", "fedlaw", 0.0, "finished", None, fall),
        ],
    )
    (row,) = verification.matrix(root, results)
    assert [(f["column"], f["seed"]) for f in row.collapsed] == [("FedLAW", 2)]
    (outside,) = row.outside
    assert outside["collapsed"][0]["record"]["episodes"][0]["low_round"] == 4
    text = matrix_text.markdown([row])
    assert "| ⚠ 1 runs in 1 cells |" in text
    assert "Collapsed: seed 2 to 10.00% at round 4 (best before 85.00%)." in text
    assert (
        "- toy_table1, FMNIST a=0.1 / FedLAW: seed 2 to 10.00% at round 4 (best before 85.00%). *unexplained*" in text
    )
    assert verification.unnamed_collapses([row]) == [
        "toy_table1, FMNIST a=0.1 / FedLAW, seed 2: its explanation does not name its fall to 10.00% at round 4"
    ]
    # the same cell without the fall: nothing flagged
    steady = tmp_path / "steady"
    _folder(steady, "a", [("fedavg-s1", "fedavg", 0.80), ("fedlaw-s1", "fedlaw", 0.82), ("fedlaw-s2", "fedlaw", 0.82)])
    (row,) = verification.matrix(steady, results)
    assert row.collapsed == [] and "No run of a cell collapsed." in matrix_text.markdown([row])


def test_what_chance_alone_gives_is_an_expected_count_and_the_shared_draws_are_counted():
    """19 cells with an interval, 11 outside: 0.05 x 19 = 0.95 expected; the cells rest on shared partition draws
    (here 8 cells on draws a-c, 11 on d-f: 6 draws in 2 sets), so no binomial probability is given."""
    row = verification.Row(
        "t",
        "T",
        noise=[
            {
                "n": 3,
                "sd": 1.0,
                "tolerance": 1.5,
                "consistent": i >= 11,
                "draws": ["a", "b", "c"] if i < 8 else ["d", "e", "f"],
            }
            for i in range(19)
        ],
    )
    c = verification.chance([row])
    assert (c["cells"], c["misses"]) == (19, 11) and c["expected"] == pytest.approx(0.95)
    assert (c["draws"], c["draw_sets"]) == (6, 2) and "p_at_least" not in c
    # three seeds of spread 1: P(|t(2)| > 1.5 / (1 / sqrt 3)) = P(|t(2)| > 2.598) = 0.1217 each
    assert c["strict_expected"] == pytest.approx(19 * 0.12168, rel=1e-3)
    text = matrix_text._chance_text([row])
    assert "0.95 of them would be expected outside it" in text
    assert "they rest on 6 partition draws in 2 sets" in text and "no chance of at least so many misses" in text


def test_every_collapsed_run_of_the_matrix_is_named_by_its_cells_explanation():
    assert verification.unnamed_collapses(verification.matrix()) == []


def test_every_number_the_explanations_state_is_cited_and_its_source_agrees():
    """evidence/explanations.yaml: each two-decimal number of a text or summary is among its entry's cites, and
    each cite is recomputed from the kept runs (or the paper's table, or the kept file it names)."""
    assert cites.check_cites() == []


def _explanations_with(tmp_path, entry: dict):
    root = tmp_path / "evidence"
    shutil.copytree(ROOT / "evidence", root, ignore=shutil.ignore_patterns("official_code", "gpu", "bench"))
    (root / "official_code").mkdir()
    shutil.copy(ROOT / "evidence" / "official_code" / "FACTS.md", root / "official_code" / "FACTS.md")
    (root / verification.EXPLANATIONS).write_text(yaml.safe_dump({"fedlaw_table3": [entry]}, allow_unicode=True))
    return root


@pytest.mark.parametrize(
    "text, cited, problem",
    [
        # a final accuracy one hundredth off
        (
            "FedDF ends at 72.92.",
            [
                {
                    "value": "72.92",
                    "run": "fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-s8-b84c62a854",
                }
            ],
            "states 72.92, its source gives 72.91",
        ),
        # a number the text states without a cite
        (
            "FedDF ends at 72.91 and 72.45.",
            [
                {
                    "value": "72.91",
                    "run": "fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-s8-b84c62a854",
                }
            ],
            "72.45 is stated and not cited",
        ),
        # the accuracy at a round, and the paper's number
        (
            "to 10.02% at round 23",
            [
                {
                    "value": "10.02",
                    "run": "fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-s10-4d568d9ecd",
                    "of": "round",
                    "round": 23,
                }
            ],
            "states 10.02, its source gives 10.01",
        ),
        ("paper 78.49", [{"value": "78.49", "paper": ["fedlaw_table3", "FedDF", "FMNIST α=0.1 mlp"]}], "states 78.49"),
        # a pattern naming two runs where one is meant
        (
            "72.91",
            [{"value": "72.91", "run": "fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-s8-*"}],
            "names 2 kept runs",
        ),
        # the mean of a list of runs (one draw of the switches folder), each run counted once
        (
            "a mean of 72.34",
            [
                {
                    "value": "72.34",
                    "runs": [
                        f"fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-{r}"
                        for r in ("s8-b84c62a854", "s9-65f45ea6f3", "s10-4d568d9ecd", "s8-b84c62a854")
                    ],
                }
            ],
            "states 72.34, its source gives 72.33",
        ),
    ],
)
def test_a_changed_or_uncited_number_fails_the_check(tmp_path, text, cited, problem):
    root = _explanations_with(tmp_path, {"row": "FedDF", "column": "FMNIST α=0.1 mlp", "text": text, "cites": cited})
    problems = cites.check_cites(root)
    assert len(problems) == 1 and problem in problems[0], problems
    # the same entry with the number its source gives passes
    right = {
        "row": "FedDF",
        "column": "FMNIST α=0.1 mlp",
        "text": "ends at 72.91",
        "cites": [
            {"value": "72.91", "run": "fedlaw_table3_fmnist_mlp_partition_draw/feddf-fmnist-dir0.1-mlp-s8-b84c62a854"}
        ],
    }
    assert cites.check_cites(_explanations_with(tmp_path / "ok", right)) == []


def test_the_docs_hold_the_generated_matrix_and_the_readme_its_summary():
    """`fedrepro evidence matrix --write-readme` writes the matrix into docs/verification.md and its summary per
    paper into README.md; a stale page fails here."""
    out = subprocess.run(
        [sys.executable, "-m", "fedrepro.cli", "evidence", "matrix"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    page = (ROOT / "docs" / "verification.md").read_text()
    assert matrix_text.readme_block(page) == out, "run: fedrepro evidence matrix --write-readme"
    readme = (ROOT / "README.md").read_text()
    assert matrix_text.README_START not in readme, "the whole matrix lives in docs/verification.md"
    summary = matrix_text.generated_block(readme, matrix_text.GLANCE_START, matrix_text.GLANCE_END)
    assert summary == matrix_text.glance(verification.matrix()), "run: fedrepro evidence matrix --write-readme"


def test_the_summary_counts_per_paper_the_reproduced_and_the_consistent_cells_apart():
    rows = [
        verification.Row(
            "toy_table1",
            "Toy Table 1",
            paper_key="toy",
            reported=4,
            runnable=4,
            run=3,
            seeds=[3, 3, 3],
            within=1,
            with_interval=3,
            consistent=2,
            through_spread=1,
        ),
        verification.Row("toy_fig5", "Toy Fig. 5", paper_key="toy", figure_only=True, runnable=2, run=2, seeds=[3, 3]),
        verification.Row("other_table1", "Other Table 1", paper_key="other", reported=5),
    ]
    text = matrix_text.glance(rows)
    assert (
        "| toy | 2 | 2 | 3 (+2 in figures) | 1/3 | 1/3 | 1/3 | — | [docs/papers/toy.md](docs/papers/toy.md) |" in text
    )
    assert "| other | 1 | 0 | 0 | — | — | — | — | [docs/papers/other.md](docs/papers/other.md) |" in text


def test_write_readme_rewrites_only_the_blocks_between_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{matrix_text.README_START}\nold\n{matrix_text.README_END}\nafter\n")
    matrix_text.write_readme("new\n", page)
    assert page.read_text() == f"before\n{matrix_text.README_START}\nnew\n{matrix_text.README_END}\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        matrix_text.write_block(page, "x\n", matrix_text.GLANCE_START, matrix_text.GLANCE_END)


def test_a_manifest_kept_from_before_the_switches_flag_gets_it_from_todays_params_files():
    from fedrepro.report import evidence

    manifest = {
        "configfiles": ["params/fedlaw.yaml", "params/subsets/fedlaw_protocol_switches.yaml"],
        "experiments": {"fedlaw_protocol_switches": {"runs": []}, "other": {"runs": []}},
    }
    evidence._mark_switches(manifest)
    assert manifest["experiments"] == {
        "fedlaw_protocol_switches": {"runs": [], "switches": True},
        "other": {"runs": []},
    }
    gone = {"configfiles": ["params/no_such_file.yaml"], "experiments": {"fedlaw_protocol_switches": {"runs": []}}}
    evidence._mark_switches(gone)
    assert "switches" not in gone["experiments"]["fedlaw_protocol_switches"]


def test_the_progress_the_readmes_state_is_the_evidence_folders():
    """A row of README.md, docs/verification.md or evidence/README.md that names an evidence folder and says
    "N of M so far" (or, once complete, "all M run") must say what that folder's manifest holds: progress is
    typed by hand there, so staleness fails here."""
    import re

    stated = []
    for doc, prefix in (
        (ROOT / "README.md", "evidence/"),
        (ROOT / "docs" / "verification.md", "evidence/"),
        (ROOT / "evidence" / "README.md", ""),
    ):
        for row in (line for line in doc.read_text().splitlines() if line.startswith("|")):
            progress = re.search(r"(\d+) of (\d+) so far", row) or re.search(r"all ((\d+)) run\b", row)
            folders = [f for f in re.findall(r"`" + prefix + r"([\w.]+)/`", row) if (ROOT / "evidence" / f).is_dir()]
            if progress:
                assert len(folders) == 1, f"{doc.name}: a progress row must name one evidence folder: {row[:80]}"
                kept = json.loads((ROOT / "evidence" / folders[0] / "manifest.json").read_text())["evidence"]
                stated.append((doc.name, folders[0], tuple(map(int, progress.groups()))))
                assert stated[-1][2] == (kept["runs_kept"], kept["runs_declared"]), (
                    f"{doc.name} says {folders[0]} holds {progress.group(0)}: "
                    f"it holds {kept['runs_kept']} of {kept['runs_declared']}"
                )
    assert stated, "no progress row found: the test no longer reads the READMEs"
