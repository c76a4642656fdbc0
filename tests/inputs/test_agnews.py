"""AGNews + Pythia-70M through the real code, with no downloads: small AGNews files in both real
on-disk formats (the Hugging Face parquet and the original csv), a tiny word-level tokenizer and a
tiny randomly initialised GPT-NeoX saved with ``save_pretrained``; then tokenised device tensors,
the classifier on the flat engine, and two federated rounds end to end."""

from __future__ import annotations

import csv
import inspect
import json

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro import catalog, data, evaluation, identity, models, partitions
from fedrepro.configure import expansion, paramsfile, settings
from fedrepro.data import agnews
from fedrepro.flat import FlatModel, learnt_buffers
from fedrepro.partitions import records as partition_records
from fedrepro.run import checkpoint
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

U32, U64 = 2.0**-24, 2.0**-53  # float32's and float64's unit roundoff


def summed_inputs(module, x) -> int:
    """An operation count for float64 rounding bounds: the input elements of every leaf module a forward pass
    of ``x`` runs through, summed (one more each). No reduction sums more terms than its input holds, so the
    chain's outputs are within this count times u64 of their scale; it exceeds the real reduction lengths by
    orders of magnitude, which leaves room for what the layers amplify."""
    total = [0]

    def count(m, i, o):
        total[0] += sum(a.numel() for a in i if torch.is_tensor(a)) + 1

    hooks = [m.register_forward_hook(count) for m in module.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            module(x)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


WORDS = [
    "world",
    "sports",
    "business",
    "tech",
    "market",
    "team",
    "game",
    "stocks",
    "chip",
    "war",
    "talks",
    "wins",
    "rises",
    "falls",
    "new",
    "the",
    "a",
    "of",
    "in",
    "reuters",
    "ap",
    "-",
]
TOPIC = {0: "war talks world", 1: "team wins game sports", 2: "stocks rises market business", 3: "new chip tech"}
TRAIN_ROWS, TEST_ROWS = 40, 8


def articles(n: int, seed: int):
    """Balanced labels (as AGNews is), titles and descriptions of varied length."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = i % 4
        title = TOPIC[label]
        extra = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 20))))
        rows.append((label, title, f"reuters - {extra}"))
    return rows


def write_parquet(folder, split, rows):
    import datasets

    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["World", "Sports", "Business", "Sci/Tech"]),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"text": [f"{t} {d}" for _, t, d in rows], "label": [l for l, _, _ in rows]}, features=features
    )
    ds.to_parquet(str(folder / agnews.FILES["parquet"][split]))


def write_csv(folder, split, rows):
    # the original release: no header, every field quoted, class index 1..4
    with open(folder / agnews.FILES["csv"][split], "w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for label, title, desc in rows:
            writer.writerow([label + 1, title, desc])


@pytest.fixture
def small_sizes(monkeypatch):
    monkeypatch.setattr(agnews, "EXPECTED_ROWS", {"train": TRAIN_ROWS, "test": TEST_ROWS})


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A word-level tokenizer with no padding token (like Pythia's) and a 2-layer GPT-NeoX."""
    from tokenizers import Tokenizer, models as tmodels, pre_tokenizers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-pythia")
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    core = Tokenizer(tmodels.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="[UNK]"
    )
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        rotary_pct=0.25,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPTNeoXForCausalLM(cfg).save_pretrained(folder)  # a causal LM checkpoint, as Pythia's is
    return str(folder)


@pytest.fixture
def agnews_root(tmp_path, small_sizes):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    write_parquet(mirror, "train", articles(TRAIN_ROWS, 0))
    write_parquet(mirror, "test", articles(TEST_ROWS, 1))
    root = tmp_path / "data" / "agnews"
    data.download("agnews", root, [str(tmp_path / "empty"), str(mirror)], log=lambda *_: None)
    return root


def test_parquet_from_a_mirror_loads_as_fixed_length_token_tensors(agnews_root, tiny_model):
    assert (agnews_root / "SHA256SUMS").read_text().count("parquet") == 2
    train = data.load("agnews", agnews_root, train=True, pretrained={"path": tiny_model, "max_length": 12})
    test = data.load("agnews", agnews_root, train=False, pretrained={"path": tiny_model, "max_length": 12})
    assert train.input_ids.shape == train.attention_mask.shape == (TRAIN_ROWS, 12)
    assert len(test) == TEST_ROWS and train.labels.dtype == torch.int64
    assert torch.bincount(train.labels).tolist() == [10, 10, 10, 10]
    # right padding with end-of-text (Pythia has no pad token); the mask marks the real tokens
    assert (train.input_ids[train.attention_mask == 0] == 0).all()
    assert (train.attention_mask[:, 0] == 1).all() and (train.attention_mask.diff(dim=1) <= 0).all()
    assert (train.attention_mask.sum(1) == 12).any() and (train.attention_mask.sum(1) < 12).any()  # truncated, padded
    first = train.input_ids[0, :3].tolist()
    assert first == [2 + WORDS.index(w) for w in ("war", "talks", "world")]  # label 0's title, word by word
    batch, y = train.batch(torch.tensor([[0, 5], [7, 1]]))  # a (K, B) index keeps its shape in front
    assert batch.input_ids.shape == (2, 2, 12) and y.tolist() == [[0, 1], [3, 1]]
    assert np.array_equal(data.train_labels("agnews", agnews_root), train.labels.numpy())


def test_original_csv_format_gives_the_same_columns(tmp_path, small_sizes, tiny_model):
    mirror = tmp_path / "csv"
    mirror.mkdir()
    rows = articles(TRAIN_ROWS, 0)
    write_csv(mirror, "train", rows)
    write_csv(mirror, "test", articles(TEST_ROWS, 1))
    root = data.download("agnews", tmp_path / "agnews", [str(mirror)], log=lambda *_: None)
    assert (root / "train.csv").exists() and not (root / agnews.FILES["parquet"]["train"]).exists()
    split = agnews.read_split(root / "train.csv")
    assert list(split["label"]) == [l for l, _, _ in rows]  # 1..4 shifted to 0..3
    assert split["text"][3] == f"{rows[3][1]} {rows[3][2]}"  # title + " " + description


@pytest.mark.parametrize(
    "problem,says", [("short", "39 rows, AGNews train has 40"), ("unbalanced", r"label counts \[40, 0, 0, 0\]")]
)
def test_a_wrong_file_is_refused_and_never_takes_the_place(tmp_path, small_sizes, problem, says):
    mirror = tmp_path / "bad"
    mirror.mkdir()
    rows = articles(TRAIN_ROWS, 0)
    rows = rows[:-1] if problem == "short" else [(0, t, d) for _, t, d in rows]
    write_parquet(mirror, "train", rows)
    write_parquet(mirror, "test", articles(TEST_ROWS, 1))
    with pytest.raises(data.DownloadError, match=says):
        data.download("agnews", tmp_path / "agnews", [str(mirror)], log=lambda *_: None)
    assert not list((tmp_path / "agnews").glob("*.parquet"))


def test_classifier_on_the_flat_engine(agnews_root, tiny_model, float64_engine):
    torch.manual_seed(0)
    # in float64 (the float64_engine fixture): two orders of the same sums then differ by float64 rounding only
    module = models.build("pythia70m", "agnews", {"path": tiny_model}).double()
    assert learnt_buffers(module) == [] and list(module.buffers())  # only constant (rotary) buffers
    flat = FlatModel(module, torch.device("cpu"))
    assert len(flat.buffers) == 0  # the rotary constants stay in the module, out of the averaged buffers
    train = data.load("agnews", agnews_root, train=True, pretrained={"path": tiny_model, "max_length": 16})
    x, y = train.batch(torch.arange(8))
    logits = module(x)
    assert logits.shape == (8, 4) and logits.dtype == flat.flat.dtype == torch.float64
    count = summed_inputs(module, x)  # the whole batch: the gradients sum over it
    loss = flat.loss_and_grad(torch.nn.functional.cross_entropy, x, y)
    assert torch.isfinite(loss) and flat.grad.abs().sum() > 0
    flat.check_bound()
    # the flat buffers hold the module's own loss and gradient: autograd on the same batch, asked here for
    # the parameters' gradients directly; forward and backward each within count * u64 of their scale, while a
    # parameter bound to the wrong slice moves them by percents
    expected = torch.nn.functional.cross_entropy(module(x), y)
    grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(expected, list(module.parameters()))])
    torch.testing.assert_close(loss, expected.detach(), rtol=0, atol=count * U64 * float(expected.detach()))
    torch.testing.assert_close(flat.grad, grad, rtol=0, atol=2 * count * U64 * float(grad.abs().max()))
    # the head reads the last real token: more padding does not change the logits beyond the rounding of
    # the longer pass's sums (its count), while reading another token moves them by their scale
    longer = data.load("agnews", agnews_root, train=True, pretrained={"path": tiny_model, "max_length": 24})
    with torch.no_grad():
        short_rows = train.attention_mask.sum(1) < 16
        idx = torch.nonzero(short_rows).flatten()[:4]
        short, padded = module(train.batch(idx)[0]), module(longer.batch(idx)[0])
        bound = summed_inputs(module, longer.batch(idx)[0]) * U64 * float(short.abs().max())
        torch.testing.assert_close(padded, short, rtol=0, atol=bound)


