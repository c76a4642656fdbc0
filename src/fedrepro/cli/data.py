"""``fedrepro download`` and ``fedrepro partition``: a dataset on disk and a partition of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedrepro.cli.common import EXAMPLES, _existing, _json_arg, _number, _output, finish


def add_parsers(sub) -> None:
    """download, partition."""
    add_download(sub)
    add_partition(sub)


def add_download(sub) -> None:
    """Fetch a dataset from its mirrors."""
    from fedrepro.catalog import DATASETS

    p = sub.add_parser("download", help="fetch a dataset from its mirrors, checksum-verified")
    p.add_argument("--dataset", default="fmnist", choices=sorted(DATASETS), help="which dataset (default fmnist)")
    p.add_argument("--root", default="data/fmnist", type=_output("folder"), help="folder the dataset goes into")
    p.add_argument("--mirror", action="append", help="URL prefix or local folder; repeat to try several in order")
    p.add_argument(
        "--mirror-map",
        type=_json_arg,
        help="the params file's data.mirrors as JSON {dataset: [mirror, "
        "...]}: this dataset's list, when no --mirror is given (how the workflow passes them)",
    )
    p.add_argument("--timeout", type=_number(float, 0, strict=True), default=20.0, help="seconds per network request")
    p.add_argument("--out", type=_output("file"), help="write a JSON list of the files here when done")
    p.set_defaults(func=cmd_download)
    finish(p, EXAMPLES["download"])


def cmd_download(args) -> None:
    from fedrepro import data

    mirrors = args.mirror or (args.mirror_map or {}).get(args.dataset) or None
    folder = data.prepare(args.dataset, args.root, mirrors, args.out, timeout=args.timeout)
    print(f"{args.dataset}: ready in {folder}")


def _partition_setting(text: str) -> dict:
    from fedrepro.catalog import DATASETS

    setting = _json_arg(text)
    missing = [k for k in ("dataset", "kind") if k not in setting]
    if missing:
        raise argparse.ArgumentTypeError(
            f"the partition setting needs {' and '.join(missing)} "
            f'(e.g. {{"dataset": "fmnist", "kind": "iid", "num_clients": 10}})'
        )
    if setting["dataset"] not in DATASETS:
        raise argparse.ArgumentTypeError(f"dataset '{setting['dataset']}' is not one of {', '.join(sorted(DATASETS))}")
    return setting


def add_partition(sub) -> None:
    """Split a training set over clients."""
    p = sub.add_parser("partition", help="split a training set over clients and write the partition artifact")
    p.add_argument(
        "--setting",
        required=True,
        type=_partition_setting,
        help="partition setting as JSON (or a JSON file): dataset, kind, num_clients, ...",
    )
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder (after download)")
    p.add_argument("--out", required=True, type=_output("folder"), help="output folder")
    p.set_defaults(func=cmd_partition)
    finish(p, EXAMPLES["partition"])


def cmd_partition(args) -> None:
    from fedrepro import catalog, data, partitions
    from fedrepro.partitions import records as partition_records

    setting = args.setting  # parsed and checked by the parser
    labels = data.train_labels(setting["dataset"], args.data_root)
    groups = data.train_groups(setting["dataset"], args.data_root)  # a dataset's own clients (natural)
    # a multi-domain dataset (digit5, pacs): each domain is split over its own clients
    parts = partitions.make(labels, setting, groups, data.train_domains(setting["dataset"], args.data_root))
    info = partition_records.save(args.out, setting, labels, parts, catalog.DATASETS[setting["dataset"]]["num_classes"])
    print(
        f"partition {Path(args.out).name}: {info['content_hash']}, client sizes {info['sizes']}, "
        f"{partition_records.caption(info['heterogeneity'])}"
    )
