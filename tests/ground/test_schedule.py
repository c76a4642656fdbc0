"""fedrepro.schedule against the plain arithmetic: a round's cohort size and its client lr."""

import math

import pytest

from fedrepro import schedule


@pytest.mark.parametrize(
    "participation,num_clients,expected",
    [
        (0.29, 100, 29),  # 0.29 * 100 = 28.999999999999996 in binary: the margin keeps the 29 clients meant
        (0.1, 30, 3),  # 3.0000000000000004
        (0.15, 10, 1),  # 1.5: floor, not round
        (0.05, 40, 2),
        (1.0, 7, 7),
        (0.999, 10, 9),
    ],
)
def test_cohort_size_is_the_floor_of_participation_times_clients(participation, num_clients, expected):
    assert schedule.cohort_size({"participation": participation, "num_clients": num_clients}) == expected


def test_client_lr_without_milestones_is_the_exponential_decay():
    """A setting that declares no milestones (settings written before the keys existed) decays only."""
    setting = {"rounds": 10, "client": {"lr": 0.5, "lr_decay": 0.9}}
    for t in range(10):
        assert math.isclose(schedule.client_lr(setting, t), 0.5 * 0.9**t, rel_tol=1e-15)


def test_client_lr_drops_by_a_tenth_at_each_milestone_when_no_factor_is_given():
    """FedNova's schedule: /10 at 50% and 75% of the rounds, a milestone passed from its round on."""
    setting = {"rounds": 8, "client": {"lr": 0.2, "lr_decay": 1.0, "lr_milestones": [0.5, 0.75]}}
    got = [schedule.client_lr(setting, t) for t in range(8)]
    want = [0.2] * 4 + [0.02] * 2 + [0.002] * 2
    assert got == pytest.approx(want, rel=1e-15)
