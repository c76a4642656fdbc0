"""CIFAR-100's Pachinko allocation (IMA "+PA"): the fine->coarse map, sampling without
replacement, sizes, determinism, the concentration alpha and beta control, and TFF's
renormalisation when labels run out."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ROOT
from fedrepro import identity, partitions
from fedrepro.configure import expansion, paramsfile, schema, settings
from fedrepro.partitions import pachinko
from fedrepro.partitions.base import PartitionError, content_hash
from fedrepro.partitions.pachinko import CIFAR100_COARSE

# The archive's fine_label_names (alphabetical, torchvision's label order) and the superclass table
# of https://www.cs.toronto.edu/~kriz/cifar.html, superclasses in coarse_label_names' order.
FINE_NAMES = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur
dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard
lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear
pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark
shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone
television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split()
SUPERCLASSES = [
    ("aquatic_mammals", "beaver dolphin otter seal whale"),
    ("fish", "aquarium_fish flatfish ray shark trout"),
    ("flowers", "orchid poppy rose sunflower tulip"),
    ("food_containers", "bottle bowl can cup plate"),
    ("fruit_and_vegetables", "apple mushroom orange pear sweet_pepper"),
    ("household_electrical_devices", "clock keyboard lamp telephone television"),
    ("household_furniture", "bed chair couch table wardrobe"),
    ("insects", "bee beetle butterfly caterpillar cockroach"),
    ("large_carnivores", "bear leopard lion tiger wolf"),
    ("large_man-made_outdoor_things", "bridge castle house road skyscraper"),
    ("large_natural_outdoor_scenes", "cloud forest mountain plain sea"),
    ("large_omnivores_and_herbivores", "camel cattle chimpanzee elephant kangaroo"),
    ("medium_mammals", "fox porcupine possum raccoon skunk"),
    ("non-insect_invertebrates", "crab lobster snail spider worm"),
    ("people", "baby boy girl man woman"),
    ("reptiles", "crocodile dinosaur lizard snake turtle"),
    ("small_mammals", "hamster mouse rabbit shrew squirrel"),
    ("trees", "maple_tree oak_tree palm_tree pine_tree willow_tree"),
    ("vehicles_1", "bicycle bus motorcycle pickup_truck train"),
    ("vehicles_2", "lawn_mower rocket streetcar tank tractor"),
]


def _cifar100_like(per_label: int) -> np.ndarray:
    """Fine labels 0..99, ``per_label`` samples each, in a shuffled order."""
    return np.random.default_rng(0).permutation(np.repeat(np.arange(100), per_label))


def test_fine_to_coarse_map_is_the_cifar_pages_superclass_table():
    assert len(FINE_NAMES) == 100 and FINE_NAMES == sorted(FINE_NAMES)
    assert sorted(FINE_NAMES) == sorted(n for _, members in SUPERCLASSES for n in members.split())
    expected = [
        next(c for c, (_, members) in enumerate(SUPERCLASSES) if name in members.split()) for name in FINE_NAMES
    ]
    assert CIFAR100_COARSE.tolist() == expected
    assert np.bincount(CIFAR100_COARSE).tolist() == [5] * 20


def test_every_sample_at_most_once_and_sizes_as_asked():
    labels = _cifar100_like(20)  # 2,000 samples
    parts = pachinko.split(labels, CIFAR100_COARSE[labels], 12, np.random.default_rng(3), 0.1, 10, 150)
    assert [len(p) for p in parts] == [150] * 12
    used = np.concatenate(parts)
    assert len(np.unique(used)) == len(used) == 1800
    assert used.min() >= 0 and used.max() < len(labels)


def test_default_size_uses_the_whole_training_set_once():
    # IMA: 100 clients on 50,000 images -> 500 each; here 10 clients on 1,000 -> 100 each, all used.
    labels = _cifar100_like(10)
    parts = pachinko.split(labels, CIFAR100_COARSE[labels], 10, np.random.default_rng(1), 0.1, 10)
    assert [len(p) for p in parts] == [100] * 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))


def test_same_seed_same_partition_other_seed_other_partition():
    labels = _cifar100_like(10)
    setting = {"kind": "pachinko", "num_clients": 8, "seed": 5, "alpha": 0.1, "beta": 10, "samples_per_client": 60}
    a, b = partitions.make(labels, setting), partitions.make(labels, setting)
    c = partitions.make(labels, {**setting, "seed": 6})
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert content_hash(a) != content_hash(c)


def _distinct_per_client(parts, of) -> list[int]:
    return [len(np.unique(of[p])) for p in parts]


def test_alpha_controls_how_many_coarse_labels_a_client_holds():
    # 5,000 samples, 10 clients x 50: 10% drawn, so exhaustion plays no part.
    labels = _cifar100_like(50)
    coarse = CIFAR100_COARSE[labels]
    peaked = pachinko.split(labels, coarse, 10, np.random.default_rng(0), 0.001, 10, 50)
    flat = pachinko.split(labels, coarse, 10, np.random.default_rng(0), 1000.0, 10, 50)
    # Dir(0.001) over 20 coarse labels is one-hot to float precision; Dir(1000) near uniform, where
    # 50 draws hit 20 (1 - (19/20)^50) = 18.5 coarse labels on average.
    assert max(_distinct_per_client(peaked, coarse)) <= 2
    assert min(_distinct_per_client(flat, coarse)) >= 15


def test_beta_controls_how_many_fine_labels_under_a_coarse_label():
    labels = _cifar100_like(50)
    coarse = CIFAR100_COARSE[labels]
    peaked = pachinko.split(labels, coarse, 10, np.random.default_rng(0), 0.001, 0.001, 50)
    spread = pachinko.split(labels, coarse, 10, np.random.default_rng(0), 0.001, 1000.0, 50)
    assert max(_distinct_per_client(peaked, labels)) <= 2  # one coarse label, one fine label
    assert min(_distinct_per_client(spread, labels)) >= 4  # one coarse label, its 5 fine labels


class FixedDirichlet:
    """A generator whose Dirichlet draws are given (in order); everything else is a real generator."""

    def __init__(self, draws, seed=0):
        self.draws, self.rng = list(draws), np.random.default_rng(seed)

    def dirichlet(self, alpha):
        out = np.asarray(self.draws.pop(0), dtype=float)
        assert out.shape == np.shape(alpha)
        return out

    def __getattr__(self, name):
        return getattr(self.rng, name)


def test_an_exhausted_fine_label_is_renormalised_inside_its_coarse_label():
    # coarse 0 = {fine 0: 1 sample, fine 1: 50}, coarse 1 = {fine 2: 100}. theta = (0.5, 0.5),
    # phi_0 = (0.99, 0.01). Once fine 0 is used up, TFF renormalises phi_0, so coarse-0 draws (half of
    # them) go to fine 1: about 20 of 40. Renormalising the joint instead would give fine 1 weight
    # 0.005 / 0.505, i.e. about 0.4 samples.
    labels = np.repeat([0, 1, 2], [1, 50, 100])
    coarse = np.array([0, 0, 1])[labels]
    rng = FixedDirichlet([[0.5, 0.5], [0.99, 0.01], [1.0]])
    (part,) = pachinko.split(labels, coarse, 1, rng, 0.1, 10, 40)
    counts = np.bincount(labels[part], minlength=3)
    assert counts.sum() == 40 and counts[0] <= 1
    assert counts[1] >= 10


def test_an_exhausted_coarse_label_leaves_theta_even_when_it_held_all_the_mass():
    # theta puts all its mass on coarse 0, which holds 51 samples; the client asks for 60. It takes
    # all of coarse 0, then coarse 0 is dropped and the rest comes from coarse 1 (zero mass left:
    # the remaining labels become equally likely).
    labels = np.repeat([0, 1, 2], [1, 50, 100])
    coarse = np.array([0, 0, 1])[labels]
    rng = FixedDirichlet([[1.0, 0.0], [0.5, 0.5], [1.0]])
    (part,) = pachinko.split(labels, coarse, 1, rng, 0.1, 10, 60)
    counts = np.bincount(labels[part], minlength=3)
    assert counts.tolist() == [1, 50, 9]
    assert len(np.unique(part)) == 60


def test_too_many_samples_and_ambiguous_coarse_labels_are_refused():
    labels = _cifar100_like(2)
    with pytest.raises(PartitionError, match="need 210 samples"):
        pachinko.split(labels, CIFAR100_COARSE[labels], 3, np.random.default_rng(0), 0.1, 10, 70)
    with pytest.raises(PartitionError, match="exactly one coarse label"):
        pachinko.split(np.array([0, 0, 1]), np.array([0, 1, 1]), 1, np.random.default_rng(0), 0.1, 10, 2)


def test_settings_resolve_name_and_check_pachinko():
    base = {"dataset": "cifar100", "model": "cnn", "num_clients": 100, "partition": {"kind": "pachinko", "alpha": 0.1}}
    s = settings.resolve(base)
    # null is resolved before the partition is named: the training set // num_clients, as IMA's 100 x 500
    assert s["partition"] == {"kind": "pachinko", "seed": 1, "alpha": 0.1, "beta": 10, "samples_per_client": 500}
    assert identity.partition_id(s).startswith("cifar100-pa0.1b10-n100-")
    with pytest.raises(schema.ConfigError, match="partition.kind = pachinko needs coarse labels"):
        settings.resolve({**base, "dataset": "cifar10"})
    with pytest.raises(schema.ConfigError, match="samples_per_client = 600"):
        settings.resolve({**base, "partition": {"kind": "pachinko", "samples_per_client": 600}})


def test_ima_cifar100_runs_are_pachinko_and_join_the_papers_pa_rows():
    from fedrepro.report import paper

    params = paramsfile.load_params(ROOT / "params" / "ima.yaml")
    params["only"] = "ima_table1_cifar100_*"
    from fedrepro.ops import plan

    tunings: dict = {}
    runs = [r for r in expansion.expand(params, tunings) if not r.tuning]
    runs += plan.final_runs(tunings, "no-such-folder")[0]  # the tuned methods' runs (FedProx, FedFA)
    assert runs and {r.setting["dataset"] for r in runs} == {"cifar100"}
    assert all(
        r.setting["partition"] == {"kind": "pachinko", "seed": 1, "alpha": 0.1, "beta": 10, "samples_per_client": 500}
        for r in runs
    )
    pa_cells = [c for c in paper.cells(paper.load_results(), ["ima_table1"]) if "(+PA)" in c.row]
    assert len(pa_cells) == 32
    methods = {r.setting["algorithm"] for r in runs}
    assert methods >= {"fedavg", "fedprox", "fednova", "fedadam", "fedyogi"}
    for cell in pa_cells:
        joined = [r for r in runs if paper.matches(r.setting, cell.match)]
        # every method the file runs fills its cells with 3 seeds; the others show as not reproduced
        assert len(joined) == (3 if cell.match["algorithm"] in methods else 0), (cell.row, cell.column)
