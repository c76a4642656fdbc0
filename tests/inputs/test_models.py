"""Every model: forward/backward on a batch of its dataset's shape, each sample scored on its own in eval
mode, parameter counts from the specs, and learnt buffers only where catalog.MODELS says it has BatchNorm
(the flat engine averages them)."""

from __future__ import annotations

import pytest
import torch

from fedrepro import catalog, models
from fedrepro.flat import FlatModel
from fedrepro.models.cnn import CifarCNN
from fedrepro.models.resnet import ResNet18GN

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

U64 = 2.0**-53  # float64's unit roundoff


def summed_inputs(model, x) -> int:
    """An operation count for float64 rounding bounds: the input elements of every leaf module one forward pass
    of ``x`` runs through, summed (one more each for a bias or a nonlinearity). No reduction of a layer sums more
    terms than its input holds, so a chain of float64 layers computes each output within this count times u64 of
    its terms' scale; the count exceeds the real reduction lengths by orders of magnitude, which leaves room for
    what the layers amplify (their Lipschitz constants, not computed here)."""
    total = [0]
    hooks = [
        m.register_forward_hook(lambda m, i, o: total.__setitem__(0, total[0] + i[0].numel() + 1))
        for m in model.modules()
        if not list(m.children())
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


# Pretrained models (Pythia) need their weights; tests/inputs/test_agnews.py covers them with a tiny local config.
BUILT_HERE = {name: spec for name, spec in catalog.MODELS.items() if not spec.get("pretrained")}
CASES = [(name, dataset) for name, spec in BUILT_HERE.items() for dataset in spec["datasets"]]
# Heavy models on 2 shared cores: one dataset each is enough for forward/backward.
SKIP_SECOND = {
    "resnet18_gn32",
    "resnet18_gn32_code",
    "resnet18_gn2",
    "vgg11",
    "vgg11_gn2",
    "resnet56",
    "resnet110",
    "wrn56_4",
    "densenet121",
}
CASES = [c for i, c in enumerate(CASES) if not (c[0] in SKIP_SECOND and c[1] == "cifar100")]


@pytest.mark.parametrize("name,dataset", CASES)
def test_forward_backward_on_a_batch_of_the_right_shape(name, dataset):
    torch.manual_seed(0)
    spec = catalog.DATASETS[dataset]
    model = models.build(name, dataset)
    x = torch.randn(4, *spec["shape"])
    y = torch.randint(0, spec["num_classes"], (4,))
    logits = model(x)
    assert logits.shape == (4, spec["num_classes"])
    torch.nn.functional.cross_entropy(logits, y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    buffers = [b for b, _ in model.named_buffers() if not b.endswith("num_batches_tracked")]
    assert bool(buffers) == bool(catalog.MODELS[name].get("batchnorm")), "learnt buffers only with BatchNorm"
    assert all(b.endswith(("running_mean", "running_var")) for b in buffers)
    # in eval mode (dropout off, BatchNorm on its running statistics) each sample's logits are its own: the
    # batch scored at once equals its samples scored one by one. In float64, so that another batch size's
    # kernels (other orders of the same sums) differ by float64 rounding only, within summed_inputs(one
    # sample) * u64 of the logits' scale; mixing samples moves logits by their own scale (asserted)
    model.double().eval()
    x = x.double()
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    bound = summed_inputs(model, x[:1]) * U64 * float(alone.abs().max())
    assert float((alone[1:] - alone[:-1]).abs().max()) > 1e6 * bound, "the bound would hide mixed samples"
    torch.testing.assert_close(together, alone, rtol=0, atol=bound)


@pytest.mark.parametrize(
    "name,dataset,count",
    [(name, dataset, count) for name, spec in BUILT_HERE.items() for dataset, count in spec.get("params", {}).items()],
)
def test_parameter_counts_given_by_the_specs(name, dataset, count):
    assert models.num_parameters(models.build(name, dataset)) == count


def test_spec_counts_are_the_ones_the_papers_give():
    # FedAWARE 4.2: CNN 122,570 and ResNet-18-GN(32) 11,220,132 (CIFAR-100); FedNova 4.2: VGG-11 9,750,922.
    assert catalog.MODELS["cnn_fedaware"]["params"]["cifar10"] == 122570
    assert catalog.MODELS["resnet18_gn32"]["params"]["cifar100"] == 11220132
    assert catalog.MODELS["vgg11"]["params"]["cifar10"] == 9750922


def test_ima_cifar_cnn_is_the_1600_feature_variant():
    model = models.build("cnn", "cifar10")
    assert model.classifier[0].in_features == 1600 and model.features[0].out_channels == 64


def test_group_norm_groups_and_projector():
    gn32 = ResNet18GN(3, 100, groups=32)
    gn2 = ResNet18GN(3, 10, groups=2, projector=128)
    assert {m.num_groups for m in gn32.modules() if isinstance(m, torch.nn.GroupNorm)} == {32}
    assert {m.num_groups for m in gn2.modules() if isinstance(m, torch.nn.GroupNorm)} == {2}
    assert [m.out_features for m in gn2.head] == [128, 10]


def test_fedaware_init_differs_from_default_init_only_in_values():
    torch.manual_seed(0)
    a = CifarCNN(3, 10, init="fedaware")
    torch.manual_seed(0)
    b = CifarCNN(3, 10)
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
    assert float(a.classifier[0].weight.detach().std()) == pytest.approx(0.01, rel=0.1)
    assert all(float(m.bias.detach().abs().sum()) == 0 for m in a.modules() if isinstance(m, torch.nn.Conv2d))


def test_resnet20_runs_on_the_flat_engine(float64_engine):
    """The flat engine's loss and gradient are the module's own: an untouched copy of ResNet-20, run by
    autograd on the same batch (train mode on both, so BatchNorm uses the batch's statistics). Both in float64
    (the float64_engine fixture), so that two orders of the same sums differ by float64 rounding only."""
    import copy

    module = models.build("resnet20", "cifar10")
    plain = copy.deepcopy(module).train()
    flat = FlatModel(module, torch.device("cpu"))
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    assert flat.flat.dtype == images.dtype == torch.float64
    count = summed_inputs(copy.deepcopy(plain), images)  # the whole batch: BatchNorm and the gradients sum over it
    loss = flat.loss_and_grad(torch.nn.functional.cross_entropy, images, labels)
    expected = torch.nn.functional.cross_entropy(plain(images), labels)
    expected.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
    assert torch.isfinite(loss) and flat.grad.abs().sum() > 0
    # forward and backward each within count * u64 of their scale (the loss; the largest gradient entry); a
    # parameter bound to the wrong slice, or another batch, moves them by percents
    torch.testing.assert_close(loss, expected.detach(), rtol=0, atol=count * U64 * float(expected.detach()))
    torch.testing.assert_close(flat.grad, grad, rtol=0, atol=2 * count * U64 * float(grad.abs().max()))


def _conv(c_in, c_out, k, bias=True):
    return c_in * c_out * k * k + (c_out if bias else 0)


def test_fedlaw_alexnet_and_resnet8_parameter_counts_by_hand():
    # AlexNet (CIFAR-10): five biased convs and one Linear(256, 10).
    alexnet = (
        _conv(3, 64, 11)
        + _conv(64, 192, 5)
        + _conv(192, 384, 3)
        + _conv(384, 256, 3)
        + _conv(256, 256, 3)
        + 256 * 10
        + 10
    )
    assert alexnet == 2472266 == catalog.MODELS["alexnet"]["params"]["cifar10"]
    # ResNet-8: bias-free convs, BatchNorm affine (2 per channel), one block per stage, 1x1 shortcuts
    # where the width changes, Linear(64, 10).
    bn = lambda c: 2 * c  # noqa: E731
    stem = _conv(3, 16, 3, bias=False) + bn(16)
    stage1 = 2 * (_conv(16, 16, 3, bias=False) + bn(16))
    stage2 = _conv(16, 32, 3, False) + bn(32) + _conv(32, 32, 3, False) + bn(32) + _conv(16, 32, 1, False) + bn(32)
    stage3 = _conv(32, 64, 3, False) + bn(64) + _conv(64, 64, 3, False) + bn(64) + _conv(32, 64, 1, False) + bn(64)
    resnet8 = stem + stage1 + stage2 + stage3 + 64 * 10 + 10
    assert resnet8 == 78042 == catalog.MODELS["resnet8"]["params"]["cifar10"]
    for name in ("alexnet", "resnet8"):
        assert models.num_parameters(models.build(name, "cifar10")) == catalog.MODELS[name]["params"]["cifar10"]


def test_fedlaw_alexnet_maps_a_cifar_image_to_256_features_and_resnet8_has_one_block_per_stage():
    alexnet = models.build("alexnet", "cifar100")
    assert alexnet.features(torch.zeros(1, 3, 32, 32)).shape == (1, 256, 1, 1)
    assert not any(
        isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm, torch.nn.Dropout)) for m in alexnet.modules()
    )
    resnet8 = models.build("resnet8", "cifar10")
    assert len(resnet8.layers) == 3
    convs = [m for m in resnet8.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) + 1 == 8  # 7 weighted 3x3 convs + the classifier: depth 8


