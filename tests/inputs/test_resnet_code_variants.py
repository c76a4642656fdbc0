"""The two ResNet-18 facts the authors' codes decide: IMA's convolutions start from kaiming_normal_(fan_out)
(resnet18_gn2), and FedAWARE's code's CIFAR-100 network has BatchNorm blocks evaluated with the initial running
statistics its server never updates (resnet18_gn32_code). The parity harness (parity/, docs/parity.md) compares
both with the authors' own modules; these tests need no checkout."""

from __future__ import annotations

import math

import torch

from fedrepro import catalog, models
from fedrepro.flat import learnt_buffers
from fedrepro.models.resnet import FrozenStatsNorm, ResNet18GN


def _convs(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def test_ima_resnet_convolutions_are_drawn_from_kaiming_normal_fan_out():
    """Each conv's sample std against sqrt(2 / fan_out): with n weights of N(0, s^2) the sample std has a
    relative standard error of about 1/sqrt(2n) (n >= 1,728 here: at most 1.7%); 6 standard errors bound it.
    PyTorch's default (kaiming_uniform_, a = sqrt(5)) has std 1/sqrt(3 fan_in), 0.5 to 2.5 times this."""
    torch.manual_seed(0)
    model = models.build("resnet18_gn2", "cifar10")
    for conv in _convs(model):
        w = conv.weight.detach().double()
        fan_out = w.shape[0] * w.shape[2] * w.shape[3]
        expected = math.sqrt(2.0 / fan_out)
        n = w.numel()
        assert abs(w.std().item() / expected - 1) < 6 / math.sqrt(2 * n), (conv, w.std().item(), expected)
        assert abs(w.mean().item()) < 6 * expected / math.sqrt(n)


def test_fedaware_paper_resnet_keeps_pytorch_default_init():
    """resnet18_gn32 (FedAWARE's paper: GroupNorm everywhere) is left at PyTorch's default."""
    torch.manual_seed(0)
    conv = _convs(models.build("resnet18_gn32", "cifar100"))[0]
    bound = 1 / math.sqrt(conv.weight[0].numel())  # kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(fan_in), +)
    assert conv.weight.abs().max() <= bound and conv.weight.abs().max() > 0.9 * bound


def _batchnorm_twin(code_model: ResNet18GN) -> ResNet18GN:
    """The same network with torch's BatchNorm2d (fresh running statistics 0 and 1) and the same parameters."""
    twin = ResNet18GN(3, 100, groups=32, block_norm="bn")
    twin.load_state_dict({**twin.state_dict(), **dict(code_model.named_parameters())})
    return twin


def test_fedaware_code_resnet_is_19_batchnorms_and_one_groupnorm_without_buffers():
    model = models.build("resnet18_gn32_code", "cifar100")
    assert sum(isinstance(m, FrozenStatsNorm) for m in model.modules()) == 19
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in model.modules()) == 1
    assert models.num_parameters(model) == catalog.MODELS["resnet18_gn32_code"]["params"]["cifar100"] == 11220132
    assert learnt_buffers(model) == [] and list(model.buffers()) == []  # nothing for a server to average


def test_fedaware_code_resnet_equals_batchnorm_trained_on_batches_and_evaluated_on_initial_statistics():
    """Same kernels on the same inputs: the logits are equal to the last bit, in train mode (batch statistics)
    and in eval mode with the BatchNorm twin's untouched 0/1 statistics; after training forwards, the twin's
    running statistics move and ours, as the code's server's, do not."""
    torch.manual_seed(0)
    ours = models.build("resnet18_gn32_code", "cifar100")
    for p in ours.parameters():  # non-trivial norm weights, so a wrong statistic cannot hide behind 1 and 0
        torch.nn.init.normal_(p, 0.5 if p.ndim == 1 else 0.0, 0.05 if p.ndim > 1 else 0.2)
    twin = _batchnorm_twin(ours)
    x = torch.randn(6, 3, 32, 32)
    ours.eval(), twin.eval()
    with torch.no_grad():
        assert torch.equal(ours(x), twin(x))
        ours.train(), twin.train()
        assert torch.equal(ours(x), twin(x))
        twin(x)  # the twin's running statistics move; a server receiving parameters only never sees them
        ours.eval(), twin.eval()
        frozen = _batchnorm_twin(ours).eval()
        assert torch.equal(ours(x), frozen(x)) and not torch.equal(ours(x), twin(x))


def test_fedlaw_densenet_starts_from_pytorch_default_init_as_its_code():
    """kaiming_uniform_(a = sqrt(5)) draws within +-1/sqrt(fan_in), and a uniform law's std is bound/sqrt(3);
    torchvision's kaiming_normal_ (std sqrt(2/fan_in)) is 2.45 times wider and leaves that bound in every conv
    of more than a few hundred weights. Linear biases are drawn too (torchvision sets them to 0)."""
    torch.manual_seed(0)
    model = models.build("densenet121", "cifar10")
    for conv in _convs(model):
        bound = 1 / math.sqrt(conv.weight[0].numel())
        w = conv.weight.detach().double()
        assert w.abs().max() <= bound, conv
        assert abs(w.std().item() / (bound / math.sqrt(3)) - 1) < 6 / math.sqrt(2 * w.numel())
    assert model.classifier.bias.abs().max() > 0
