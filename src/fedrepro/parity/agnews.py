"""AGNews through both programs, where neither Pythia-70M nor AGNews is on the machine: FedAWARE's code builds its
model, tokenizer and test loader with its own ``settings.get_settings`` (unchanged; the shim maps its
``/data/pythia-70m`` to a folder built here), fedrepro with ``data.agnews.load`` and ``models.pythia``.

* **The checkpoint** (``tiny_checkpoint``) is Pythia's kind at toy size: a GPT-NeoX network (rotary on a quarter of
  each head, parallel residual, as Pythia-70M's config) with random weights, and a byte-level BPE tokenizer trained
  on the generated texts whose only special token is end-of-text, as Pythia's (no padding token).
* **The files** are the two CSV layouts: the original ``ag_news_csv`` (no header; class 1..4, title, description),
  which fedrepro reads, and the same rows under a header line, which the code's ``pd.read_csv`` needs (it takes the
  first line for column names and renames them).
* **Model**: the code's ``AutoModelForSequenceClassification`` and fedrepro's ``SequenceClassifier`` from the same
  folder, the code's new classification head copied into fedrepro's, logits on the code's own tokenised batch in
  train and eval mode (the config's dropouts are 0, as Pythia's): the same class, the same operations, bound 0.
* **Data**: per test sample, the label and the token ids the model attends to (padding stripped by the mask; the code
  pads each 1000-row ``map`` batch to its longest text, fedrepro every text to ``max_length``, and with right padding
  the classifier reads the last real token either way). The ids are compared twice: with fedrepro's text as it is,
  and with the text joined as the code joins it, which isolates the join.

Two facts of the code are recorded as they happen: its ``padding=True`` stops on a tokenizer without a padding
token (Pythia-70M's has none; the code's ``/data/pythia-70m`` must have had one, unknown which: the shim gives it
end-of-text, as fedrepro pads), and its test loader, a generator that yields once, hands over its first 1,024
samples only. Two calls of the code predate the libraries installed here, and the shim runs them as the libraries
then did: its ``torch.load`` of a pickled ``datasets.Dataset`` (before torch's ``weights_only`` default) and its
``DataFrame.drop(columns=..., axis=1)`` (pandas 3 refuses the pair)."""

from __future__ import annotations

import contextlib
import csv
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro.parity.pipeline import FEDAWARE_FEDLAB
from fedrepro.parity.shim import checkout_on_path

CODE_MODEL_PATH = "/data/pythia-70m"  # the folder the code's settings.get_settings loads
TEST_ROWS = 1100  # more than the 1,024 the code's test loader yields
CLIENT_ROWS = (7, 5)  # the code weights clients by the length of their tokenised files
MAX_LENGTH = 100
EOT = "<|endoftext|>"
WORDS = (
    "stocks oil prices rise fall Reuters AP government talks election minister team season coach win loses "
    "quarter profit shares company software Microsoft Google space NASA scientists study research climate "
    "market bank rates investors league players game final cup record week monday tuesday report said new"
).split()


def _sentence(rng, low: int, high: int) -> str:
    words = [str(rng.choice(WORDS)) for _ in range(int(rng.integers(low, high)))]
    words[0] = words[0].capitalize()
    if rng.random() < 0.3:
        words.insert(int(rng.integers(1, len(words))), f'"{rng.integers(10, 9999)},{rng.integers(0, 99)}"')
    return " ".join(words) + str(rng.choice([".", "!", "?", " (AP)", ""]))


def rows(n: int, seed: int) -> list[tuple[int, str, str]]:
    """(class 1..4, title, description); a quarter of the descriptions run past ``MAX_LENGTH`` tokens."""
    rng = np.random.default_rng(seed)
    return [
        (int(rng.integers(1, 5)), _sentence(rng, 3, 9), _sentence(rng, 5, 120 if rng.random() < 0.25 else 30))
        for _ in range(n)
    ]


def write_csv(path: Path, table: list[tuple[int, str, str]], header: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_ALL)  # the original release quotes every field
        if header:
            out.writerow(["Class Index", "Title", "Description"])
        out.writerows(table)
    return path


