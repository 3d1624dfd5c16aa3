"""`pymc_optim.laplace_error` and fit_inla's check of the Laplace error in θ.

References: a Gaussian likelihood, where the Laplace marginal is exact (δ = 0); Poisson random
intercepts with a few counts per group, where log p(y | θ) is a product of one-dimensional
integrals that scipy's adaptive quadrature computes independently of PyMC; and (slow) a long
full-NUTS run stored in ``benchmarks/laplace_error_reference_G300.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest
import scipy.integrate
import scipy.stats
from scipy.special import gammaln

import pymc_optim as pmo
from pymc_optim.model import laplace_error as laplace_error_module

F64 = np.float64
#: Poisson counts, two per group: zeros and small counts, where the Laplace error is largest
COUNTS = np.array([[0, 0], [1, 0], [3, 2], [0, 4], [1, 1]])
GROUP = np.repeat(np.arange(len(COUNTS)), COUNTS.shape[1])
#: one count in each of 20 groups: enough groups that the correction moves sigma's mean by a
#: few hundredths of a posterior sd
SPARSE_COUNTS = np.array([1, 3, 1, 0, 2, 2, 1, 1, 0, 2, 0, 2, 1, 1, 1, 1, 0, 3, 0, 0])[:, None]
#: θ = (mu, log sigma) at which δ is checked
THETAS = np.array([[0.3, np.log(0.8)], [-0.5, np.log(1.5)], [1.0, np.log(0.3)]])


def gaussian_model(n_groups: int = 6) -> pm.Model:
    y = np.linspace(-1.0, 2.0, n_groups)
    with pm.Model() as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, shape=n_groups)
        pm.Normal("y", u, F64(0.5), observed=y)
    return model


def poisson_model(counts=COUNTS) -> pm.Model:
    group = np.repeat(np.arange(len(counts)), counts.shape[1])
    with pm.Model() as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, shape=len(counts))
        pm.Poisson("y", pm.math.exp(u[group]), observed=counts.ravel())
    return model


def exact_log_likelihood(mu, sigma, counts=COUNTS) -> float:
    """log p(y | mu, sigma) = Σ_g log ∫ N(u; mu, sigma) Π_j Poisson(y_gj | e^u) du, each
    integral by scipy's adaptive quadrature around its peak (Newton on the log integrand)."""
    total = 0.0
    for y in counts:

        def log_integrand(u, y=y):
            return scipy.stats.norm.logpdf(u, mu, sigma) + np.sum(
                y * u - np.exp(u) - gammaln(y + 1)
            )

        u = mu
        for _ in range(100):  # Newton to the peak (log-concave)
            slope = -(u - mu) / sigma**2 + y.sum() - y.size * np.exp(u)
            u += slope / (1 / sigma**2 + y.size * np.exp(u))
        peak = log_integrand(u)
        width = 1 / np.sqrt(1 / sigma**2 + y.size * np.exp(u))
        value, _ = scipy.integrate.quad(
            lambda v, peak=peak: np.exp(log_integrand(v) - peak),
            u - 40 * width,
            u + 40 * width,
            epsabs=0.0,
            epsrel=1e-12,
            limit=200,
        )
        total += peak + np.log(value)
    return total


def laplace_log_likelihood(mu, sigma, counts=COUNTS) -> float:
    """The Laplace value of `exact_log_likelihood`, in numpy."""
    total = 0.0
    for y in counts:
        u = mu
        for _ in range(100):
            slope = -(u - mu) / sigma**2 + y.sum() - y.size * np.exp(u)
            u += slope / (1 / sigma**2 + y.size * np.exp(u))
        h = 1 / sigma**2 + y.size * np.exp(u)
        peak = scipy.stats.norm.logpdf(u, mu, sigma) + np.sum(y * u - np.exp(u) - gammaln(y + 1))
        total += peak + 0.5 * np.log(2 * np.pi) - 0.5 * np.log(h)
    return total


@pytest.fixture(scope="module")
def poisson_marginal():
    return pmo.marginalize_laplace(poisson_model(), "u")


def test_gaussian_likelihood_gives_zero_correction():
    marginal = pmo.marginalize_laplace(gaussian_model(), "u")
    error = pmo.laplace_error(marginal, THETAS)
    assert error.method == "quadrature"
    np.testing.assert_allclose(error.correction, 0.0, atol=1e-10)
    assert np.all(np.isnan(error.pareto_k))
    assert np.all(np.isnan(error.mean_shift_sd))  # points only: no posterior to reweight


