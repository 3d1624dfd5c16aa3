"""Model-level gradients: each helper's compiled ``dlogp`` against central finite differences of
its compiled ``logp``, at several random points of the hyperparameters.

Sampling tests cannot see a wrong gradient (NUTS stays exact with any gradient), so these are
the tests that catch an error in the implicit rule as the models use it: scaling the implicit
pullback's solution w by 0.7 in `implicit/rule.py` (`implicit_pullback`) fails every case below,
the five Laplace structures, Optimum (Newton), the portfolio (KKT), Equilibrium by the default
`root` (hybr) and by Newton, and the Rust model (run by hand: 10 of 10 fail, with largest
relative errors from 0.17 % for the random walk to 314 % for Rust). The Laplace models have a
Poisson likelihood on purpose: with a Gaussian likelihood H does not depend on x*, so by the
envelope theorem the marginal's gradient would not go through dx*/dθ at all.

Step and tolerance: the inner solves converge to ~1e-12 (graph-native Newton) or to the
tolerance of their scipy method; with step h = 1e-4 the central difference's truncation error
is ~h²·|logp'''| ≈ 1e-8 and its rounding error ~1e-16·|logp|/h ≈ 1e-10, well below the
tolerances used (rtol 1e-6, or atol 1e-6 for gradients near zero).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from model.test_agents import portfolio_model  # tests/model/, a namespace package
from numpy.testing import assert_allclose

import pymc_optim as pmo
from pymc_optim.datasets.rust1987 import load_rust1987, rust_model

F64 = np.float64
H = 1e-4


def check_model_gradient(model, *, n_points=3, seed=0, spread=0.5, rtol=1e-6, atol=1e-6):
    """dlogp of `model` against central differences of its logp, at `n_points` points drawn
    uniformly within `spread` of the initial point (unconstrained space)."""
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    start = model.initial_point()
    names = [v.name for v in model.value_vars]
    shapes = [np.shape(start[n]) for n in names]
    sizes = [int(np.prod(s, dtype=int)) for s in shapes]

    def as_point(flat):
        pieces = np.split(flat, np.cumsum(sizes)[:-1])
        return {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}

    rng = np.random.default_rng(seed)
    flat0 = np.concatenate([np.ravel(start[n]) for n in names]).astype(F64)
    for _ in range(n_points):
        flat = flat0 + rng.uniform(-spread, spread, flat0.size)
        assert np.isfinite(logp(as_point(flat))), "a test point outside the model's support"
        analytic = dlogp(as_point(flat))
        fd = np.array(
            [
                (logp(as_point(flat + H * e)) - logp(as_point(flat - H * e))) / (2 * H)
                for e in np.eye(flat.size)
            ]
        )
        assert_allclose(analytic, fd, rtol=rtol, atol=atol)


# --- Laplace marginals, one per Hessian structure ------------------------------------------------
COUNTS = np.array([0, 3, 1, 5, 2, 2, 4, 1, 6, 0, 2, 3])
GROUP = np.arange(12) % 4
T = np.linspace(-1, 1, 12)


def poisson_intercepts():
    with pm.Model() as model:
        b0 = pm.Normal("b0", F64(0.0), F64(1.0))
        tau = pm.HalfNormal("tau", F64(1.0))
        u = pm.Normal("u", F64(0.0), tau, shape=4)
        pm.Poisson("y", pt.exp(b0 + u[GROUP]), observed=COUNTS)
    return model


def poisson_slopes():
    """An intercept and a slope per group: 2 × 2 blocks of H."""
    with pm.Model() as model:
        b0 = pm.Normal("b0", F64(0.0), F64(1.0))
        tau = pm.HalfNormal("tau", F64(1.0), shape=2)
        u = pm.Normal("u", F64(0.0), tau, shape=(4, 2))
        pm.Poisson("y", pt.exp(b0 + u[GROUP, 0] + u[GROUP, 1] * T), observed=COUNTS)
    return model


def poisson_walk():
    """A random walk: a tridiagonal prior precision, so a dense H."""
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", F64(0.5))
        u = pm.GaussianRandomWalk("u", sigma=sigma, init_dist=pm.Normal.dist(0, 1), steps=11)
        pm.Poisson("y", pt.exp(u), observed=COUNTS)
    return model


@pytest.mark.parametrize(
    "build, structure, block_size",
    [
        (poisson_intercepts, "diagonal", None),
        (poisson_intercepts, "dense", None),
        (poisson_slopes, "block_diagonal", 2),
        (poisson_slopes, "auto", None),
        (poisson_walk, "dense", None),
    ],
    ids=["diagonal", "dense", "block_diagonal", "auto-block", "dense-walk"],
)
@pytest.mark.slow
def test_laplace_marginal_gradient(build, structure, block_size):
    marginal = pmo.marginalize_laplace(
        build(), "u", hessian_structure=structure, block_size=block_size
    )
    check_model_gradient(marginal)


# --- agents ---------------------------------------------------------------------------------------
MU = np.array([0.08, 0.05, 0.03])
SIGMA = np.array([[0.04, 0.01, 0.0], [0.01, 0.03, 0.005], [0.0, 0.005, 0.02]])
HOLDINGS = np.random.default_rng(2).normal(0.3, 0.05, size=(10, 3))


@pytest.mark.parametrize("method", ["newton"])
def test_optimum_gradient(method):
    """An unconstrained mean-variance investor (risk aversion and expected returns free).

    Not with scipy's BFGS: it stops at gtol ~1e-8 (tighter, it reports precision loss and
    fails), which moves logp by ~1e-7 — central differences of step 1e-4 cannot resolve that.
    """
    with pm.Model() as model:
        gamma = pm.LogNormal("gamma", np.log(3.0), 0.5)
        mu = pm.Normal("mu", MU, 0.02)
        w = pt.vector("w", shape=(3,))
        objective = -(w @ mu) + 0.5 * gamma * (w @ pt.as_tensor(SIGMA) @ w)
        w_star = pmo.Optimum("w_star", objective, w, x0=np.full(3, 0.3), method=method)
        pm.Normal("holdings", w_star, 0.5, observed=HOLDINGS)
    check_model_gradient(model)


def test_portfolio_gradient():
    """The budget-constrained portfolio of test_agents (KKT conditions)."""
    rng = np.random.default_rng(1)
    observed = rng.normal(0.33, 0.05, size=(20, 3))
    check_model_gradient(portfolio_model(observed), rtol=1e-5)


@pytest.mark.parametrize("method", ["hybr", "newton"])
def test_equilibrium_gradient(method):
    """Two markets: demand a_i / p_i, supply p_i + 0.2 p_j (cross-supply)."""
    with pm.Model() as model:
        a = pm.LogNormal("a", F64(0.0), F64(0.3), shape=2)
        p = pt.vector("p", shape=(2,))
        equations = a / p - p - 0.2 * p[::-1]
        options = {"options": {"xtol": 1e-13}} if method == "hybr" else None
        price = pmo.Equilibrium(
            "price", equations, p, x0=np.ones(2), method=method, optimizer_kwargs=options
        )
        pm.Normal("observed_price", price, 0.1, observed=np.array([[0.9, 1.1], [1.0, 0.95]]))
    check_model_gradient(model)


# --- the Rust (1987) model ------------------------------------------------------------------------
@pytest.mark.slow
def test_rust_model_gradient():
    data = load_rust1987(4, n=90)
    # spread 0.2 around the initial point keeps RC and θ₁₁ where EV converges in a few steps
    check_model_gradient(rust_model(data, 0.99), n_points=2, spread=0.2)
