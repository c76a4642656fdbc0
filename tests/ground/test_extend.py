"""The README's "Extend" promise: a dataset, a model or a partition kind is two files, a module and the fragment
beside it, and nothing else is edited. Each test copies the package, adds only those two files, and uses the new
part in a fresh interpreter (the catalog is read at import)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fedrepro

PACKAGE = Path(fedrepro.__file__).resolve().parent
PYTHON = os.path.abspath(sys.executable)


@pytest.fixture
def copy(tmp_path):
    """A copy of the package to add files to; ``run(code)`` runs Python against it and returns its JSON output."""
    shutil.copytree(PACKAGE, tmp_path / "fedrepro", ignore=shutil.ignore_patterns("__pycache__"))

    def run(code: str):
        out = subprocess.run(
            [PYTHON, "-c", textwrap.dedent(code)],
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    run.root = tmp_path / "fedrepro"
    return run


def _add(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))


def test_a_partition_kind_is_two_files(copy):
    _add(
        copy.root,
        {
            "partitions/halves.py": """
            import numpy as np

            def make(labels, setting, groups=None):
                order = np.random.default_rng(setting["seed"]).permutation(len(labels))
                cut = int(len(labels) * setting["first_share"])
                rest = np.array_split(order[cut:], setting["num_clients"] - 1)
                return [np.sort(order[:cut]), *(np.sort(part) for part in rest)]
            """,
            "partitions/halves.yaml": """
            doc: one client holds first_share of the samples, the others share the rest
            keys: [seed, first_share]
            name: "half{first_share:g}"
            properties:
              first_share: {description: the first client's share, type: number, minimum: 0, maximum: 1, default: 0.5}
            """,
        },
    )
    found = copy("""
        import json
        import numpy as np
        from fedrepro import identity, partitions
        from fedrepro.configure import settings
        setting = settings.resolve({"dataset": "fmnist", "model": "mlp", "num_clients": 4,
                                    "partition": {"kind": "halves", "first_share": 0.25}})
        part = identity.partition_setting(setting)
        sizes = [len(p) for p in partitions.make(np.zeros(100, dtype=int), part)]
        try:
            settings.resolve({"dataset": "fmnist", "model": "mlp", "partition": {"kind": "halves", "first_share": 2}})
            refused = ""
        except Exception as error:
            refused = str(error)
        print(json.dumps({"id": identity.partition_id(setting), "partition": setting["partition"], "sizes": sizes,
                          "refused": refused}))
        """)
    assert found["id"].startswith("fmnist-half0.25-n4-")
    assert found["partition"] == {"kind": "halves", "seed": 1, "first_share": 0.25}  # its keys, and only they
    assert found["sizes"] == [25, 25, 25, 25]
    assert "partition.first_share" in found["refused"]  # the fragment's schema checks the new setting


def test_a_model_is_two_files(copy):
    _add(
        copy.root,
        {
            "models/tiny.py": """
            import math
            from torch import nn

            BUILDERS = {"tiny": lambda shape, k: nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), k))}
            """,
            "models/tiny.yaml": """
            models:
              tiny: {doc: one linear layer, datasets: [fmnist], params: {fmnist: 7850}, rough_step_seconds: 0.0001}
            """,
        },
    )
    found = copy("""
        import json
        from fedrepro import identity, models
        from fedrepro.ops import pricing
        from fedrepro.configure import settings
        setting = settings.resolve({"dataset": "fmnist", "model": "tiny"})
        print(json.dumps({"id": identity.run_id(setting),
                          "params": models.num_parameters(models.build("tiny", "fmnist")),
                          "rough": pricing.ROUGH_STEP_SECONDS["tiny"], "code": identity.run_code(setting)}))
        """)
    assert found["id"].startswith("fedavg-fmnist-dir0.5-tiny-s1-")
    assert found["params"] == 784 * 10 + 10 and found["rough"] == 0.0001
    assert "models/tiny.py" in found["code"] and "models/mlp.py" not in found["code"]


def test_a_dataset_family_is_two_files(copy):
    _add(
        copy.root,
        {
            "data/blobs.py": """
            from pathlib import Path

            def download(dataset, root, mirrors=None, timeout=0.0, log=print):
                Path(root).mkdir(parents=True, exist_ok=True)
                return Path(root)

            def load(dataset, root, train, preprocess=None, pretrained=None):
                raise NotImplementedError
            """,
            "data/blobs.yaml": """
            datasets:
              blobs: {train_size: 1000, test_size: 200, num_classes: 3, shape: [2], models: [mlp]}
            """,
        },
    )
    found = copy("""
        import json
        from fedrepro import data, identity
        from fedrepro.configure import settings
        setting = settings.resolve({"dataset": "blobs", "model": "mlp", "num_clients": 10})
        print(json.dumps({"family": data.family("blobs").__name__, "id": identity.run_id(setting),
                          "code": identity.run_code(setting)}))
        """)
    assert found["family"] == "fedrepro.data.blobs"
    assert found["id"].startswith("fedavg-blobs-dir0.5-mlp-s1-")
    assert "data/blobs.py" in found["code"] and "data/fmnist.py" not in found["code"]
