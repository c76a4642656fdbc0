"""Download from mirrors: a loopback HTTP server serves generated files in the real idx.gz format.

The checksums the downloader checks against are replaced by the generated files' own values, so
the real fetch / verify / rename / extract / load path runs without the internet.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from conftest import FMNIST_FILES, fake_fmnist_arrays
from fedrepro import data
from fedrepro.data import fmnist


def _corrupt_copy(src: Path, dst: Path, truncate: bool = False) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in FMNIST_FILES:
        blob = bytearray((src / name).read_bytes())
        if truncate:
            blob = blob[: len(blob) // 2]
        else:
            blob[-20] ^= 0xFF  # one flipped byte inside the compressed payload
        (dst / name).write_bytes(bytes(blob))
    return dst


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_good_mirror_is_accepted_extracted_and_loads(tmp_path, serve, fmnist_mirror):
    url = serve(fmnist_mirror)
    root = tmp_path / "data"
    folder = data.download("fmnist", root, [url], timeout=10, log=lambda *_: None)
    assert folder == fmnist.raw_folder(root)
    for name in FMNIST_FILES:
        assert (folder / name).read_bytes() == (fmnist_mirror / name).read_bytes()
        assert (folder / name[:-3]).exists(), "extracted next to the archive, as torchvision leaves it"
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "no temporary file left behind"
    train = data.load("fmnist", root, train=True)
    images, labels = fake_fmnist_arrays(50, 20)["train"]
    assert train.images.shape == (50, 1, 28, 28)
    assert (train.labels.numpy() == labels).all()
    assert (train.images[:, 0].numpy() == images).all()
    # idempotent: a second call with a dead mirror finds the verified files and fetches nothing
    data.download("fmnist", root, ["http://127.0.0.1:9/"], timeout=2, log=lambda *_: None)


@pytest.mark.parametrize("truncate", [False, True], ids=["flipped-byte", "partial-file"])
def test_bad_checksum_is_rejected_and_nothing_is_left_behind(tmp_path, serve, fmnist_mirror, truncate):
    url = serve(_corrupt_copy(fmnist_mirror, tmp_path / "bad", truncate))
    root = tmp_path / "data"
    with pytest.raises(data.DownloadError) as err:
        data.download("fmnist", root, [url], timeout=10, log=lambda *_: None)
    assert url in str(err.value)
    assert _leftovers(root) == [], "a corrupt or partial file must never stay on disk"


def test_falls_back_to_the_next_mirror(tmp_path, serve, fmnist_mirror):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = serve(_corrupt_copy(fmnist_mirror, tmp_path / "bad"))
    missing = serve(empty)  # 404 for every file
    good = serve(fmnist_mirror)
    used = []
    root = tmp_path / "data"
    data.download("fmnist", root, [bad, missing, "http://127.0.0.1:9/", good], timeout=5, log=used.append)
    assert len(used) == 4 and all(good in line for line in used), used
    for name in FMNIST_FILES:
        assert (fmnist.raw_folder(root) / name).read_bytes() == (fmnist_mirror / name).read_bytes()


def test_local_folder_is_a_mirror(tmp_path, serve, fmnist_mirror):
    root = tmp_path / "data"
    data.download("fmnist", root, [str(tmp_path / "nowhere"), str(fmnist_mirror)], log=lambda *_: None)
    test = data.load("fmnist", root, train=False)
    assert test.labels.shape == (20,)
    # the mirror's own bytes decoded by the idx layout (8-byte label header, 16-byte image header)
    labels = gzip.decompress((fmnist_mirror / "t10k-labels-idx1-ubyte.gz").read_bytes())[8:]
    images = gzip.decompress((fmnist_mirror / "t10k-images-idx3-ubyte.gz").read_bytes())[16:]
    assert test.labels.tolist() == list(labels)
    assert test.images.flatten().tolist() == list(images)


def test_error_lists_every_mirror_tried_and_how_to_get_the_data(tmp_path, serve, fmnist_mirror):
    bad = serve(_corrupt_copy(fmnist_mirror, tmp_path / "bad"))
    mirrors = [bad, "http://127.0.0.1:9/", str(tmp_path / "no-such-folder")]
    with pytest.raises(data.DownloadError) as err:
        data.download("fmnist", tmp_path / "data", mirrors, timeout=5, log=lambda *_: None)
    message = str(err.value)
    for mirror in mirrors:
        assert mirror in message
    assert "checksum" in message
    assert "dataset-fashion-mnist" in message, "the error says how to get the data without internet"
    assert _leftovers(tmp_path / "data") == []


def test_cli_download_writes_its_output_only_on_success(tmp_path, serve, fmnist_mirror, capsys):
    from fedrepro import cli

    out = tmp_path / "download.json"
    with pytest.raises(SystemExit) as exit_:  # a DownloadError: its message, no traceback, status 2
        cli.main(["download", "--root", str(tmp_path / "d1"), "--mirror", str(tmp_path / "none"), "--out", str(out)])
    assert exit_.value.code == 2 and "fedrepro download: could not get" in capsys.readouterr().err
    assert not out.exists()
    cli.main(["download", "--root", str(tmp_path / "d2"), "--mirror", serve(fmnist_mirror), "--out", str(out)])
    assert set(FMNIST_FILES) <= set(__import__("json").loads(out.read_text())["files"])


def test_generated_files_are_real_idx(fmnist_mirror):
    import gzip
    import struct

    head = gzip.decompress((fmnist_mirror / "train-images-idx3-ubyte.gz").read_bytes())[:16]
    assert struct.unpack(">IIII", head) == (0x0803, 50, 28, 28)
    labels = gzip.decompress((fmnist_mirror / "train-labels-idx1-ubyte.gz").read_bytes())
    assert struct.unpack(">II", labels[:8]) == (0x0801, 50)
    assert np.frombuffer(labels[8:], np.uint8).max() == 9


def test_the_end_to_end_tests_generated_files_pass_the_real_download_in_a_subprocess(tmp_path):
    """What a workflow's download job does with the generated Fashion-MNIST the end-to-end tests fall back
    on: `fedrepro download` from their mirror folder, in its own process. With their checksums
    (tests/generated_fmnist) the files are accepted and load as written; without, the checksum refuses
    them, so the hook is what makes them pass and the download's check still runs."""
    import subprocess
    import sys

    from conftest import generated_fmnist, subprocess_env

    arrays = fake_fmnist_arrays(60, 20, seed=3)
    generated = generated_fmnist(tmp_path / "generated", arrays)

    def download(root, env):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "fedrepro",
                "download",
                "--dataset",
                "fmnist",
                "--root",
                str(root),
                "--mirror",
                generated.mirror,
                "--out",
                str(root / "download.json"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    refused = download(tmp_path / "plain", subprocess_env())
    assert refused.returncode == 2 and "checksum mismatch" in refused.stderr, refused.stderr[-2000:]
    done = download(tmp_path / "hooked", subprocess_env(fmnist=generated))
    assert done.returncode == 0, done.stderr[-2000:]
    train = data.load("fmnist", tmp_path / "hooked", train=True)
    assert (train.images.squeeze(1).numpy() == arrays["train"][0]).all()
    assert (train.labels.numpy() == arrays["train"][1]).all()