def test_gaussian_likelihood_importance_gives_zero_correction():
    # a dense H: importance sampling, whose log weights are exactly 0 for a Gaussian ℓ
    marginal = pmo.marginalize_laplace(gaussian_model(), "u", hessian_structure="dense")
    error = pmo.laplace_error(marginal, THETAS[:2], draws=20, random_seed=1)
    assert error.method == "importance"
    np.testing.assert_allclose(error.correction, 0.0, atol=1e-10)


def test_poisson_correction_matches_quadrature(poisson_marginal):
    error = pmo.laplace_error(poisson_marginal, THETAS)
    exact = np.array([exact_log_likelihood(mu, np.exp(s)) for mu, s in THETAS])
    laplace = np.array([laplace_log_likelihood(mu, np.exp(s)) for mu, s in THETAS])
    reference = exact - laplace
    assert np.all(np.abs(reference) > 1e-3)  # measurably non-zero
    np.testing.assert_allclose(error.correction, reference, rtol=0, atol=1e-8)
    # and the marginal's own value plus δ is log p(y | θ)
    potential = poisson_marginal.compile_logp(vars=poisson_marginal.potentials)
    for (mu, log_sigma), delta, value in zip(THETAS, error.correction, exact, strict=True):
        marginal = potential({"mu": mu, "sigma_log__": log_sigma})
        np.testing.assert_allclose(marginal + delta, value, rtol=0, atol=1e-8)


def test_poisson_importance_agrees_with_quadrature(poisson_marginal):
    quadrature = pmo.laplace_error(poisson_marginal, THETAS, method="quadrature")
    importance = pmo.laplace_error(
        poisson_marginal, THETAS, method="importance", draws=4000, random_seed=3
    )
    assert importance.method == "importance"
    assert np.all(importance.pareto_k < 0.7)
    # Monte Carlo error of log mean w from 4,000 draws: ~0.003 here
    np.testing.assert_allclose(importance.correction, quadrature.correction, atol=0.02)


def test_posterior_draws_give_mean_shifts(poisson_marginal):
    rng = np.random.default_rng(0)
    posterior = {
        "mu": rng.normal(0.3, 0.4, (2, 300)),
        "sigma": np.exp(rng.normal(np.log(0.8), 0.3, (2, 300))),
    }
    idata = az.from_dict({"posterior": posterior})
    error = pmo.laplace_error(poisson_marginal, idata)
    assert error.points.shape == (5, 2)  # the centre and ±√3 sds along two axes
    assert error.hyperparameters == ["mu", "sigma"]
    assert np.all(np.isfinite(error.mean_shift_sd))
    # the correction favours larger sigma here (δ grows with sigma at these counts)
    order = np.argsort(error.points[:, 1])
    assert error.correction[order[-1]] > error.correction[order[0]]
    assert error.mean_shift_sd[1] > 0
    dataset = error.to_dataset()
    assert dataset["laplace_correction"].dims == ("laplace_point",)
    assert dataset.attrs["laplace_error_method"] == "quadrature"


def test_bad_input(poisson_marginal):
    with pytest.raises(ValueError, match="`method` must be one of"):
        pmo.laplace_error(poisson_marginal, THETAS, method="exact")
    with pytest.raises(ValueError, match="`draws` must be an integer of at least 2"):
        pmo.laplace_error(poisson_marginal, THETAS, method="importance", draws=1)
    with pytest.raises(ValueError, match=r"must be an \(n, 2\) array.*got shape \(3, 3\)"):
        pmo.laplace_error(poisson_marginal, np.zeros((3, 3)))
    with pytest.raises(TypeError, match="`posterior` of `laplace_error` must be"):
        pmo.laplace_error(poisson_marginal, {"mu": 0.0})
    with pytest.raises(ValueError, match=r"lacks the hyperparameters \['sigma'\]"):
        pmo.laplace_error(poisson_marginal, az.from_dict({"posterior": {"mu": np.zeros((1, 9))}}))
    with pytest.raises(TypeError, match="must be a model returned by `pmo.marginalize_laplace`"):
        pmo.laplace_error(poisson_model(), THETAS)
    dense = pmo.marginalize_laplace(gaussian_model(), "u", hessian_structure="dense")
    with pytest.raises(ValueError, match="`method='quadrature'` needs a diagonal H"):
        pmo.laplace_error(dense, THETAS, method="quadrature")


