"""The AGNews check of the parity harness (fedrepro.parity.agnews): the tiny checkpoint it builds, the two CSV
layouts, and, where FEDREPRO_FEDAWARE_CHECKOUT names a checkout of dunzeng/FedAWARE, the check itself."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from fedrepro.parity import agnews

FEDAWARE = os.environ.get("FEDREPRO_FEDAWARE_CHECKOUT")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return agnews.tiny_checkpoint(
        tmp_path_factory.mktemp("checkpoint"), [f"{t} {d}" for _, t, d in agnews.rows(200, 1)]
    )


def test_the_tiny_checkpoint_is_pythias_kind_and_fedrepro_trains_on_it(checkpoint):
    from transformers import AutoConfig, AutoTokenizer

    from fedrepro.data.agnews import TokenBatch, load_tokenizer, tokenize
    from fedrepro.models.pythia import pythia70m

    published = AutoTokenizer.from_pretrained(str(checkpoint))
    assert published.pad_token is None and published.eos_token == agnews.EOT  # as Pythia-70M's
    config = AutoConfig.from_pretrained(str(checkpoint))
    assert config.model_type == "gpt_neox" and config.use_parallel_residual
    ids, mask = tokenize(["Oil prices rise. Reuters said", "Team wins"], load_tokenizer(str(checkpoint)), 12)
    assert (ids[1, int(mask[1].sum()) :] == published.eos_token_id).all()  # end-of-text pads, on the right
    logits = pythia70m(4, {"path": str(checkpoint)})(TokenBatch(ids, mask))
    assert logits.shape == (2, 4) and torch.isfinite(logits).all()


def test_both_csv_layouts_hold_the_same_rows(tmp_path):
    from fedrepro.data.agnews import read_split

    table = agnews.rows(30, seed=2)
    ours = read_split(agnews.write_csv(tmp_path / "ours" / "test.csv", table, header=False))
    assert list(ours["label"]) == [c - 1 for c, _, _ in table]
    assert list(ours["text"]) == [f"{t} {d}" for _, t, d in table]
    code = pd.read_csv(agnews.write_csv(tmp_path / "code" / "test.csv", table, header=True))  # as the code reads it
    assert code.values.tolist() == [list(r) for r in table]
    assert any(len(d.split()) > 100 for _, _, d in table), "some texts run past max_length"


@pytest.mark.skipif(not FEDAWARE, reason="FEDREPRO_FEDAWARE_CHECKOUT (a checkout of dunzeng/FedAWARE) is not set")
def test_fedawares_agnews_model_is_ours_and_its_tokens_differ_by_the_join_alone():
    model, data = agnews.compare(FEDAWARE)
    assert model["status"] == "equal" and model["train_gap"] == model["eval_gap"] == 0.0
    assert model["params_code"] == model["params_ours"]
    assert data["labels_differing"] == 0 and data["ids_differing_code_join"] == 0
    assert data["ids_differing"] > data["samples"] // 2  # the space at the junction
    assert data["truncated"] > 0  # max_length acts on both sides
    assert "padding token" in data["code_without_pad_token"]
    assert (data["code_test_batches"], data["code_test_samples"]) == (1, 1024)
