"""AGNews (FedAWARE Table 2, third dataset): text data as device tensors, tokenised by the
model's own tokenizer (the model itself: ``fedrepro.models.pythia``).

The files are AGNews in one of its two real on-disk formats, fetched from a list of mirrors
(URL prefixes or local folders) like every other dataset:

- ``parquet``: the Hugging Face dataset ``fancyzhx/ag_news`` (formerly ``ag_news``),
  ``data/{train,test}-00000-of-00001.parquet`` with columns ``text`` (title and description joined
  by a space) and ``label`` (0..3: World, Sports, Business, Sci/Tech);
- ``csv``: the original release of Zhang et al. (``ag_news_csv``: ``train.csv``, ``test.csv``, no
  header, columns class index 1..4, title, description), read into the same two columns.

Both are read with Hugging Face ``datasets``. No published checksum of either is known to us, so a
file is accepted by its content instead: the exact row count of its split (120,000 / 7,600) and
exactly balanced classes (30,000 / 1,900 per label), which a truncated or wrong file fails. The
sha256 of the accepted file is logged (and kept in ``SHA256SUMS``) for provenance.

Every text is tokenised once at load with the model's own tokenizer, truncated and padded to a
fixed ``max_length`` (100 in FedAWARE's code), so a split is two (N, L) integer tensors on the device
and a batch is an index gather, as for images. Tokenisation is not cached: it costs seconds per
run, which a 300-round fine-tuning run does not notice.

Pythia's tokenizer has no padding token; as is usual for GPT-style models (and needed for the
classifier's head to find the last real token), the end-of-text token pads. ``pretrained.path`` is a
hub id or a local folder (see ``fedrepro.models.pythia``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fedrepro.data.base import DataError, DownloadError, fetch_from_mirrors, file_sha256, gather

AGNEWS = "agnews"
DEFAULT_MODEL = "EleutherAI/pythia-70m"
DEFAULT_MAX_LENGTH = 100

# Formats in the order they are tried; each names its two files.
FILES = {
    "parquet": {"train": "train-00000-of-00001.parquet", "test": "test-00000-of-00001.parquet"},
    "csv": {"train": "train.csv", "test": "test.csv"},
}
DEFAULT_MIRRORS = [
    "https://huggingface.co/datasets/fancyzhx/ag_news/resolve/main/data/",  # parquet
    "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/",  # csv
]
# The content checks that stand in for a checksum (module-level so tests can shrink them).
EXPECTED_ROWS = {"train": 120000, "test": 7600}
NUM_CLASSES = 4
CSV_COLUMNS = ["label", "title", "description"]

HOW_TO_GET_OFFLINE = (
    "Without internet: copy AGNews' train/test files (parquet from the Hugging Face dataset "
    "fancyzhx/ag_news, or train.csv/test.csv of the original ag_news_csv) into a folder and list "
    "that folder first under data.mirrors.agnews in the params file."
)


# --------------------------------------------------------------------------- files


def _cache_dir(path: Path) -> str:
    # datasets prepares Arrow files in a cache; keep it beside the data, not in ~/.cache
    return str(path.parent / ".hf_datasets_cache")


def read_split(path: str | Path, fmt: str | None = None):
    """The file as a ``datasets.Dataset`` with columns ``text`` and ``label`` (0..3); ``fmt``
    (parquet or csv) defaults to the file's suffix (a download's temporary name has none)."""
    import datasets

    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".")
    if fmt == "parquet":
        ds = datasets.Dataset.from_parquet(str(path), cache_dir=_cache_dir(path))
        missing = {"text", "label"} - set(ds.column_names)
        if missing:
            raise DownloadError(f"{path.name}: no column(s) {sorted(missing)}; has {ds.column_names}")
        return ds.select_columns(["text", "label"])
    if fmt == "csv":
        features = datasets.Features(
            {
                "label": datasets.Value("int64"),
                "title": datasets.Value("string"),
                "description": datasets.Value("string"),
            }
        )
        ds = datasets.Dataset.from_csv(
            str(path), column_names=CSV_COLUMNS, features=features, cache_dir=_cache_dir(path)
        )
        # the original labels are 1..4; text = title + " " + description, as the Hugging Face copy has it
        return ds.map(
            lambda rows: {
                "text": [f"{t or ''} {d or ''}" for t, d in zip(rows["title"], rows["description"])],
                "label": [label - 1 for label in rows["label"]],
            },
            batched=True,
            batch_size=10000,
            remove_columns=["title", "description"],
            keep_in_memory=True,
        )
    raise DownloadError(f"{path.name}: not an AGNews file (parquet or csv)")


def _labels(ds):
    """The label column as an int64 numpy array (one Arrow conversion, not a Python list)."""
    import numpy as np

    return np.asarray(ds.with_format("numpy")["label"], dtype=np.int64)


def check_split(path: str | Path, split: str, fmt: str | None = None) -> None:
    """Raise unless the file has the split's exact row count and exactly balanced labels 0..3."""
    labels = torch.from_numpy(_labels(read_split(path, fmt)))
    rows = EXPECTED_ROWS[split]
    if len(labels) != rows:
        raise DownloadError(f"{Path(path).name}: {len(labels)} rows, AGNews {split} has {rows}")
    counts = torch.bincount(labels.clamp(min=0), minlength=NUM_CLASSES)
    if labels.min() < 0 or len(counts) != NUM_CLASSES or (counts != rows // NUM_CLASSES).any():
        raise DownloadError(
            f"{Path(path).name}: label counts {counts.tolist()}, AGNews {split} has "
            f"{rows // NUM_CLASSES} of each of labels 0..{NUM_CLASSES - 1}"
        )


def _valid(split: str, fmt: str):
    """For ``fetch_from_mirrors``: True, or an error that says what is wrong with the file (the
    mirror loop reports it and goes on to the next mirror)."""

    def valid(path: Path) -> bool:
        check_split(path, split, fmt)
        return True

    return valid


def _is_valid(path: Path, split: str, fmt: str) -> bool:
    try:
        return _valid(split, fmt)(path)
    except Exception:  # noqa: BLE001 - an unreadable or wrong file already there is fetched again
        return False


def split_file(root: str | Path, split: str) -> Path:
    """The downloaded file of ``split`` (whichever format the mirrors gave)."""
    for names in FILES.values():
        path = Path(root) / names[split]
        if path.exists():
            return path
    raise DataError(f"no AGNews {split} file in {root}; run `fedrepro download --dataset agnews`")


def download(
    dataset: str, root: str | Path, mirrors: list[str] | None = None, timeout: float = 60.0, log=print
) -> Path:
    """Fetch AGNews' train and test files into ``root``; return ``root``. Idempotent.

    Each format is tried over all mirrors (a mirror serves one format); the first format whose
    two files both pass the content checks wins."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    mirrors = list(mirrors or DEFAULT_MIRRORS)
    for fmt, names in FILES.items():
        if all((root / names[s]).exists() and _is_valid(root / names[s], s, fmt) for s in names):
            return root
    errors = []
    for fmt, names in FILES.items():
        try:
            for split, filename in names.items():
                target = root / filename
                fetch_from_mirrors(
                    filename,
                    target,
                    mirrors,
                    _valid(split, fmt),
                    timeout,
                    log,
                    f"{filename} of '{dataset}' ({fmt})",
                    HOW_TO_GET_OFFLINE,
                )
            sums = "".join(f"{file_sha256(root / f)}  {f}\n" for f in names.values())
            (root / "SHA256SUMS").write_text(sums)
            log(f"{dataset}: {fmt} files accepted (rows and labels checked; no published checksum):\n{sums}")
            return root
        except DownloadError as err:
            errors.append(str(err))
    raise DownloadError("\n".join(errors))


def train_labels(dataset: str, root: str | Path):
    """Labels of the training split without tokenising (partitioning needs only these)."""
    return _labels(read_split(split_file(root, "train")))


# --------------------------------------------------------------------------- device dataset


@dataclass
class TokenBatch:
    """A model input of token ids and their attention mask; what ``TextDataset.batch`` returns
    in place of an image tensor, and what ``models.pythia.SequenceClassifier.forward`` takes."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass
class TextDataset:
    """A whole tokenised split on one device: (N, L) token ids and mask, int64 labels."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    augment = False
    # a (K, B) batch of token sequences is not a batch the HF model can be vmapped over (its
    # pooling indexes by data); the engine trains text clients one after another
    batched_cohort = False

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[TokenBatch, torch.Tensor]:
        return (
            TokenBatch(gather(self.input_ids, index), gather(self.attention_mask, index)),
            gather(self.labels, index),
        )

    def to(self, device) -> "TextDataset":
        return TextDataset(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))

    def subset(self, index: torch.Tensor) -> "TextDataset":
        return TextDataset(self.input_ids[index], self.attention_mask[index], self.labels[index])


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:  # Pythia's has none; end-of-text pads (see module docstring)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def tokenize(texts: list[str], tokenizer, max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    return enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> TextDataset:
    pretrained = dict(pretrained or {})
    tokenizer = load_tokenizer(pretrained.get("path", DEFAULT_MODEL))
    ds = read_split(split_file(root, "train" if train else "test"))
    ids, mask = tokenize(list(ds["text"]), tokenizer, int(pretrained.get("max_length", DEFAULT_MAX_LENGTH)))
    return TextDataset(ids, mask, torch.from_numpy(_labels(ds)))
