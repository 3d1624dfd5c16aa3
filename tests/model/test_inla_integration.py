"""`pymc_optim.model.inla_integration`: the integration rules of `fit_inla`, on closed forms.

The rules are numpy functions of a log density; here the log densities are written in numpy,
with known moments: a correlated bivariate Gaussian (mean μ, covariance Σ) and the log of a
Gamma(a, b) variable, θ = log x, whose density a θ − b e^θ (+ c) is skewed, with
E[θ] = ψ(a) − log b and Var[θ] = ψ′(a).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy.special import digamma, polygamma

from pymc_optim.model import inla_integration as rules

MEAN = np.array([0.7, -1.2])
COVARIANCE = np.array([[2.0, 0.6], [0.6, 0.5]])
SD = np.sqrt(np.diag(COVARIANCE))
GAMMA_A, GAMMA_B = 3.0, 2.0


def gaussian_log_density(points):
    d = np.atleast_2d(points) - MEAN
    return -0.5 * np.einsum("ni,ij,nj->n", d, np.linalg.inv(COVARIANCE), d)


def gaussian_scale():
    """L with L Lᵀ = Σ, from the eigendecomposition of the precision (as fit_inla builds it)."""
    eigenvalues, eigenvectors = np.linalg.eigh(np.linalg.inv(COVARIANCE))
    return eigenvectors / np.sqrt(eigenvalues)


def log_gamma_log_density(points):
    theta = np.atleast_2d(points)[:, 0]
    return GAMMA_A * theta - GAMMA_B * np.exp(theta)


def log_gamma_fit():
    """Mode log(a/b), its log density and L = curvature^(-1/2) = a^(-1/2)."""
    mode = np.array([np.log(GAMMA_A / GAMMA_B)])
    return mode, float(log_gamma_log_density(mode)[0]), np.array([[1 / np.sqrt(GAMMA_A)]])


LOG_GAMMA_MEAN = digamma(GAMMA_A) - np.log(GAMMA_B)
LOG_GAMMA_SD = np.sqrt(polygamma(1, GAMMA_A))


def identity(points):
    return [np.atleast_2d(points)]


def test_the_rules_import_without_pymc_or_pytensor():
    """The rules and the CCD design load on numpy and scipy alone: their package's
    ``__init__`` modules (which import PyMC) are stood in for by empty packages."""
    package = Path(rules.__file__).parents[1]
    script = textwrap.dedent(
        f"""
        import sys, types
        for name, path in [("pymc_optim", {str(package)!r}),
                           ("pymc_optim.model", {str(package / "model")!r})]:
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [path]
            sys.modules[name] = stand_in
        import pymc_optim.model.inla_integration
        import pymc_optim.model.inla_ccd
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("pymc", "pytensor"))
        print(heavy)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_grid_on_a_correlated_gaussian():
    """The grid's support has the Gaussian's mean (by symmetry, to rounding) and sds up to the
    mass outside its box, which ends where the density has dropped by e^-7.5 (|z| ≳ 3.9, a
    tail holding under 0.2% of the variance); the draws' mean is within 5 Monte Carlo sds."""
    draws = 4000
    result = rules.grid(
        gaussian_log_density, MEAN, 0.0, gaussian_scale(), draws, np.random.default_rng(0)
    )
    mean, sd = rules.moments([result.support], result.support_weights)
    assert_allclose(mean, MEAN, rtol=0, atol=1e-12)
    assert_allclose(sd, SD, rtol=2e-3)
    assert_allclose(np.exp(result.log_weights).sum(), 1.0)
    assert_allclose(result.log_density, gaussian_log_density(result.points))
    assert np.all(np.abs(result.draws.mean(axis=0) - MEAN) < 5 * SD / np.sqrt(draws))


def test_grid_on_a_skewed_log_gamma():
    """A skewed density: the grid's interpolated lattice gives the mean within 0.005 sd and the
    sd within 0.5% (the cubic interpolation's and the box's errors)."""
    mode, lp_mode, scale = log_gamma_fit()
    result = rules.grid(log_gamma_log_density, mode, lp_mode, scale, 100, np.random.default_rng(1))
    mean, sd = rules.moments([result.support], result.support_weights)
    assert abs(mean[0] - LOG_GAMMA_MEAN) < 0.005 * LOG_GAMMA_SD
    assert_allclose(sd[0], LOG_GAMMA_SD, rtol=5e-3)


def test_ccd_integrates_a_gaussians_first_two_moments_exactly():
    """The design's weights integrate a standard Gaussian and its second moment exactly, so on
    a Gaussian its means and sds are exact to rounding; both split-normal scales are 1, and the
    split normal's 100,000 draws give means within 0.02 sd of the design's (6 Monte Carlo sds)."""
    rng = np.random.default_rng(0)
    progress = []

    class Count:
        def add(self, n):
            progress.append(n)

    result = rules.ccd(
        gaussian_log_density,
        MEAN,
        0.0,
        gaussian_scale(),
        500,
        rng,
        constrained=identity,
        progress=Count(),
    )
    assert len(result.points) == 1 + 2 * 2 + 4  # centre, axial points, 2² fraction
    assert progress == [len(result.points) - 1]  # the centre's density is given
    mean, sd = result.moments
    assert_allclose(mean, MEAN, rtol=0, atol=1e-12)
    assert_allclose(sd, SD, rtol=1e-12)
    assert_allclose(result.extra["split_normal_scales"], 1.0, rtol=1e-12)
    assert np.all(result.extra["fit_mean_gap_sd"] < 0.02)
    assert result.draws.shape == (500, 2)


def test_importance_on_a_gaussian_and_a_skewed_log_gamma():
    """A Student-t proposal covers a Gaussian's tails: k̂ below 0.7, and the weighted means
    and sds within 5 Monte Carlo sds of the exact ones (ESS from the weights)."""
    cases = [
        (gaussian_log_density, MEAN, 0.0, gaussian_scale(), MEAN, SD),
        (log_gamma_log_density, *log_gamma_fit(), [LOG_GAMMA_MEAN], [LOG_GAMMA_SD]),
    ]
    for log_density, mode, lp_mode, scale, exact_mean, exact_sd in cases:
        result = rules.importance(log_density, mode, lp_mode, scale, 1000, np.random.default_rng(2))
        assert result.pareto_k < 0.7
        ess = 1.0 / np.sum(result.support_weights**2)
        mean, sd = rules.moments([result.support], result.support_weights)
        assert np.all(np.abs(mean - exact_mean) < 5 * np.asarray(exact_sd) / np.sqrt(ess))
        assert np.all(np.abs(sd / exact_sd - 1) < 5 / np.sqrt(2 * ess))


def test_empirical_bayes_is_the_mode_alone():
    mode = np.array([0.3, -0.1])
    result = rules.empirical_bayes(
        gaussian_log_density, mode, -1.5, np.eye(2), 7, np.random.default_rng(0)
    )
    assert_allclose(result.points, [mode])
    assert_allclose(result.log_density, [-1.5])
    assert_allclose(result.draws, np.repeat([mode], 7, axis=0))
    assert_allclose(result.support_weights, [1.0])


@pytest.mark.parametrize(
    ("log_values", "expected"),
    [([0.0, np.log(3.0)], [0.25, 0.75]), ([5.0, 5.0, -np.inf], [0.5, 0.5, 0.0])],
)
def test_normalized_weights(log_values, expected):
    assert_allclose(rules.normalize(log_values), expected, rtol=1e-15)
    with np.errstate(divide="ignore"):
        assert_allclose(rules.log_normalize(log_values), np.log(expected), rtol=1e-15)