def tiny_checkpoint(folder: Path, texts: list[str], seed: int = 0) -> Path:
    """A Pythia-shaped checkpoint (see the module doc) in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOT, eos_token=EOT, unk_token=EOT)
    tokenizer.save_pretrained(folder)
    config = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=2 * MAX_LENGTH,
        rotary_pct=0.25,
        use_parallel_residual=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    GPTNeoXForCausalLM(config).save_pretrained(folder)
    return folder


@contextlib.contextmanager
def _code_loads(folder: Path, pad: bool):
    """The code's ``from_pretrained(CODE_MODEL_PATH)`` reads ``folder``; with ``pad`` its tokenizer pads with
    end-of-text. Its ``torch.load`` unpickles as torch did before ``weights_only`` became the default, and its
    ``DataFrame.drop(columns=..., axis=1)`` drops the columns, as pandas did before 3.0."""
    import pandas
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_load, tokenizer_load = AutoModelForSequenceClassification.from_pretrained, AutoTokenizer.from_pretrained

    def path(p):
        return str(folder) if str(p) == CODE_MODEL_PATH else p

    def tokenizer(p, *a, **k):
        t = tokenizer_load(path(p), *a, **k)
        if pad:
            t.pad_token = t.eos_token
        return t

    def drop(self, *a, columns=None, axis=None, **k):  # pandas 3 refuses axis beside columns; pandas 1 ignored it
        return (
            frame_drop(self, *a, columns=columns, **k) if columns is not None else frame_drop(self, *a, axis=axis, **k)
        )

    frame_drop = pandas.DataFrame.drop
    pandas.DataFrame.drop = drop
    AutoModelForSequenceClassification.from_pretrained = lambda p, *a, **k: model_load(path(p), *a, **k)
    AutoTokenizer.from_pretrained = tokenizer
    old = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        AutoModelForSequenceClassification.from_pretrained, AutoTokenizer.from_pretrained = model_load, tokenizer_load
        pandas.DataFrame.drop = frame_drop
        if old is None:
            os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
        else:
            os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = old


def _code_settings(checkout, work: Path, folder: Path, pad: bool):
    """``settings.get_settings`` of an AGNews run, in ``work`` (the code's relative ``datasets/`` paths)."""
    with contextlib.chdir(work), _code_loads(folder, pad), checkout_on_path(checkout, stubs=FEDAWARE_FEDLAB):
        import settings

        args = SimpleNamespace(dataset="agnews", num_clients=len(CLIENT_ROWS), partition="dirichlet", dir=0.1)
        model, _, weights = settings.get_settings(args)[:3]
        import agnews_dataset

        reloaded = list(agnews_dataset.get_AGNEWs_testloader())  # what every evaluation of the code reads
        whole = torch.load(Path("datasets/partitioned_agnews/test/data.pkl"))  # the code's whole tokenised split
    return model, weights, whole, reloaded


def _unpadded(ids, mask) -> list[list[int]]:
    return [[int(t) for t, m in zip(i, k) if m] for i, k in zip(ids, mask)]


def compare(checkout) -> list[dict]:
    """Two rows: the model (``part: model``) and the data (``part: data``) of FedAWARE's AGNews runs."""
    from fedrepro.data import agnews as ours_data
    from fedrepro.data.agnews import TokenBatch
    from fedrepro.models.pythia import pythia70m

    table = rows(TEST_ROWS, seed=0)
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-agnews-") as tmp:
        tmp = Path(tmp)
        folder = tiny_checkpoint(tmp / "checkpoint", [f"{t} {d}" for _, t, d in rows(400, seed=1)])
        write_csv(tmp / "ours" / "test.csv", table, header=False)
        write_csv(tmp / "code" / "datasets" / "agnews" / "test.csv", table, header=True)
        (tmp / "code" / "datasets" / "partitioned_agnews" / "test").mkdir(parents=True)
        (tmp / "code" / "datasets" / "partitioned_agnews" / "train").mkdir(parents=True)
        for i, n in enumerate(CLIENT_ROWS):
            torch.save(list(range(n)), tmp / "code" / "datasets" / "partitioned_agnews" / "train" / f"data{i}.pkl")
        # fedrepro's model first: the first from_pretrained of a process, made while the shim wraps torch.tensor,
        # leaves the new classification head uninitialised (transformers 5.23), and every later load is right
        mine_model = pythia70m(4, {"path": str(folder)})
        try:
            _code_settings(checkout, tmp / "code", folder, pad=False)
            without_pad = "ran"
        except ValueError as err:
            if "padding token" not in str(err):  # transformers: "Asking to pad but the tokenizer does not have ..."
                raise
            without_pad = str(err).splitlines()[0]
        code_model, weights, whole, reloaded = _code_settings(checkout, tmp / "code", folder, pad=True)
        test = whole[: len(whole)]  # column name -> list
        mine = ours_data.load("agnews", tmp / "ours", train=False, pretrained={"path": str(folder)})
        tokenizer = ours_data.load_tokenizer(str(folder))
        joined = ours_data.tokenize([t + d for _, t, d in table], tokenizer, MAX_LENGTH)  # the code's join

        code_ids = _unpadded(test["input_ids"], test["attention_mask"])
        data = {
            "part": "data",
            "dataset": "agnews",
            "samples": len(table),
            "labels_differing": int(sum(int(a) != int(b) for a, b in zip(test["label"], mine.labels))),
            "ids_differing": int(sum(a != b for a, b in zip(code_ids, _unpadded(mine.input_ids, mine.attention_mask)))),
            "ids_differing_code_join": int(sum(a != b for a, b in zip(code_ids, _unpadded(*joined)))),
            "truncated": int(sum(len(i) == MAX_LENGTH for i in code_ids)),
            "code_padded_lengths": sorted({len(i) for i in test["input_ids"]}),
            "code_without_pad_token": without_pad,
            "code_test_batches": len(reloaded),
            "code_test_samples": sum(len(b["label"]) for b in reloaded),
            "code_client_weights": [float(w) for w in weights],
        }
        data["status"] = "equal" if data["labels_differing"] == data["ids_differing"] == 0 else "differs"

        batch = torch.tensor(test["input_ids"][:16]), torch.tensor(test["attention_mask"][:16])
        mine_model.net.load_state_dict(code_model.state_dict())  # the head each side drew, and the checkpoint's
        gaps = {}
        for mode in ("train", "eval"):
            code_model.train(mode == "train")
            mine_model.train(mode == "train")
            with torch.no_grad():
                a = code_model(*batch)["logits"]  # as the code calls it (utils.agnews_evaluate)
                b = mine_model(TokenBatch(*batch))
            gaps[f"{mode}_gap"] = float((a - b).abs().max())
        params = sum(p.numel() for p in code_model.parameters()), sum(p.numel() for p in mine_model.parameters())
        model = {
            "part": "model",
            "dataset": "agnews",
            "model": "pythia70m",
            "checkpoint": f"tiny GPT-NeoX built here (hidden 32, 2 layers, 4 heads, BPE vocabulary {len(tokenizer)})",
            "params_code": params[0],
            "params_ours": params[1],
            **gaps,
        }
        model["status"] = "equal" if params[0] == params[1] and max(gaps.values()) == 0.0 else "differs"
    return [model, data]
