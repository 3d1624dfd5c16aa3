"""`Optimum` and `Equilibrium`: registration in a pm.Model, failure policies, diagnostics, NUTS."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo

MU = np.array([0.08, 0.05, 0.03])
SIGMA = np.array([[0.04, 0.01, 0.0], [0.01, 0.03, 0.005], [0.0, 0.005, 0.02]])


def budget_portfolio(gamma):
    """Closed form of argmax wᵀμ − γ/2 wᵀΣw s.t. Σw = 1: Σ⁻¹(μ − η1)/γ with η from the budget."""
    Si_1 = np.linalg.solve(SIGMA, np.ones(3))
    Si_mu = np.linalg.solve(SIGMA, MU)
    eta = (Si_mu.sum() - gamma) / Si_1.sum()
    return (Si_mu - eta * Si_1) / gamma


def portfolio_model(observed=None, **kwargs):
    coords = {"asset": ["a", "b", "c"]}
    if observed is not None:
        coords["obs"] = range(len(observed))
    with pm.Model(coords=coords) as model:
        gamma = pm.LogNormal("gamma", np.log(3.0), 0.5)
        w = pt.vector("w", shape=(3,))
        objective = -(w @ MU) + 0.5 * gamma * (w @ pt.as_tensor(SIGMA) @ w)
        w_star = pmo.Optimum(
            "w_star",
            objective,
            w,
            x0=np.full(3, 1 / 3),
            constraints={"type": "eq", "fun": w.sum() - 1.0},
            dims="asset",
            **kwargs,
        )
        if observed is not None:
            pm.Normal("holdings", mu=w_star, sigma=0.02, observed=observed, dims=("obs", "asset"))
    return model


def test_optimum_registers_the_solution_with_dims_and_diagnostics():
    model = portfolio_model()
    assert model.named_vars_to_dims["w_star"] == ("asset",)
    assert {"w_star", "w_star_success", "w_star_n_iterations", "w_star_failed"} <= set(
        model.named_vars
    )
    w_star = model["w_star"]
    assert_allclose(w_star.eval({model["gamma"]: 4.0}), budget_portfolio(4.0), atol=1e-10)
    assert model["w_star_success"].eval({model["gamma"]: 4.0})


def test_model_gradient_goes_through_the_kkt_rule():
    rng = np.random.default_rng(1)
    observed = budget_portfolio(3.0) + rng.normal(0, 0.02, size=(20, 3))
    model = portfolio_model(observed)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    point = {"gamma_log__": np.log(2.5)}
    h = 1e-5
    fd = (logp({"gamma_log__": np.log(2.5) + h}) - logp({"gamma_log__": np.log(2.5) - h})) / (2 * h)
    assert_allclose(dlogp(point), [fd], rtol=1e-6)


def _no_root_model(on_failure):
    # x² + a = 0 has a root only for a ≤ 0
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        x = pt.scalar("x")
        x_star = pmo.Equilibrium("x_star", x**2 + a, x, x0=1.0, on_failure=on_failure)
        pm.Normal("y", mu=x_star, sigma=1.0, observed=1.5)
    return model


def test_reject_gives_minus_infinity_where_the_solve_failed():
    model = _no_root_model("reject")
    logp = model.compile_logp()
    assert np.isfinite(logp({"a": -4.0}))
    assert logp({"a": 1.0}) == -np.inf
    # and the point's density is that of the model without the potential where it succeeded
    x_star = 2.0  # root of x² − 4 from x0 = 1
    expected = (
        pm.logp(pm.Normal.dist(0, 1), -4.0).eval() + pm.logp(pm.Normal.dist(x_star, 1), 1.5).eval()
    )
    assert_allclose(logp({"a": -4.0}), expected, rtol=1e-10)


def test_raise_names_the_variable():
    logp = _no_root_model("raise").compile_logp()
    assert np.isfinite(logp({"a": -4.0}))
    with pytest.raises(AssertionError, match="The solve for `x_star` failed"):
        logp({"a": 1.0})


def test_warn_passes_the_value_on_and_warns():
    logp = _no_root_model("warn").compile_logp()
    assert np.isfinite(logp({"a": -4.0}))
    with pytest.warns(pmo.PymcOptimWarning, match="The solve for `x_star` failed"):
        logp({"a": 1.0})


def test_errors():
    with pm.Model():
        x, y = pt.scalar("x"), pt.scalar("y")
        with pytest.raises(ValueError, match="`on_failure` must be one of"):
            pmo.Optimum("x_star", x**2, x, on_failure="ignore")
        with pytest.raises(TypeError, match="`x` of `Equilibrium` must be one variable"):
            pmo.Equilibrium("xy", [x - 1, y - 2], [x, y])


@pytest.mark.slow
def test_nuts_through_optimum_matches_the_closed_form_model():
    # The same posterior written with the closed-form portfolio: the two NUTS runs agree within
    # Monte Carlo error (posterior sd of γ ≈ 0.1 here; 2 × 500 draws give an MCSE ≈ 0.005).
    rng = np.random.default_rng(7)
    observed = budget_portfolio(3.0) + rng.normal(0, 0.02, size=(30, 3))
    coords = {"obs": range(30)}
    model = portfolio_model(observed)
    with model:
        idata = pm.sample(500, tune=500, chains=2, cores=2, random_seed=3, progressbar=False)
    with pm.Model(coords={"asset": ["a", "b", "c"], **coords}):
        gamma = pm.LogNormal("gamma", np.log(3.0), 0.5)
        Si_1 = pt.as_tensor(np.linalg.solve(SIGMA, np.ones(3)))
        Si_mu = pt.as_tensor(np.linalg.solve(SIGMA, MU))
        eta = (Si_mu.sum() - gamma) / Si_1.sum()
        w_closed = (Si_mu - eta * Si_1) / gamma
        pm.Normal("holdings", mu=w_closed, sigma=0.02, observed=observed, dims=("obs", "asset"))
        reference = pm.sample(2000, tune=500, chains=2, cores=2, random_seed=3, progressbar=False)
    got = idata.posterior["gamma"]
    ref = reference.posterior["gamma"]
    assert int(idata.sample_stats["diverging"].sum()) == 0
    assert bool(idata.posterior["w_star_success"].all())
    assert abs(float(got.mean()) - float(ref.mean())) < 4 * 0.006
    assert abs(float(got.std()) - float(ref.std())) < 0.2 * float(ref.std())


def test_reject_an_infeasible_constrained_choice_and_keep_the_gradient_finite():
    # x₀ ≥ c and x ≤ 0 are incompatible for c > 0: success is False, the density −inf, and the
    # model's gradient still evaluates (samplers compute it together with the density).
    with pm.Model() as model:
        c = pm.Normal("c", 0.0, 1.0)
        x = pt.vector("x", shape=(2,))
        objective = ((x + 1.0) ** 2).sum()
        x_star = pmo.Optimum(
            "x_star",
            objective,
            x,
            x0=np.zeros(2),
            bounds=(None, 0.0),
            constraints={"type": "ineq", "fun": x[0] - c},
        )
        pm.Normal("y", x_star.sum(), 1.0, observed=0.3)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    assert np.isfinite(logp({"c": -0.5}))  # x* = (−0.5, −1): the constraint is active
    assert_allclose(model["x_star"].eval({c: -0.5}), [-0.5, -1.0], atol=1e-10)
    assert logp({"c": 0.5}) == -np.inf
    assert np.all(np.isfinite(dlogp({"c": 0.5})))


def _optimum_of_a_sqrt_parameter():
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0)
        x = pt.vector("x")
        x_star = pmo.Optimum(
            "x_star", pt.sqrt(b) * ((x - 1.0) ** 2).sum() + ((x - b) ** 2).sum(), x, x0=np.zeros(2)
        )
        pm.Normal("y", x_star.sum(), 1.0, observed=1.0)
    return model


def test_optimum_rejects_a_nan_objective_with_a_gradient_of_the_right_shape():
    # sqrt(b) is NaN for b < 0: the solve fails, logp is -inf and dlogp has b's shape (it
    # crashed with a DimShuffle squeeze error in the implicit gradient).
    model = _optimum_of_a_sqrt_parameter()
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    assert logp({"b": -1.0}) == -np.inf
    assert np.asarray(dlogp({"b": -1.0})).shape == (1,)
    assert np.isfinite(logp({"b": 1.0})) and np.isfinite(dlogp({"b": 1.0})).all()


@pytest.mark.slow
def test_sampling_an_optimum_that_fails_for_half_the_prior_completes():
    with _optimum_of_a_sqrt_parameter():
        idata = pm.sample(draws=100, tune=100, chains=2, cores=2, random_seed=1, progressbar=False)
    # every kept draw is a successful solve (failed ones, b < 0, were rejected)
    assert bool(idata.posterior["x_star_success"].all())
    assert bool((idata.posterior["b"] >= 0).all())


def test_a_diagnostic_name_taken_by_a_user_variable_raises():
    with pm.Model():
        pm.Normal("w_star_success", 0.0, 1.0)
        a = pm.Normal("a", 0.0, 1.0)
        w = pt.scalar("w")
        with pytest.raises(
            ValueError,
            match=r"`name` 'w_star' registers \['w_star', 'w_star_failed', 'w_star_success', "
            r"'w_star_n_iterations'\], but the model already has \['w_star_success'\]\. Choose "
            r"another `name`, or pass `diagnostics=False`",
        ):
            pmo.Optimum("w_star", (w - a) ** 2, w, x0=0.0)


def test_optimum_outside_a_model_raises():
    a, w = pt.scalar("a"), pt.scalar("w")
    with pytest.raises(TypeError, match="'w_star' must be called inside a model context"):
        pmo.Optimum("w_star", (w - a) ** 2, w, x0=0.0)


@pytest.mark.parametrize("on_failure", ["reject", "warn", "raise"])
def test_multipliers_and_diagnostics_of_an_optimum(on_failure):
    """lagrange_multipliers and solution_info read through the Deterministic and the failure
    policy around the solve (they raised 'computed by ViewOp'). Mean-variance weights summing
    to one: w = (μ + λ) / (γ s²), λ = −0.01 at γ = 3."""
    mu, s2 = np.array([0.05, 0.03]), np.array([0.04, 0.01])
    with pm.Model():
        gamma = pm.LogNormal("gamma", 1.0, 0.5)
        w = pt.vector("w", shape=(2,))
        objective = -(w @ mu) + 0.5 * gamma * (w**2 * s2).sum()
        w_star = pmo.Optimum(
            "w_star",
            objective,
            w,
            x0=[0.5, 0.5],
            on_failure=on_failure,
            constraints={"type": "eq", "fun": w.sum() - 1.0},
        )
    (lam,) = pmo.lagrange_multipliers(w_star).equality
    # Σ (μ_i + λ) / (γ s²_i) = 1  ⇒  λ = (1 − Σ μ_i/(γ s²_i)) / Σ 1/(γ s²_i)
    expected = (1 - (mu / (3.0 * s2)).sum()) / (1 / (3.0 * s2)).sum()
    assert_allclose(lam.eval({gamma: 3.0}), expected, atol=1e-8)
    assert bool(pmo.solution_info(w_star).success.eval({gamma: 3.0}))