def _cifar_resnet(depth: int, width: int = 1, classes: int = 10) -> int:
    """He et al.'s CIFAR ResNet-(6n+2) with 1x1 conv + BN shortcuts where the shape changes, widths 16k/32k/64k."""
    n, c = (depth - 2) // 6, 16 * width
    bn = lambda ch: 2 * ch  # noqa: E731
    total = _conv(3, c, 3, False) + bn(c)
    in_planes = c
    for planes in (c, 2 * c, 4 * c):
        for _ in range(n):
            total += _conv(in_planes, planes, 3, False) + bn(planes) + _conv(planes, planes, 3, False) + bn(planes)
            if in_planes != planes:
                total += _conv(in_planes, planes, 1, False) + bn(planes)
            in_planes = planes
    return total + 4 * c * classes + classes


def _densenet_bc(blocks=(6, 12, 24, 16), growth: int = 32, classes: int = 10) -> int:
    """DenseNet-BC: per layer BN + 1x1 conv to 4g + BN + 3x3 conv to g; transitions BN + 1x1 conv halving."""
    channels = 2 * growth
    total = _conv(3, channels, 3, False)
    for i, layers in enumerate(blocks):
        for _ in range(layers):
            total += (
                2 * channels
                + _conv(channels, 4 * growth, 1, False)
                + 2 * 4 * growth
                + _conv(4 * growth, growth, 3, False)
            )
            channels += growth
        if i < len(blocks) - 1:
            total += 2 * channels + _conv(channels, channels // 2, 1, False)
            channels //= 2
    return total + 2 * channels + channels * classes + classes


def test_fedlaw_table5_models_parameter_counts_by_hand():
    # He et al. 2016 (Table 6) give 0.27M (ResNet-20), 0.85M (56), 1.7M (110) for their option-A shortcuts;
    # the 1x1 conv shortcuts of Li et al. add a few thousand parameters
    assert _cifar_resnet(8) == catalog.MODELS["resnet8"]["params"]["cifar10"]  # the formula agrees with ResNet-8's
    for name, depth, width, paper in (
        ("resnet20", 20, 1, 0.27e6),
        ("resnet56", 56, 1, 0.85e6),
        ("resnet110", 110, 1, 1.7e6),
        ("wrn56_4", 56, 4, None),
    ):
        count = _cifar_resnet(depth, width)
        assert models.num_parameters(models.build(name, "cifar10")) == count, name
        assert paper is None or abs(count - paper) / paper < 0.03, name
        assert catalog.MODELS[name].get("params", {}).get("cifar10", count) == count
    # DenseNet-BC-121 for CIFAR-10 (Li et al. 2018 / kuangliu's pytorch-cifar): about 6.96 M
    assert _densenet_bc() == 6956298 == catalog.MODELS["densenet121"]["params"]["cifar10"]
    assert models.num_parameters(models.build("densenet121", "cifar10")) == _densenet_bc()
    assert models.num_parameters(models.build("densenet121", "cifar100")) == _densenet_bc(classes=100)


def test_fedlaw_table5_models_shapes_and_batch_statistics():
    wrn = models.build("wrn56_4", "cifar10")
    assert wrn.stem[0].out_channels == 64 and wrn.fc.in_features == 256 and len(wrn.layers) == 27
    dense = models.build("densenet121", "cifar10")
    assert dense.features.conv0.kernel_size == (3, 3) and dense.features.conv0.stride == (1, 1)
    assert dense.features(torch.zeros(1, 3, 32, 32)).shape == (1, 1024, 4, 4)  # 32 -> 16 -> 8 -> 4: no stem pool
    batch = models.build("densenet121", "cifar10", batchnorm="batch_stats")
    assert not list(batch.buffers()) and models.num_parameters(batch) == models.num_parameters(dense)
    batch.eval()
    x = torch.randn(3, 3, 32, 32)
    assert torch.isfinite(batch(x)).all()  # eval mode normalises with the batch's own statistics


def test_ima_feature_skew_models_parameter_counts_by_hand():
    # IMA's Digit-Five CNN (code: mixed_digit_gn): three biased 5x5 convs 3-64-64-128 each with GroupNorm
    # (weight and bias a channel), 28 -> 14 -> 7 -> 3 after three pools, FC 1152-384-128 and the classifier.
    gn = lambda c: 2 * c  # noqa: E731
    digit = (
        _conv(3, 64, 5)
        + gn(64)
        + _conv(64, 64, 5)
        + gn(64)
        + _conv(64, 128, 5)
        + gn(128)
        + 1152 * 384
        + 384
        + 384 * 128
        + 128
        + 128 * 10
        + 10
    )
    assert 128 * 3 * 3 == 1152
    assert digit == 806090 == catalog.MODELS["digit_cnn_gn2"]["params"]["digit5"]
    # IMA's PACS AlexNet (code: alexnet_gn): torchvision's five convs, GroupNorm after each, 224 -> 55 -> 27
    # -> 13 -> 6 (three 3x3 stride-2 pools), adaptive pool 6x6, FC 9216-1024-128 and the classifier (7 classes).
    alexnet = (
        _conv(3, 64, 11)
        + gn(64)
        + _conv(64, 192, 5)
        + gn(192)
        + _conv(192, 384, 3)
        + gn(384)
        + _conv(384, 256, 3)
        + gn(256)
        + _conv(256, 256, 3)
        + gn(256)
        + 256 * 6 * 6 * 1024
        + 1024
        + 1024 * 128
        + 128
        + 128 * 7
        + 7
    )
    assert alexnet == 12042311 == catalog.MODELS["alexnet_gn32"]["params"]["pacs"]
    for name, dataset in (("digit_cnn_gn2", "digit5"), ("alexnet_gn32", "pacs")):
        model = models.build(name, dataset)
        assert models.num_parameters(model) == catalog.MODELS[name]["params"][dataset]
        # FedFA's anchors: the last Linear is the classifier over a 128-d feature; GroupNorm as the code has it
        assert [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1].in_features == 128
        groups = {m.num_groups for m in model.modules() if isinstance(m, torch.nn.GroupNorm)}
        assert groups == ({2} if name == "digit_cnn_gn2" else {32})
    # the Digit CNN's feature is fc2's output without ReLU (the code's forward), AlexNet's after a ReLU
    digit = models.build("digit_cnn_gn2", "digit5")
    assert not isinstance(digit.fc[-1], torch.nn.ReLU) and isinstance(
        models.build("alexnet_gn32", "pacs").fc[-1], torch.nn.ReLU
    )