def test_pythia70m_parameter_count_from_its_published_config():
    # EleutherAI/pythia-70m's config.json (no weights needed): 44,673,024 with a 4-way head
    from transformers import GPTNeoXConfig, GPTNeoXForSequenceClassification

    cfg = GPTNeoXConfig(
        vocab_size=50304,
        hidden_size=512,
        num_hidden_layers=6,
        num_attention_heads=8,
        intermediate_size=2048,
        max_position_embeddings=2048,
        rotary_pct=0.25,
        use_parallel_residual=True,
        num_labels=4,
        pad_token_id=0,
    )
    with torch.device("meta"):
        count = models.num_parameters(GPTNeoXForSequenceClassification(cfg))
    assert count == catalog.MODELS["pythia70m"]["params"]["agnews"] == 44673024


def test_pretrained_section_enters_only_pretrained_runs():
    # a model that loads no weights trains with the key resolved, and its id leaves it out
    assert "pretrained" not in identity.identity_setting(settings.resolve({"dataset": "fmnist", "model": "mlp"}))
    s = settings.resolve({"dataset": "agnews", "model": "pythia70m"})
    assert s["pretrained"] == {"path": "EleutherAI/pythia-70m", "max_length": 100}


def test_two_federated_rounds_end_to_end(agnews_root, tiny_model, tmp_path):
    s = settings.resolve(
        {
            "algorithm": "fedaware",
            "dataset": "agnews",
            "model": "pythia70m",
            "device": "cpu",
            "pretrained": {"path": tiny_model, "max_length": 16},
            "num_clients": 4,
            "participation": 0.5,
            "rounds": 2,
            "batch_size": 8,
            "local_epochs": 1,
            "client": {"lr": 1e-2},
            "seed": 3,
            "partition": {"kind": "dirichlet", "alpha": 0.5, "seed": 1, "min_size": 2},
        }
    )
    labels = data.train_labels("agnews", agnews_root)
    parts = partitions.make(labels, identity.partition_setting(s))
    partition_records.save(tmp_path / "part", identity.partition_setting(s), labels, parts, 4)
    summary = Trainer(s, tmp_path / "run", tmp_path / "part", agnews_root).run(progress=False)
    assert summary["status"] == "finished" and summary["rounds_done"] == 2
    assert 0.0 <= summary["final_acc"] <= 1.0 and np.isfinite(summary["final_loss"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["setting"]["model"] == "pythia70m"
    # the last round's scores are model.pt's, scored here by a plain forward pass over the whole test split
    module = models.build("pythia70m", "agnews", {"path": tiny_model}).eval()
    torch.nn.utils.vector_to_parameters(checkpoint.load(tmp_path / "run" / "model.pt")["x"], module.parameters())
    test = data.load("agnews", agnews_root, train=False, pretrained=s["pretrained"])
    with torch.no_grad():
        logits = module(test.batch(torch.arange(len(test)))[0])
    last = pd.read_csv(tmp_path / "run" / "metrics.csv").iloc[-1]
    # the same float32 kernels on the same batch (the split fits one evaluation batch), and the evaluation's
    # own arithmetic (a summed loss over the count): bit for bit
    assert len(test) <= inspect.signature(evaluation.score).parameters["batch_size"].default
    assert last["test_acc"] == float((logits.argmax(1) == test.labels).float().mean())
    summed = torch.nn.functional.cross_entropy(logits, test.labels, reduction="sum")
    assert last["test_loss"] == float(summed) / len(test)


def test_fig4s_agnews_sweep_runs_at_a_tiny_size(agnews_root, tiny_model, tmp_path):
    """FedAWARE Fig. 4's AGNews experiment, its own settings shrunk: FedAWARE-NA and FedAvg-Full, 2 rounds."""
    from fedrepro.configure.paramsfile import ROOT

    params = paramsfile.load_params(ROOT / "params" / "fedaware.yaml")
    params["only"] = "fedaware_fig4_alpha_agnews"
    runs = expansion.expand(params)
    assert len(runs) == 33 and {r.setting["dataset"] for r in runs} == {"agnews"}
    picked = [
        r.setting
        for r in runs
        if r.setting["seed"] == 1998
        and (
            r.setting.get("fedaware", {}).get("weights") == "static"
            and r.setting["fedaware"]["alpha"] == 0.1
            or r.setting["algorithm"] == "fedavg"
        )
    ]
    assert len(picked) == 2
    for i, paper_setting in enumerate(picked):
        s = settings.resolve(
            {
                **paper_setting,
                "device": "cpu",
                "num_clients": 4,
                "rounds": 2,
                "batch_size": 8,
                "local_epochs": 1,
                "pretrained": {"path": tiny_model, "max_length": 16},
                "participation": 0.5 if paper_setting["algorithm"] == "fedaware" else 1.0,
                "partition": {**paper_setting["partition"], "min_size": 2},
            }
        )
        labels = data.train_labels("agnews", agnews_root)
        parts = partitions.make(labels, identity.partition_setting(s))
        partition_records.save(tmp_path / f"part{i}", identity.partition_setting(s), labels, parts, 4)
        summary = Trainer(s, tmp_path / f"run{i}", tmp_path / f"part{i}", agnews_root).run(progress=False)
        assert summary["status"] == "finished" and np.isfinite(summary["e_ludd"])
        # e-LUD^2 = mean_i ||g_i||^2 / ||mean_i g_i||^2 >= 1 (Jensen), each round and so on average; in
        # float32 each sum of P squares is within P u of its value, the mean over K clients adds K roundings,
        # and the quotient (and its root) a few more: e-LUD >= 1 - (2P + 2K + 8) u
        p, k = models.num_parameters(models.build("pythia70m", "agnews", s["pretrained"])), s["num_clients"]
        assert summary["e_ludd"] >= 1 - (2 * p + 2 * k + 8) * U32
