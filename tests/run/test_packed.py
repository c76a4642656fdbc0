"""Packed runs (run/packed.py) against the same runs trained alone: every method and plug-in, each run its own
seed, partition, streams and state; a diverging run stops alone; a killed pack resumes each run from its own
checkpoint.

A run of a pack trains its clients either in its own batched round (a method with client terms, a model with
dropout) or stacked with other runs' clients in one vmapped computation: the batched path's per-row computation
on more rows. Against the sequential reference a stacked round's updates agree within the bound batched and
sequential agree within (``conftest.rounding_bound``, as tests/run/test_batched.py); against the run trained alone
through the batched path, on CPU, a whole run agrees bit for bit (a vmapped CPU kernel computes a row as it does
among fewer rows), which the CUDA check measures instead of assuming on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PACKED_ROUNDS, packed_alone, packed_trainer, rounding_bound
from fedrepro.ops import gpucheck
from fedrepro.run.packed import PackedRuns


@pytest.mark.parametrize("method", ["fedavg", "fedavg+random_batch", "fedavg+random_epochs"])
def test_a_stacked_step_equals_the_sequential_path_within_the_rounding_bound(tmp_path, method):
    """One round of three runs (their own seeds, partitions and models) trained as one computation: each run's
    client updates against its own sequential reference, within tests/run/test_batched.py's derived bound."""
    datasets = gpucheck.tiny_fmnist()
    runs = [packed_trainer(method, seed, tmp_path / f"p{seed}", datasets) for seed in (1, 2, 3)]
    pack = PackedRuns(runs)
    for m in pack.members:
        m.plan = m.trainer.configure_round(0)
    pack._train_pending(pack.members)
    assert pack.stacked_rounds == 1, "the runs did not train as one computation"
    for seed, m in zip((1, 2, 3), pack.members):
        reference = packed_trainer(method, seed, tmp_path / f"s{seed}", datasets)
        reference.cohort_mode = "off"
        plain = reference.train_cohort(reference.configure_round(0))
        assert torch.equal(plain.clients, m.result.clients) and torch.equal(plain.steps, m.result.steps)
        s = reference.setting
        bound = rounding_bound(reference, int(plain.steps.max()), s["client"]["lr"], s["client"]["momentum"])
        assert plain.deltas.abs().max() > 1000 * bound
        gap = float((m.result.deltas - plain.deltas).abs().max())
        assert gap <= bound, f"seed {seed}: packed and sequential updates differ by {gap:.3e} > {bound:.3e}"


@pytest.mark.parametrize("method", gpucheck.method_names())
def test_every_method_packed_equals_alone(tmp_path, method):
    datasets = gpucheck.tiny_fmnist()
    pack = PackedRuns([packed_trainer(method, seed, tmp_path / f"pack-{seed}", datasets) for seed in (1, 2)])
    outcomes = pack.run(checkpoint_every=0)
    for seed, (trainer, outcome) in zip((1, 2), zip([m.trainer for m in pack.members], outcomes)):
        assert isinstance(outcome, dict) and outcome["status"] == "finished", outcome
        alone, summary = packed_alone(method, seed, tmp_path / f"alone-{seed}", datasets)
        # on CPU a vmapped kernel computes each row as it computes it among fewer rows: the same numbers
        assert torch.equal(trainer.model.flat, alone.model.flat), f"{method} seed {seed}: packed != alone"
        assert [r["train_loss"] for r in trainer.rows] == [r["train_loss"] for r in alone.rows]
    if not (pack.members[0].trainer.algorithm.corrections or pack.members[0].trainer.algorithm.objective):
        assert pack.stacked_rounds == PACKED_ROUNDS, "the runs did not train as one computation"


def test_a_diverging_run_stops_alone(tmp_path):
    """A run whose client lr blows it up ends 'diverged' in its first round; its pack-mates train on, each equal to
    itself trained alone."""
    datasets = gpucheck.tiny_fmnist()
    runs = [
        packed_trainer("fedavg", 1, tmp_path / "a", datasets),
        packed_trainer("fedavg", 2, tmp_path / "b", datasets, client={"lr": 1e30}),
        packed_trainer("fedavgm", 3, tmp_path / "c", datasets),
    ]
    outcomes = PackedRuns(runs).run(checkpoint_every=0)
    assert [o["status"] for o in outcomes] == ["finished", "diverged", "finished"]
    assert outcomes[1]["rounds_done"] == 1 and outcomes[0]["rounds_done"] == PACKED_ROUNDS
    for trainer, (method, seed) in ((runs[0], ("fedavg", 1)), (runs[2], ("fedavgm", 3))):
        alone, _ = packed_alone(method, seed, tmp_path / f"alone-{seed}", datasets)
        assert torch.equal(trainer.model.flat, alone.model.flat)


def test_a_killed_pack_resumes_each_run_from_its_own_checkpoint(tmp_path):
    """Stopped after round 2 (each run checkpoints, as on SIGTERM), then packed again from the same folders:
    each run resumes from its own checkpoint and ends where the uninterrupted pack ends, bit for bit."""
    datasets = gpucheck.tiny_fmnist()
    methods = [("fedavg", 1), ("scaffold", 2), ("fedavg", 3)]
    whole = PackedRuns([packed_trainer(m, s, tmp_path / f"whole-{s}", datasets) for m, s in methods])
    whole.run(checkpoint_every=0)
    first = PackedRuns([packed_trainer(m, s, tmp_path / f"cut-{s}", datasets) for m, s in methods])
    assert {o["status"] for o in first.run(checkpoint_every=0, stop_after=2)} == {"stopped"}
    again = PackedRuns([packed_trainer(m, s, tmp_path / f"cut-{s}", datasets) for m, s in methods])
    outcomes = again.run(checkpoint_every=0)
    assert all(o["status"] == "finished" and o["resumed"] for o in outcomes)
    for a, b in zip(whole.members, again.members):
        assert torch.equal(a.trainer.model.flat, b.trainer.model.flat)
        assert len(b.trainer.rows) == PACKED_ROUNDS  # the metrics rows of rounds 0-1 came back with the checkpoint
