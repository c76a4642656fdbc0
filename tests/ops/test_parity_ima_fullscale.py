"""The IMA code at full scale (fedrepro.parity.ima_fullscale, docs/parity.md "IMA, FMNIST #C=2 at full scale"):
a run stopped and resumed gives the uninterrupted run's accuracies, losses and final model bit for bit, and +IMA
forked from the FedAvg run at t_s gives the notebook's +IMA run from round 0 bit for bit; the page's section is
the rendering of the kept record; bad command lines are refused in one line. The runs of the code need
FEDREPRO_IMA_CHECKOUT (a checkout of TailinZhou/FedIMA): the notebooks' cells at a shrunk setting on generated
Fashion-MNIST idx files (4 clients, 2 a round, 6 rounds, IMA from round 3 with a window of 2)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch

from fedrepro.parity import generated, ima_fullscale, ima_fullscale_record

IMA = os.environ.get("FEDREPRO_IMA_CHECKOUT")
needs_checkout = pytest.mark.skipif(
    not IMA, reason="FEDREPRO_IMA_CHECKOUT (a checkout of TailinZhou/FedIMA) is not set"
)
SHRUNK = {"K": 4, "r": 6, "r_ima": 3, "window_size": 2, "E": 1, "B": 10, "C": 0.5, "num_perclass": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted FedAvg and from-scratch +IMA (the notebooks' way), then each stopped and resumed, +IMA
    forked from the resumed FedAvg run's state at t_s."""
    tmp = tmp_path_factory.mktemp("ima-fullscale")
    generated.write_fmnist(tmp / "data", 120, 60)

    def run(out, part, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return ima_fullscale.run_part(IMA, tmp / out, part, overrides=SHRUNK, data=tmp / "data", **kwargs)

    torch.set_num_threads(1)
    found = {
        "fedavg": run("whole", "fedavg", every=100),
        "fedavg+ima": run("whole", "fedavg+ima", every=100, fork=False),
        "stopped fedavg": run("cut", "fedavg", every=2, stop_after=2),
    }
    found["resumed fedavg"] = run("cut", "fedavg", every=2)
    found["stopped fedavg+ima"] = run("cut", "fedavg+ima", every=2, stop_after=4)  # forked at 3, stopped at 4
    found["resumed fedavg+ima"] = run("cut", "fedavg+ima", every=2)
    found["folder"] = tmp
    return found


def _same_run(a: dict, b: dict) -> None:
    assert a["round"] == b["round"] == SHRUNK["r"]
    assert a["history"]["acc"] == b["history"]["acc"]
    assert a["history"]["loss"] == b["history"]["loss"]  # float64 sums of float32 losses: any other model shows
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@needs_checkout
def test_a_stopped_and_resumed_fedavg_run_is_the_uninterrupted_one_bit_for_bit(runs):
    assert runs["stopped fedavg"]["round"] == 2
    _same_run(runs["fedavg"], runs["resumed fedavg"])
    losses = runs["fedavg"]["history"]["loss"]
    assert len(set(losses)) > 1  # the losses move from round to round, so a round computed otherwise would show


@needs_checkout
def test_imas_branch_forked_at_ts_and_resumed_is_the_notebooks_run_from_round_0(runs):
    assert runs["stopped fedavg+ima"]["round"] == 4
    _same_run(runs["fedavg+ima"], runs["resumed fedavg+ima"])
    wa, ima = runs["fedavg"]["history"]["loss"], runs["fedavg+ima"]["history"]["loss"]
    t_s = SHRUNK["r_ima"]
    assert wa[:t_s] == ima[:t_s]  # the same computation before t_s, which the fork relies on
    assert all(a != b for a, b in zip(wa[t_s:], ima[t_s:]))  # the window average acts from t_s on


@needs_checkout
def test_the_record_names_the_code_the_setting_and_the_cost(runs):
    out = runs["folder"] / "cut"
    path = ima_fullscale_record.write_record(out, Path(IMA), ["test"])
    record = json.loads(path.read_text())
    assert record["setting"]["r"] == SHRUNK["r"] and record["setting"]["seed"] == 2023  # args.py's seed
    assert record["partition"]["partitioner"] == "fedlab/utils/dataset/partition.py"  # the checkout's own copy
    fedavg, ima = record["parts"]["fedavg"], record["parts"]["fedavg+ima"]
    assert ima["forked_at"] == SHRUNK["r_ima"] and fedavg["forked_at"] is None
    assert fedavg["final10"] == pytest.approx(sum(fedavg["accuracy"][-10:]) / len(fedavg["accuracy"][-10:]))
    cost = ima_fullscale_record.cost(record)
    assert cost["rounds_total"] == SHRUNK["r"] + SHRUNK["r"] - SHRUNK["r_ima"] and cost["rounds_left"] == 0
    assert cost["rounds_measured"] == cost["rounds_total"]  # +IMA's rounds before the fork are FedAvg's, not counted


@needs_checkout
def test_a_state_of_another_setting_is_refused(runs, tmp_path):
    import shutil

    shutil.copytree(runs["folder"] / "cut" / "fedavg", tmp_path / "fedavg")
    state = torch.load(tmp_path / "fedavg" / "checkpoint.pt", weights_only=False)
    state["round"] = 4  # resume inside the run, from a state that says the rate is another
    state["args"]["lr"] = 0.02
    torch.save(state, tmp_path / "fedavg" / "checkpoint.pt")
    with pytest.raises(ValueError, match="args.lr"), contextlib.redirect_stdout(io.StringIO()):
        with contextlib.redirect_stderr(io.StringIO()):
            ima_fullscale.run_part(IMA, tmp_path, "fedavg", overrides=SHRUNK, data=runs["folder"] / "data")


def test_the_page_section_is_the_rendering_of_the_kept_record():
    record = json.loads(ima_fullscale_record.KEPT.read_text())
    page = ima_fullscale_record.PAGE.read_text()
    assert ima_fullscale_record.section(page) == ima_fullscale_record.render(record)


def test_the_comparison_reads_the_kept_runs_and_the_papers_numbers():
    ours = ima_fullscale_record.ours()
    assert [round(v, 2) for v in ours["fedavg"]] == [79.62, 79.26, 81.55]  # docs/papers/ima.md
    assert [round(v, 2) for v in ours["fedavg+ima"]] == [84.88, 84.90, 85.01]
    assert ima_fullscale_record.paper() == {"fedavg": 81.17, "fedavg+ima": 84.68}


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--out", "x"], "--checkout"),
        (["--checkout", "/nonexistent", "--out", "x"], "--checkout /nonexistent"),
        (["--out", "/nonexistent-folder", "--keep"], "no record.json"),
    ],
)
def test_bad_command_lines_are_refused_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit):
        ima_fullscale_record.main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err


@needs_checkout
def test_an_output_folder_inside_the_checkout_is_refused(capsys):
    with pytest.raises(SystemExit):
        ima_fullscale_record.main(["--checkout", IMA, "--out", str(Path(IMA) / "runs")])
    assert "inside the checkout" in capsys.readouterr().err
