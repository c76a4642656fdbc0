"""partition.kind: file, the client index lists another program produced (an .npz or a JSON), checked before
any job and identified by the file's content, not its path."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fedrepro import identity, partitions
from fedrepro.configure import expansion, schema, settings
from fedrepro.identity import partition_id, run_id
from fedrepro.partitions import records as partition_records
from fedrepro.partitions.base import PartitionError

N_TRAIN = 60000  # fmnist's training set


def _lists(n: int = 4) -> list[list[int]]:
    rng = np.random.default_rng(0)
    order = rng.permutation(N_TRAIN)[:400]
    return [[int(i) for i in part] for part in np.array_split(order, n)]  # unsorted: the order is kept


def _write(path, lists) -> str:
    if str(path).endswith(".npz"):
        np.savez(path, **{f"client_{i}": np.asarray(p, dtype=np.int64) for i, p in enumerate(lists)})
    else:
        path.write_text(json.dumps({"clients": lists}))
    return str(path)


def _setting(path, n: int = 4) -> dict:
    return settings.resolve(
        {"dataset": "fmnist", "model": "mlp", "num_clients": n, "partition": {"kind": "file", "path": str(path)}}
    )


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_a_file_partition_is_the_lists_it_holds(tmp_path, suffix):
    lists = _lists()
    s = _setting(_write(tmp_path / f"p{suffix}", lists))
    assert len(s["partition"]["sha256"]) == 64
    parts = partitions.make(np.zeros(N_TRAIN, dtype=np.int64), identity.partition_setting(s))
    assert [p.tolist() for p in parts] == lists and all(p.dtype == np.int64 for p in parts)


def test_the_identity_is_the_content_not_the_path(tmp_path):
    a = _write(tmp_path / "a.npz", _lists())
    b = tmp_path / "elsewhere" / "b.npz"
    b.parent.mkdir()
    shutil.copy(a, b)
    sa, sb = _setting(a), _setting(b)
    assert run_id(sa) == run_id(sb) and partition_id(sa) == partition_id(sb)
    changed = _lists()
    changed[0], changed[1] = changed[1], changed[0]  # the same indices, two clients swapped
    sc = _setting(_write(tmp_path / "a.npz", changed))
    assert partition_id(sc) != partition_id(sa) and run_id(sc) != run_id(sa)
    assert partition_id(sa).startswith("fmnist-file")


def test_a_pinned_checksum_refuses_another_file(tmp_path):
    path = _write(tmp_path / "p.json", _lists())
    pinned = _setting(path)["partition"]["sha256"]
    _write(tmp_path / "p.json", _lists(4)[::-1])
    with pytest.raises(schema.ConfigError, match=r"p\.json: its content changed"):
        settings.resolve(
            {
                "dataset": "fmnist",
                "model": "mlp",
                "num_clients": 4,
                "partition": {"kind": "file", "path": path, "sha256": pinned},
            }
        )


@pytest.mark.parametrize("suffix", [".npz", ".json"])
@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda ls: [ls[0], ls[1], [*ls[2], N_TRAIN], ls[3]], f"client 2 holds index {N_TRAIN}, outside"),
        (lambda ls: [ls[0], [*ls[1], -1], ls[2], ls[3]], "client 1 holds index -1, outside"),
        (lambda ls: [ls[0], ls[1], [*ls[2], ls[0][5]], ls[3]], "client 2 holds index {} a second time"),
        (lambda ls: [ls[0], [*ls[1], ls[1][0]], ls[2], ls[3]], "client 1 holds index {} a second time"),
        (lambda ls: [ls[0], [], ls[2], ls[3]], "client 1 is empty"),
        (lambda ls: ls[:3], "holds 3 clients, the setting asks for num_clients = 4"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_first_bad_client(tmp_path, suffix, edit, message):
    lists = _lists()
    bad = edit([list(p) for p in lists])
    if "second time" in message:
        message = message.format(lists[0][5] if "client 2" in message else lists[1][0])
    path = _write(tmp_path / f"bad{suffix}", bad)
    with pytest.raises(schema.ConfigError) as err:
        _setting(path)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and f"bad{suffix}" in text and message in text, text


def test_unreadable_or_misnamed_files_are_refused(tmp_path):
    (tmp_path / "p.json").write_text("{not json")
    (tmp_path / "p.txt").write_text("[]")
    np.savez(tmp_path / "p.npz", client_0=np.arange(5), clients_1=np.arange(5, 9))
    (tmp_path / "q.json").write_text(json.dumps({"clients": [[0.5, 1], [2]]}))
    for name, message in [
        ("p.json", "cannot be read"),
        ("p.txt", "must end in .npz or .json"),
        ("p.npz", "found clients_1"),
        ("q.json", "client 0 holds non-integer"),
        ("missing.npz", "no such file"),
    ]:
        with pytest.raises(schema.ConfigError, match=message):
            _setting(tmp_path / name, n=2)
    with pytest.raises(schema.ConfigError, match="needs partition.path"):
        settings.resolve({"dataset": "fmnist", "model": "mlp", "num_clients": 2, "partition": {"kind": "file"}})
    with pytest.raises(schema.ConfigError) as err:  # a folder, not "no such file"
        _setting(tmp_path, n=2)
    assert str(err.value).endswith(
        f"partition.path: {tmp_path} is a directory; name the .npz or .json file of client index lists in it"
    ) and "\n" not in str(err.value)


def test_a_params_file_reads_a_relative_path_under_the_data_root(tmp_path):
    (tmp_path / "parts").mkdir()
    _write(tmp_path / "parts" / "p.npz", _lists())
    base = {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "partition": {"kind": "file", "path": "parts/p.npz"}}
    runs = expansion.expand(
        {"data": {"root": str(tmp_path)}, "experiments": {"e": {"base": base, "grid": {"seed": [1]}}}}
    )
    assert runs[0].setting["partition"]["path"] == str(tmp_path / "parts" / "p.npz")
    with pytest.raises(schema.ConfigError, match="no such file"):
        expansion.expand(
            {"data": {"root": str(tmp_path / "other")}, "experiments": {"e": {"base": base, "grid": {"seed": [1]}}}}
        )


def test_the_saved_partition_loads_for_the_same_file_at_another_path(tmp_path):
    a = _write(tmp_path / "a.npz", _lists())
    shutil.copy(a, tmp_path / "b.npz")
    sa, sb = _setting(a), _setting(tmp_path / "b.npz")
    labels = np.zeros(N_TRAIN, dtype=np.int64)
    parts = partitions.make(labels, identity.partition_setting(sa))
    partition_records.save(tmp_path / "out", identity.partition_setting(sa), labels, parts, 10)
    loaded = partition_records.load(tmp_path / "out", identity.partition_setting(sb))
    assert [p.tolist() for p in loaded] == [p.tolist() for p in parts]
    other = _setting(_write(tmp_path / "c.npz", _lists()[::-1]))
    with pytest.raises(PartitionError, match="not this run's partition"):
        partition_records.load(tmp_path / "out", identity.partition_setting(other))


def test_the_partition_job_checks_the_pinned_checksum_and_the_index_range_itself(tmp_path):
    """The job reads the file again (it may have changed since the settings were resolved): a pinned SHA-256
    of another content is refused there too; the first and last index of the training set are in range, one
    past either end is not, and the message gives the range."""
    lists = _lists()
    lists[0][0], lists[1][0] = 0, N_TRAIN - 1
    path = _write(tmp_path / "p.npz", lists)
    setting = identity.partition_setting(_setting(path))
    labels = np.zeros(N_TRAIN, dtype=np.int64)
    assert [p.tolist() for p in partitions.make(labels, setting)] == lists
    _write(tmp_path / "p.npz", lists[::-1])
    with pytest.raises(PartitionError, match="p.npz"):
        partitions.make(labels, setting)
    for index in (-1, N_TRAIN):
        bad = _write(tmp_path / "bad.json", [[index, *lists[0][1:]], *lists[1:]])
        with pytest.raises(
            PartitionError, match=rf"holds index {index}, outside the training set's 0\.\.{N_TRAIN - 1}"
        ):
            partitions.make(labels, {**setting, "path": bad, "sha256": None})


def test_a_partition_file_of_pickled_objects_or_not_an_object_is_refused(tmp_path):
    np.savez(tmp_path / "objects.npz", client_0=np.array([[1, 2], [3]], dtype=object), client_1=np.arange(3))
    (tmp_path / "list.json").write_text(json.dumps([[1, 2], [3]]))
    for name, message in [("objects.npz", "cannot be read"), ("list.json", "a JSON partition is an object")]:
        with pytest.raises(schema.ConfigError, match=message):
            _setting(tmp_path / name, n=2)
