"""FedAdagrad: two server steps by hand, state through a checkpoint, and a real run that resumes exactly."""

import io
import math

import pytest
import torch

from conftest import make_partition
from fedrepro.algorithms.fedadagrad import ServerAdagrad
from fedrepro.configure import settings
from fedrepro.parts import RoundUpdates
from fedrepro.run import checkpoint

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

F64 = torch.float64


def updates(d: torch.Tensor) -> RoundUpdates:
    return RoundUpdates(
        0, torch.arange(1), d[None], torch.ones(1, dtype=F64), torch.ones(1, dtype=F64), torch.zeros(1), 0.1
    )


def test_two_steps_by_hand_and_the_state_survives_a_checkpoint():
    lr, b1, tau = 0.1, 0.9, 1e-3
    d1, d2 = torch.tensor([1.0, -2.0, 0.5], dtype=F64), torch.tensor([0.5, 0.5, 0.5], dtype=F64)
    opt = ServerAdagrad(lr, b1, tau)
    x1 = opt(torch.zeros(3, dtype=F64), d1, updates(d1))
    # m = 0.1 d, v = d^2: step_j = 0.1 d_j / (|d_j| + tau)
    torch.testing.assert_close(x1, -lr * torch.tensor([0.1 / 1.001, -0.2 / 2.001, 0.05 / 0.501], dtype=F64))
    x2 = opt(x1, d2, updates(d2))
    m = [0.9 * 0.1 + 0.05, 0.9 * -0.2 + 0.05, 0.9 * 0.05 + 0.05]
    v = [1.0 + 0.25, 4.0 + 0.25, 0.25 + 0.25]  # a plain sum of squares: never decays
    torch.testing.assert_close(
        x2, x1 - lr * torch.tensor([mj / (math.sqrt(vj) + tau) for mj, vj in zip(m, v)], dtype=F64)
    )
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    again = ServerAdagrad(lr, b1, tau)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(again(x2, d1, updates(d1)), opt(x2, d1, updates(d1)))


def test_settings_come_from_its_fragment():
    s = settings.resolve({"algorithm": "fedadagrad"})
    assert s["fedadagrad"] == {"beta1": 0.9, "tau": 1e-5, "v0": 0.0}
    assert "fedadam" not in s


def test_a_real_run_resumes_exactly(tiny_data_root, tmp_path):
    from fedrepro.run.trainer import Trainer

    part = make_partition(tiny_data_root, tmp_path / "part", num_clients=4, kind="iid")
    s = settings.resolve(
        {
            "algorithm": "fedadagrad",
            "num_clients": 4,
            "participation": 0.5,
            "rounds": 3,
            "batch_size": 50,
            "device": "cpu",
            "partition": {"kind": "iid"},
            "server": {"lr": 0.01},
        }
    )
    straight = Trainer(s, tmp_path / "a", part, tiny_data_root).run(progress=False)
    Trainer(s, tmp_path / "b", part, tiny_data_root).run(progress=False, stop_after=1)
    resumed = Trainer(s, tmp_path / "b", part, tiny_data_root).run(progress=False)
    assert straight["status"] == "finished" and resumed["resumed"]
    assert torch.equal(
        checkpoint.load(tmp_path / "a" / "model.pt")["x"], checkpoint.load(tmp_path / "b" / "model.pt")["x"]
    )