def test_fit_inla_gaussian_no_warning():
    # (the package's warnings are errors in the test suite)
    idata = pmo.fit_inla(gaussian_model(), "u", draws=50, random_seed=1, progressbar=False)
    inla = idata.inla
    assert inla.attrs["laplace_error_method"] == "quadrature"
    assert inla.attrs["laplace_corrected"] == 0
    assert 0 < inla.attrs["laplace_error_time_fraction"] < 1
    np.testing.assert_allclose(inla["laplace_correction"].values, 0.0, atol=1e-10)
    np.testing.assert_allclose(inla["laplace_mean_shift_sd"].values, 0.0, atol=1e-8)
    assert inla["laplace_points"].shape == (5, 2)

    skipped = pmo.fit_inla(
        gaussian_model(), "u", draws=50, random_seed=1, progressbar=False, laplace_error=False
    )
    assert "laplace_correction" not in skipped.inla
    dense = pmo.fit_inla(
        gaussian_model(),
        "u",
        draws=50,
        random_seed=1,
        progressbar=False,
        hessian_structure="dense",
    )
    assert dense.inla.attrs["laplace_error_method"].startswith("not run: H is 'dense'")


def test_fit_inla_warns_and_corrects(monkeypatch):
    # twenty groups carry little information on sigma, so the correction moves its mean by a
    # few hundredths of an sd (-0.04): a lowered threshold shows the warning on a fast model
    monkeypatch.setattr(laplace_error_module, "MEAN_SHIFT_THRESHOLD_SD", 0.01)
    with pytest.warns(pmo.PymcOptimWarning, match=r"moves the posterior mean of 'sigma' by -0"):
        idata = pmo.fit_inla(
            poisson_model(SPARSE_COUNTS), "u", draws=50, random_seed=1, progressbar=False
        )
    shift = idata.inla["laplace_mean_shift_sd"].values
    assert shift[1] < -0.01

    corrected = pmo.fit_inla(
        poisson_model(SPARSE_COUNTS),
        "u",
        draws=50,
        random_seed=1,
        progressbar=False,
        laplace_correction=True,
    )  # no warning: the correction is applied
    inla, fixed = idata.inla, corrected.inla
    assert fixed.attrs["laplace_corrected"] == 1
    moved = (fixed["mean"].values - inla["mean"].values) / inla["sd"].values
    # the corrected fit moves the means as estimated (its grid is centred elsewhere: ~0.01 sd)
    np.testing.assert_allclose(moved, shift, atol=0.02)
    np.testing.assert_allclose(fixed["laplace_mean_shift_sd"].values, shift, atol=0.02)


def test_fit_inla_flags():
    with pytest.raises(TypeError, match="`laplace_error` must be True or False; got 'yes'"):
        pmo.fit_inla(gaussian_model(), "u", laplace_error="yes")
    with pytest.raises(TypeError, match="`laplace_correction` must be True or False; got 1"):
        pmo.fit_inla(gaussian_model(), "u", laplace_correction=1)


@pytest.mark.slow
def test_poisson_300_against_long_nuts():
    """Poisson random intercepts, G = 300, 5 counts per group (bench_inla's generator):
    fit_inla's sigma is 0.1 sd low, the check says so, and the corrected fit is within
    0.05 sd of a long full-NUTS run (its Monte Carlo error: ~0.015 sd)."""
    path = Path(__file__).parents[2] / "benchmarks" / "laplace_error_reference_G300.json"
    reference = json.loads(path.read_text())["posterior"]
    rng = np.random.default_rng(300)
    n_groups = 300
    group = np.repeat(np.arange(n_groups), 5)
    counts = rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, n_groups))[group])

    def model():
        with pm.Model() as model:
            mu = pm.Normal("mu", F64(0.0), F64(2.0))
            sigma = pm.HalfNormal("sigma", F64(1.0))
            u = pm.Normal("u", mu, sigma, shape=n_groups)
            pm.Poisson("y", pm.math.exp(u[group]), observed=counts)
        return model

    with pytest.warns(pmo.PymcOptimWarning, match="'sigma' by \\+0.11 posterior sd"):
        idata = pmo.fit_inla(model(), "u", random_seed=1, progressbar=False)
    corrected = pmo.fit_inla(
        model(), "u", random_seed=1, progressbar=False, laplace_correction=True
    )
    for name in ("mu", "sigma"):
        ref = reference[name]
        before = (float(idata.inla["mean"].sel(hyperparameter=name)) - ref["mean"]) / ref["sd"]
        after = (float(corrected.inla["mean"].sel(hyperparameter=name)) - ref["mean"]) / ref["sd"]
        assert abs(after) < 0.05, (name, before, after)
    sigma_before = (
        float(idata.inla["mean"].sel(hyperparameter="sigma")) - reference["sigma"]["mean"]
    ) / reference["sigma"]["sd"]
    assert sigma_before < -0.08
