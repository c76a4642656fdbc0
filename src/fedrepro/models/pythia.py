"""Pythia-70M (FedAWARE Table 2, AGNews): a pretrained Hugging Face model wrapped so that
``module(x)`` returns logits like every other model.

``AutoModelForSequenceClassification.from_pretrained(path, num_labels=4)``: GPT-NeoX with a linear
head on the last non-padding token, all parameters trained (FedAWARE's code). The pad token is the
tokenizer's (``data.agnews.load_tokenizer``: end-of-text pads). ``path`` is a hub id or a local
folder: on a machine without internet, point ``pretrained.path`` at a folder holding the model's
``config.json``, weights and tokenizer files, or pre-fill the Hugging Face cache and set
``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import torch
from torch import nn

# The model reads the batches and shares the tokenizer of the data it was made for.
from fedrepro.data.agnews import DEFAULT_MODEL, TokenBatch, load_tokenizer


class SequenceClassifier(nn.Module):
    """A Hugging Face sequence classifier whose ``forward(TokenBatch)`` returns logits only."""

    def __init__(self, path: str, num_labels: int):
        super().__init__()
        from transformers import AutoModelForSequenceClassification

        pad = load_tokenizer(path).pad_token_id
        # float32 explicitly: the hub's Pythia weights are stored in float16, and the flat engine
        # keeps one float32 vector
        self.net = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, pad_token_id=pad, dtype=torch.float32
        )
        self.net.config.use_cache = False
        self.train()  # from_pretrained returns eval mode; the other models start in train mode

    def forward(self, x: TokenBatch) -> torch.Tensor:
        return self.net(input_ids=x.input_ids, attention_mask=x.attention_mask, use_cache=False).logits


def pythia70m(num_classes: int, pretrained: dict | None = None) -> SequenceClassifier:
    return SequenceClassifier(dict(pretrained or {}).get("path", DEFAULT_MODEL), num_classes)


# name -> builder(shape, number of classes, pretrained): the model of pythia.yaml
BUILDERS = {"pythia70m": lambda shape, k, pretrained: pythia70m(k, pretrained)}
