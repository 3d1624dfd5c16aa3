"""The Rust (1987) data loader reproduces the counts and first stage of the data's README."""

import numpy as np
import pytest

from pymc_optim.datasets import Rust1987Data, load_rust1987
from pymc_optim.datasets.rust1987 import (
    transition_log_likelihood,
    transition_matrix,
    transition_probabilities,
)
from pymc_optim.datasets.rust1987.data import _read_buses

# README: group 4 at n = 90 has 4,292 observations and 33 replacements; Table IX's first stage
# θ₃ = (0.3919, 0.5953), and full minus choice log-likelihood −3304.155 − (−163.584).
GROUP4_OBSERVATIONS, GROUP4_REPLACEMENTS = 4292, 33
THETA3 = (0.3919, 0.5953)
TRANSITION_LOGLIK = -3304.155 + 163.584


@pytest.fixture(scope="module")
def group4():
    return load_rust1987(4, n=90)


def test_group_4_counts_match_the_readme(group4):
    assert isinstance(group4, Rust1987Data)
    assert len(group4) == GROUP4_OBSERVATIONS
    assert group4.decision.sum() == GROUP4_REPLACEMENTS
    assert len(np.unique(group4.bus)) == 37  # 37 buses with 117 months each, first dropped
    assert np.all(group4.group == 4) and group4.n == 90


def test_first_stage_reproduces_table_ix(group4):
    p = transition_probabilities(group4.increment)
    np.testing.assert_allclose(p[:2], THETA3, atol=5e-5)  # published to 4 decimals
    assert p.sum() == pytest.approx(1.0)
    assert transition_log_likelihood(group4.increment, p) == pytest.approx(
        TRANSITION_LOGLIK, abs=1e-3
    )


def test_one_bus_by_hand(group4):
    """Bus 5297: engine replaced once, at odometer 153,400 (its header); processed by hand."""
    header, odometer = next((h, o) for h, o in _read_buses(4) if h[0] == 5297)
    assert header[5] == 153_400 and header[8] == 0
    t_new = int(np.flatnonzero(odometer >= 153_400)[0])  # first month on the new engine
    mileage = np.where(np.arange(len(odometer)) >= t_new, odometer - 153_400, odometer)
    one_based = np.ceil(90 * mileage / 450_000).astype(int)
    mine = group4.bus == 5297
    np.testing.assert_array_equal(group4.state[mine], one_based[1:] - 1)
    expected_decision = np.zeros(len(odometer), dtype=int)
    expected_decision[t_new - 1] = 1
    np.testing.assert_array_equal(group4.decision[mine], expected_decision[1:])
    increments = np.diff(one_based)
    increments[t_new - 1] = one_based[t_new]  # after the replacement: bins from mileage 0
    np.testing.assert_array_equal(group4.increment[mine], increments)


def test_states_and_increments_agree_between_replacements(group4):
    same_bus = group4.bus[1:] == group4.bus[:-1]
    kept = same_bus & (group4.decision[:-1] == 0)
    np.testing.assert_array_equal(
        group4.state[1:][kept] - group4.state[:-1][kept], group4.increment[1:][kept]
    )
    assert group4.state.min() >= 0 and group4.state.max() <= 89
    assert set(np.unique(group4.increment)) == {0, 1, 2}


def test_coarser_grid_merges_bins(group4):
    """Bin s of n = 90 holds (5000 s, 5000 (s+1)]; bin k of n = 45 holds (10⁴ k, 10⁴ (k+1)]."""
    coarse = load_rust1987(4, n=45)
    np.testing.assert_array_equal(coarse.state, group4.state // 2)
    np.testing.assert_array_equal(coarse.decision, group4.decision)


def test_groups_concatenate():
    one, two = load_rust1987(1), load_rust1987(2)
    both = load_rust1987([1, 2])
    assert len(both) == len(one) + len(two)
    np.testing.assert_array_equal(both.state, np.concatenate([one.state, two.state]))
    np.testing.assert_array_equal(both.group, np.repeat([1, 2], [len(one), len(two)]))


def test_transition_matrix_truncates_at_the_top():
    P = transition_matrix([0.5, 0.3, 0.2], 4)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_allclose(P[0, :3], [0.5, 0.3, 0.2])
    np.testing.assert_allclose(P[2], [0.0, 0.0, 0.5, 0.5])
    np.testing.assert_allclose(P[3], [0.0, 0.0, 0.0, 1.0])


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match=r"`groups` must be Rust's bus groups 1-8; got \[9\]"):
        load_rust1987(9)
    with pytest.raises(ValueError, match=r"`groups` lists a group more than once \(\[1, 1\]\)"):
        load_rust1987([1, 1])
    with pytest.raises(ValueError, match="`n` must be a positive integer"):
        load_rust1987(4, n=0)
    with pytest.raises(ValueError, match="`increment` must be a non-empty array"):
        transition_probabilities(np.array([1, -1]))
