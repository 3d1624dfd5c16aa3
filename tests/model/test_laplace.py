"""`pymc_optim.marginalize_laplace` and `pymc_optim.recover_latent`.

The reference cases are Gaussian–Gaussian models, where the Laplace approximation is exact:

* a random-intercepts model, y_i ~ N(x[g_i], s_y), x_g ~ N(mu, tau), whose marginal is
  y ~ N(mu 1, tau² Z Zᵀ + s_y² I) (Z the one-hot group matrix);
* a random intercept-and-slope model, y_i ~ N(x[g_i, 0] + x[g_i, 1] t_i, s_y), x_g ~ MvNormal(mu,
  C) with a fixed 2×2 C, whose marginal is y ~ N(A (1 ⊗ mu), A (I ⊗ C) Aᵀ + s_y² I), A the
  design matrix acting on x packed row-major.

Values are compared with `scipy.stats.multivariate_normal.logpdf` (plus the hyperpriors and the
log-Jacobians of the log transforms), gradients with hand-derived ones and with central finite
differences. A Poisson model checks the formula with a non-Gaussian likelihood against the
same approximation computed group by group with scipy, and the failure policy.

Scale parameters are float64 arrays: PyTensor turns float32-exact Python literals (3.0, 0.5)
into float32 constants, whose log differs from float64 by ~1e-8.
"""

from __future__ import annotations

from functools import cache, cached_property

import arviz as az
import numpy as np
import pymc as pm
import pytest
import scipy.optimize
import scipy.stats
from numpy.testing import assert_allclose
from pytensor.tensor.elemwise import Elemwise

import pymc_optim as pmo
from pymc_optim.linalg.latent_gaussian import LatentGaussianStructure

F64 = np.float64

# --- the random-intercepts model ------------------------------------------------------------------
N_GROUPS, N_PER_GROUP = 6, 3
GROUP = np.repeat(np.arange(N_GROUPS), N_PER_GROUP)
Z = np.eye(N_GROUPS)[GROUP]
MU_SD, TAU_SD, SIGMA_Y_SD = F64(3.0), F64(2.0), F64(1.0)
#: the known observation sd (the "fixed" variant)
SIGMA_Y = F64(0.6)


def _simulate_intercepts(seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.normal(1.0, 0.8, N_GROUPS)
    return x[GROUP] + rng.normal(0.0, float(SIGMA_Y), GROUP.size)


Y = _simulate_intercepts()


def intercepts_model(sigma_y_free: bool = False) -> pm.Model:
    coords = {"group": [f"g{g}" for g in range(N_GROUPS)], "obs": np.arange(GROUP.size)}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", F64(0.0), MU_SD)
        tau = pm.HalfNormal("tau", TAU_SD)
        sigma_y = pm.HalfNormal("sigma_y", SIGMA_Y_SD) if sigma_y_free else SIGMA_Y
        x = pm.Normal("x", mu, tau, dims="group")
        pm.Normal("y", x[GROUP], sigma_y, observed=Y, dims="obs")
    return model


def intercepts_marginal(mu, tau, sigma_y=None, *, jacobian=True):
    """The exact log p(y, θ) in the unconstrained space (tau, sigma_y log-transformed), with the
    log-Jacobians of the log transforms unless `jacobian` is False."""
    s = SIGMA_Y if sigma_y is None else sigma_y
    cov = tau**2 * Z @ Z.T + s**2 * np.eye(GROUP.size)
    out = (
        scipy.stats.multivariate_normal.logpdf(Y, np.full(GROUP.size, mu), cov)
        + scipy.stats.norm.logpdf(mu, 0.0, MU_SD)
        + scipy.stats.halfnorm.logpdf(tau, scale=TAU_SD)
        + jacobian * np.log(tau)  # log-Jacobian of tau = exp(tau_log__)
    )
    if sigma_y is not None:
        out += scipy.stats.halfnorm.logpdf(sigma_y, scale=SIGMA_Y_SD) + jacobian * np.log(sigma_y)
    return out


def intercepts_marginal_gradient(mu, tau, sigma_y=None, *, jacobian=True):
    """d/d(mu, log tau[, log sigma_y]) of `intercepts_marginal`, by hand.

    For log N(y | m, Σ): d/dθ = ½ tr((Σ⁻¹ r rᵀ Σ⁻¹ − Σ⁻¹) dΣ/dθ) + rᵀ Σ⁻¹ dm/dθ, r = y − m, with
    dm/dmu = 1, dΣ/dlog tau = 2 tau² Z Zᵀ, dΣ/dlog s = 2 s² I. A half-normal prior of scale c
    on a log-transformed v contributes d/dlog v [log HalfN(v) + log v] = 1 − v²/c² (without
    the log-Jacobian log v, −v²/c²).
    """
    s = SIGMA_Y if sigma_y is None else sigma_y
    n = GROUP.size
    cov = tau**2 * Z @ Z.T + s**2 * np.eye(n)
    precision = np.linalg.inv(cov)
    alpha = precision @ (Y - mu)
    outer = np.outer(alpha, alpha) - precision

    def trace_term(d_cov):
        return 0.5 * np.sum(outer * d_cov)  # ½ tr(M D) for symmetric D

    out = [
        alpha.sum() - mu / MU_SD**2,
        trace_term(2 * tau**2 * Z @ Z.T) + jacobian - tau**2 / TAU_SD**2,
    ]
    if sigma_y is not None:
        out.append(trace_term(2 * s**2 * np.eye(n)) + jacobian - s**2 / SIGMA_Y_SD**2)
    return np.array(out)


def intercepts_conditional(mu, tau, sigma_y=SIGMA_Y):
    """Mean and covariance of the exact posterior x | y, θ."""
    precision = np.eye(N_GROUPS) / tau**2 + Z.T @ Z / sigma_y**2
    cov = np.linalg.inv(precision)
    return cov @ (mu / tau**2 + Z.T @ Y / sigma_y**2), cov


#: (mu, tau[, sigma_y]) points: near the mode, a small and a large group sd, a far-off mu
INTERCEPT_POINTS = [(1.0, 0.8, 0.6), (0.3, 0.05, 0.9), (-2.0, 5.0, 0.2), (4.0, 1.3, 1.7)]


# --- the random intercept-and-slope model ---------------------------------------------------------
N_SLOPE_GROUPS, N_PER_SLOPE_GROUP = 5, 4
SLOPE_GROUP = np.repeat(np.arange(N_SLOPE_GROUPS), N_PER_SLOPE_GROUP)
T = np.tile(np.linspace(-1.0, 1.0, N_PER_SLOPE_GROUP), N_SLOPE_GROUPS)
#: the fixed prior covariance of (intercept, slope): correlated, so each group is a full 2×2 block
C = np.array([[0.8, 0.3], [0.3, 0.5]])
#: y = A x_flat with x packed row-major: x_flat[2 g + k] = x[g, k]
A = np.zeros((SLOPE_GROUP.size, 2 * N_SLOPE_GROUPS))
A[np.arange(SLOPE_GROUP.size), 2 * SLOPE_GROUP] = 1.0
A[np.arange(SLOPE_GROUP.size), 2 * SLOPE_GROUP + 1] = T


def _simulate_slopes(seed: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.multivariate_normal([0.5, -1.0], C, N_SLOPE_GROUPS)
    return A @ x.ravel() + rng.normal(0.0, 0.4, SLOPE_GROUP.size)


Y_SLOPES = _simulate_slopes()


def slopes_model() -> pm.Model:
    coords = {"group": np.arange(N_SLOPE_GROUPS), "effect": ["intercept", "slope"]}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0), dims="effect")
        sigma_y = pm.HalfNormal("sigma_y", SIGMA_Y_SD)
        x = pm.MvNormal("x", mu, cov=C, dims=("group", "effect"))
        pm.Normal("y", x[SLOPE_GROUP, 0] + x[SLOPE_GROUP, 1] * T, sigma_y, observed=Y_SLOPES)
    return model


def slopes_marginal(mu, sigma_y):
    """The exact log p(y, θ) of the slopes model, sigma_y log-transformed."""
    mean = A @ np.tile(mu, N_SLOPE_GROUPS)
    cov = A @ np.kron(np.eye(N_SLOPE_GROUPS), C) @ A.T + sigma_y**2 * np.eye(SLOPE_GROUP.size)
    return (
        scipy.stats.multivariate_normal.logpdf(Y_SLOPES, mean, cov)
        + scipy.stats.norm.logpdf(mu, 0.0, 2.0).sum()
        + scipy.stats.halfnorm.logpdf(sigma_y, scale=SIGMA_Y_SD)
        + np.log(sigma_y)
    )


def slopes_conditional(mu, sigma_y):
    """Mean and covariance of the exact posterior of x_flat (row-major) given y, θ."""
    prior_precision = np.kron(np.eye(N_SLOPE_GROUPS), np.linalg.inv(C))
    precision = prior_precision + A.T @ A / sigma_y**2
    cov = np.linalg.inv(precision)
    return cov @ (prior_precision @ np.tile(mu, N_SLOPE_GROUPS) + A.T @ Y_SLOPES / sigma_y**2), cov


SLOPE_POINTS = [((0.5, -1.0), 0.4), ((-1.0, 2.0), 1.5), ((0.0, 0.0), 0.1)]


# --- helpers --------------------------------------------------------------------------------------
class Compiled:
    """The marginal model with its logp and gradient as functions of one flat unconstrained
    vector, in the order `names` (not the model's value-variable order)."""

    def __init__(self, model: pm.Model, names: list[str]):
        self.model = model
        self.names = names
        self.shapes = {v.name: model.initial_point()[v.name].shape for v in model.value_vars}
        self.sizes = [int(np.prod(self.shapes[name])) for name in names]

    @cached_property
    def logp_fn(self):
        return self.model.compile_logp()

    @cached_property
    def dlogp_fn(self):
        return self.model.compile_dlogp()

    def point(self, flat) -> dict:
        pieces = np.split(np.asarray(flat, dtype=float), np.cumsum(self.sizes)[:-1])
        return {
            name: piece.reshape(self.shapes[name])
            for name, piece in zip(self.names, pieces, strict=True)
        }

    def logp(self, flat) -> float:
        return float(self.logp_fn(self.point(flat)))

    def dlogp(self, flat) -> np.ndarray:
        gradient = self.dlogp_fn(self.point(flat))
        # compile_dlogp concatenates in the model's value-variable order
        order = [v.name for v in self.model.value_vars]
        pieces = np.split(gradient, np.cumsum([int(np.prod(self.shapes[n])) for n in order])[:-1])
        by_name = dict(zip(order, pieces, strict=True))
        return np.concatenate([by_name[name] for name in self.names])


def central_differences(f, flat, eps):
    flat = np.asarray(flat, dtype=float)
    out = np.empty_like(flat)
    for i in range(flat.size):
        step = np.zeros_like(flat)
        step[i] = eps
        out[i] = (f(flat + step) - f(flat - step)) / (2 * eps)
    return out


@cache
def compiled_intercepts(structure: str, sigma_y_free: bool) -> Compiled:
    marginal = pmo.marginalize_laplace(
        intercepts_model(sigma_y_free), "x", hessian_structure=structure
    )
    names = ["mu", "tau_log__", *(["sigma_y_log__"] if sigma_y_free else [])]
    return Compiled(marginal, names)


@cache
def compiled_slopes(structure: str) -> Compiled:
    block_size = 2 if structure == "block_diagonal" else None
    marginal = pmo.marginalize_laplace(
        slopes_model(), "x", hessian_structure=structure, block_size=block_size
    )
    return Compiled(marginal, ["mu", "sigma_y_log__"])


def intercept_flat(point, sigma_y_free):
    mu, tau, sigma_y = point
    return [mu, np.log(tau), *([np.log(sigma_y)] if sigma_y_free else [])]


# --- 1. the random-intercepts model: exact value and gradient -------------------------------------
@pytest.mark.parametrize(
    "structure, sigma_y_free",
    [("dense", True), ("diagonal", True), ("dense", False)],
    ids=["dense", "diagonal", "dense-sigma_y_known"],
)
def test_gaussian_marginal_and_its_gradient_are_exact(structure, sigma_y_free):
    """Value against scipy's MvN logpdf, gradient against the hand-derived one and against
    central differences, at points from near the mode to far in the tails."""
    compiled = compiled_intercepts(structure, sigma_y_free)
    for point in INTERCEPT_POINTS:
        mu, tau, sigma_y = point
        flat = intercept_flat(point, sigma_y_free)
        sigma_y = sigma_y if sigma_y_free else None
        # The likelihood is quadratic in x: one Newton step lands on the mode up to rounding,
        # so the inner solve's default tolerance suffices. |log p| ≲ 200 here.
        assert_allclose(
            compiled.logp(flat), intercepts_marginal(mu, tau, sigma_y), rtol=0, atol=1e-8
        )
        gradient = compiled.dlogp(flat)
        assert_allclose(
            gradient, intercepts_marginal_gradient(mu, tau, sigma_y), rtol=1e-7, atol=1e-7
        )
        # eps = 1e-5: rounding of a log density of size ≲ 200 costs 200 · 1e-16 / eps ≈ 2e-9,
        # the O(eps²) truncation ≲ 1e-9 (third derivatives are O(10) here)
        assert_allclose(
            gradient, central_differences(compiled.logp, flat, 1e-5), rtol=1e-6, atol=1e-6
        )


def test_marginal_model_keeps_coords_and_drops_the_latent_and_its_observations():
    model = intercepts_model()
    before = dict(model.named_vars)
    before_logp = model.compile_logp()(model.initial_point())

    marginal = pmo.marginalize_laplace(model, "x")

    assert [rv.name for rv in marginal.free_RVs] == ["mu", "tau"]  # the original order
    assert marginal.observed_RVs == []
    assert "x" not in marginal.named_vars and "y" not in marginal.named_vars
    assert [p.name for p in marginal.potentials] == ["laplace_marginal"]
    assert {k: list(v) for k, v in marginal.coords.items()} == {
        k: list(v) for k, v in model.coords.items()
    }
    # the input model is untouched
    assert model.named_vars.keys() == before.keys()
    assert all(model.named_vars[name] is var for name, var in before.items())
    assert {rv.name for rv in model.free_RVs} == {"mu", "tau", "x"}
    assert [rv.name for rv in model.observed_RVs] == ["y"]
    assert model.named_vars_to_dims["x"] == ("group",)
    assert model.compile_logp()(model.initial_point()) == before_logp


def test_data_deterministics_and_other_observations_carry_over():
    """A data container feeding the marginalized likelihood stays settable; a Deterministic of
    the hyperparameters and an observed variable that does not depend on x are kept."""
    with pm.Model(coords={"group": [f"g{g}" for g in range(N_GROUPS)]}) as model:
        y_data = pm.Data("y_data", Y)
        mu = pm.Normal("mu", F64(0.0), MU_SD)
        tau = pm.HalfNormal("tau", TAU_SD)
        pm.Deterministic("tau_squared", tau**2)
        x = pm.Normal("x", mu, tau, dims="group")
        pm.Normal("y", x[GROUP], SIGMA_Y, observed=y_data)
        pm.Normal("other", mu, F64(1.0), observed=[0.5, 1.5])
    marginal = pmo.marginalize_laplace(model, "x")

    assert [v.name for v in marginal.observed_RVs] == ["other"]
    assert [v.name for v in marginal.deterministics] == ["tau_squared"]
    assert "y_data" in marginal.named_vars
    mu, tau = 0.3, 0.9
    point = {"mu": np.array(mu), "tau_log__": np.array(np.log(tau))}
    other = scipy.stats.norm.logpdf([0.5, 1.5], mu, 1.0).sum()
    logp = marginal.compile_logp()
    assert_allclose(logp(point), intercepts_marginal(mu, tau) + other, rtol=0, atol=1e-8)

    shift = 1.0
    with marginal:
        pm.set_data({"y_data": Y + shift})
    # y + 1 under mean mu + 1 has the density of y under mean mu; only the prior of mu changes
    expected = (
        intercepts_marginal(mu - shift, tau)
        - scipy.stats.norm.logpdf(mu - shift, 0.0, MU_SD)
        + scipy.stats.norm.logpdf(mu, 0.0, MU_SD)
        + other
    )
    # the original model's data is untouched
    assert_allclose(model["y_data"].get_value(), Y, rtol=0, atol=0)
    # same compiled function: the data is a shared variable
    assert_allclose(logp(point), expected, rtol=0, atol=1e-8)


def test_latent_given_as_a_list_of_variables():
    model = intercepts_model()
    marginal = pmo.marginalize_laplace(model, [model["x"]])
    mu, tau, _ = INTERCEPT_POINTS[0]
    point = {"mu": np.array(mu), "tau_log__": np.array(np.log(tau))}
    assert_allclose(marginal.compile_logp()(point), intercepts_marginal(mu, tau), rtol=0, atol=1e-8)


# --- 2. a vector latent: block-diagonal Hessian ---------------------------------------------------
def test_block_diagonal_equals_dense_and_the_exact_marginal():
    dense, block = compiled_slopes("dense"), compiled_slopes("block_diagonal")
    for mu, sigma_y in SLOPE_POINTS:
        flat = [*mu, np.log(sigma_y)]
        assert_allclose(block.logp(flat), dense.logp(flat), rtol=0, atol=1e-10)
        assert_allclose(block.dlogp(flat), dense.dlogp(flat), rtol=0, atol=1e-10)
        # and both are exact (|log p| ≲ 300 here)
        assert_allclose(dense.logp(flat), slopes_marginal(np.array(mu), sigma_y), rtol=0, atol=1e-8)
        # eps = 1e-5, as for the intercepts model
        assert_allclose(
            block.dlogp(flat), central_differences(block.logp, flat, 1e-5), rtol=1e-6, atol=1e-6
        )


# --- 3. find_MAP ----------------------------------------------------------------------------------
def test_find_map_on_the_marginal_matches_the_exact_marginal_maximum():
    """find_MAP maximizes log p without the log-Jacobians (the mode in the constrained space)."""

    def negative(flat):
        mu, tau, sigma_y = flat[0], *np.exp(flat[1:])
        return -intercepts_marginal(mu, tau, sigma_y, jacobian=False)

    def negative_gradient(flat):
        mu, tau, sigma_y = flat[0], *np.exp(flat[1:])
        return -intercepts_marginal_gradient(mu, tau, sigma_y, jacobian=False)

    reference = scipy.optimize.minimize(
        negative, [0.0, 0.0, 0.0], jac=negative_gradient, method="BFGS", options={"gtol": 1e-9}
    )
    # a stationary point to 1e-8: the curvatures there are ≳ 10, so the argmax is known to ≲ 1e-9
    assert np.abs(negative_gradient(reference.x)).max() < 1e-8

    with compiled_intercepts("dense", True).model:
        # find_MAP's defaults (L-BFGS-B) stop within ~1e-7 of the argmax here
        found = pm.find_MAP(progressbar=False)
    found_flat = [found["mu"], found["tau_log__"], found["sigma_y_log__"]]
    assert np.isfinite(found_flat).all()
    assert_allclose(found_flat, reference.x, rtol=0, atol=1e-4)
    assert_allclose([found["tau"], found["sigma_y"]], np.exp(reference.x[1:]), rtol=0, atol=1e-4)


# --- 4. recover_latent ----------------------------------------------------------------------------
N_DRAWS = 4000


def _check_draws_against(draws, mean, cov, n_se=4.0):
    """Sample mean and covariance of iid `draws` (n, d) against N(mean, cov) within `n_se`
    standard errors: sd/√n for a mean, √((Σᵢᵢ Σⱼⱼ + Σᵢⱼ²)/n) for a covariance entry (Gaussian)."""
    n = draws.shape[0]
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), n_se * sd / np.sqrt(n))
    cov_se = np.sqrt((np.outer(sd**2, sd**2) + cov**2) / n)
    np.testing.assert_array_less(np.abs(np.cov(draws, rowvar=False) - cov), n_se * cov_se)


@pytest.mark.parametrize("structure", ["dense", "diagonal"])
def test_recovered_latent_follows_the_exact_conditional_posterior(structure):
    """Even draws hold θ₁, odd draws θ₂ (in both chains): each half must follow N(x | y, θ)."""
    compiled = compiled_intercepts(structure, True)
    thetas = [(1.0, 0.8, 0.6), (-0.5, 2.5, 1.2)]
    posterior = {
        name: np.tile([thetas[0][k], thetas[1][k]], (2, N_DRAWS // 2))
        for k, name in enumerate(["mu", "tau", "sigma_y"])
    }
    idata = az.from_dict({"posterior": posterior})

    out = pmo.recover_latent(compiled.model, idata, random_seed=123, progressbar=False)

    assert out is idata
    x = idata.posterior["x"]
    assert x.dims == ("chain", "draw", "group")
    assert list(x["group"].values) == list(intercepts_model().coords["group"])
    solved = idata.posterior["x_solved"]
    assert solved.dims == ("chain", "draw") and solved.dtype == bool and bool(solved.all())
    for k, theta in enumerate(thetas):
        draws = x.values[:, k::2].reshape(-1, N_GROUPS)  # 2 chains × 2000 draws at this θ
        _check_draws_against(draws, *intercepts_conditional(*theta))
    summary = az.summary(idata, var_names=["x"])
    assert len(summary) == N_GROUPS and np.isfinite(summary["mean"]).all()

    if structure == "diagonal":  # the same seed gives the same draws
        again = pmo.recover_latent(
            compiled.model,
            az.from_dict({"posterior": posterior}),
            random_seed=123,
            progressbar=False,
        )
        assert_allclose(again.posterior["x"], x, rtol=0, atol=0)


def test_posterior_predictive_of_the_original_model_runs_on_recovered_draws():
    """With the latent recovered, the original model predicts y: E[y_i] = E[x_g | y, θ]."""
    theta = (1.0, 0.8, 0.6)
    posterior = {
        name: np.full((2, N_DRAWS // 2), value)
        for name, value in zip(["mu", "tau", "sigma_y"], theta, strict=True)
    }
    idata = pmo.recover_latent(
        compiled_intercepts("diagonal", True).model,
        az.from_dict({"posterior": posterior}),
        random_seed=5,
        progressbar=False,
    )
    with intercepts_model(sigma_y_free=True):
        predictive = pm.sample_posterior_predictive(idata, random_seed=6, progressbar=False)
    y = predictive.posterior_predictive["y"].values.reshape(N_DRAWS, -1)
    mean, cov = intercepts_conditional(*theta)
    sd = np.sqrt(np.diag(cov)[GROUP] + theta[2] ** 2)
    np.testing.assert_array_less(np.abs(y.mean(0) - mean[GROUP]), 4 * sd / np.sqrt(N_DRAWS))


def test_recovered_block_latent_follows_the_exact_conditional_posterior():
    compiled = compiled_slopes("block_diagonal")
    mu, sigma_y = np.array([0.5, -1.0]), 0.4
    posterior = {
        "mu": np.broadcast_to(mu, (2, N_DRAWS, 2)).copy(),
        "sigma_y": np.full((2, N_DRAWS), sigma_y),
    }
    idata = az.from_dict(
        {"posterior": posterior},
        dims={"mu": ["effect"]},
        coords={"effect": list(slopes_model().coords["effect"])},
    )

    pmo.recover_latent(compiled.model, idata, random_seed=7, progressbar=False)

    x = idata.posterior["x"]
    assert x.dims == ("chain", "draw", "group", "effect")
    assert list(x["effect"].values) == ["intercept", "slope"]
    assert bool(idata.posterior["x_solved"].all())
    _check_draws_against(x.values.reshape(-1, 2 * N_SLOPE_GROUPS), *slopes_conditional(mu, sigma_y))


def _poisson_conditional_moments(y, group, mu, sigma):
    """Mean and sd of each u_g | y, θ (the groups are independent given θ) by quadrature on a
    fine grid: y_gj ~ Poisson(exp(u_g)), u_g ~ N(mu, sigma)."""
    grid = np.linspace(mu - 12 * sigma - 4, mu + 12 * sigma + 4, 200_001)
    means, sds = [], []
    for g in range(group.max() + 1):
        counts = y[group == g]
        log_p = counts.sum() * grid - counts.size * np.exp(grid) - 0.5 * ((grid - mu) / sigma) ** 2
        w = np.exp(log_p - log_p.max())
        w /= w.sum()
        mean = (grid * w).sum()
        means.append(mean)
        sds.append(np.sqrt(((grid - mean) ** 2 * w).sum()))
    return np.array(means), np.array(sds)


def test_recovered_poisson_latent_is_centred_at_the_conditional_mean():
    """With counts, p(u | θ, y) is skewed and its mode sits above its mean (by ~1/(2y) for a
    count y): draws centred at the mode are biased by 0.07–0.1 sd here. The mean correction
    (−H⁻¹ ∇ ½ log det H) removes the first-order term. The draws' means are compared with
    quadrature per group in units of their Monte Carlo standard error sd/√n: with it every
    |z| ≤ 4 (8 groups, a 5·10⁻⁴ family level; the second-order residual, measured ≤ 0.022 sd at
    the smallest count, is ≤ 2 of these units); without it every |z| > 4."""
    rng = np.random.default_rng(3)
    n_groups, per_group, mu, sigma = 8, 4, 1.0, 0.5
    group = np.repeat(np.arange(n_groups), per_group)
    y = rng.poisson(np.exp(mu + sigma * rng.standard_normal(n_groups))[group])
    with pm.Model() as model:
        pm.Normal("mu", 0.0, 2.0)
        sigma_rv = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", model["mu"], sigma_rv, shape=n_groups)
        pm.Poisson("y", pm.math.exp(u[group]), observed=y)
    marginal = pmo.marginalize_laplace(model, "u")
    mean, sd = _poisson_conditional_moments(y, group, mu, sigma)
    n = 8000
    z = {}
    for corrected in (True, False):
        idata = az.from_dict(
            {"posterior": {"mu": np.full((1, n), mu), "sigma": np.full((1, n), sigma)}}
        )
        pmo.recover_latent(
            marginal, idata, random_seed=1, progressbar=False, mean_correction=corrected
        )
        draws = idata.posterior["u"].values.reshape(n, n_groups)
        z[corrected] = (draws.mean(0) - mean) / (sd / np.sqrt(n))
    assert np.abs(z[True]).max() <= 4, z[True]
    assert np.abs(z[False]).min() > 4, z[False]  # the check can fail: the mode is off


def test_mean_correction_is_zero_where_the_likelihood_is_gaussian():
    """H does not depend on x in a Gaussian–Gaussian model: the same seed gives the same draws
    with and without the correction."""
    compiled = compiled_intercepts("diagonal", True)
    posterior = {"mu": np.full((1, 50), 1.0), "tau": np.full((1, 50), 0.8)}
    posterior["sigma_y"] = np.full((1, 50), 0.6)
    draws = [
        pmo.recover_latent(
            compiled.model,
            az.from_dict({"posterior": posterior}),
            random_seed=2,
            progressbar=False,
            mean_correction=corrected,
        ).posterior["x"]
        for corrected in (True, False)
    ]
    assert_allclose(draws[0], draws[1], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_sampling_the_marginal_and_recovering_matches_full_nuts():
    """NUTS on (mu, tau, sigma_y) of the marginal + recover_latent against NUTS on the full model.

    Both are Monte Carlo estimates of the same posterior (Laplace is exact here): their means
    agree within 4·√(mcse₁² + mcse₂²), the ESS-based Monte Carlo standard errors.
    """
    sample_kwargs = dict(chains=2, cores=1, progressbar=False, compute_convergence_checks=False)
    with compiled_intercepts("diagonal", True).model as marginal:
        idata = pm.sample(draws=300, tune=300, random_seed=20240611, **sample_kwargs)
    pmo.recover_latent(marginal, idata, random_seed=1, progressbar=False)
    with intercepts_model(sigma_y_free=True):
        full = pm.sample(
            draws=1000, tune=1000, target_accept=0.95, random_seed=20240612, **sample_kwargs
        )
    assert int(idata.sample_stats["diverging"].sum()) == 0
    assert bool(idata.posterior["x_solved"].all())

    names = ["mu", "tau", "sigma_y", "x"]
    mean_marginal = az.summary(idata, var_names=names, round_to="none")
    mean_full = az.summary(full, var_names=names, round_to="none")
    assert list(mean_marginal.index) == list(mean_full.index)
    difference = np.abs(mean_marginal["mean"] - mean_full["mean"]).values
    tolerance = 4 * np.hypot(mean_marginal["mcse_mean"], mean_full["mcse_mean"]).values
    np.testing.assert_array_less(difference, tolerance)


# --- several latents; a transformed latent --------------------------------------------------------
#: crossed random effects: 3 levels of a × 4 levels of b, 2 observations per cell
CROSSED_A = np.repeat(np.arange(3), 8)
CROSSED_B = np.tile(np.repeat(np.arange(4), 2), 3)
Y_CROSSED = np.random.default_rng(4).normal(size=CROSSED_A.size)


@cache
def crossed_marginal() -> pm.Model:
    with pm.Model() as model:
        tau_a = pm.HalfNormal("tau_a", F64(1.0))
        tau_b = pm.HalfNormal("tau_b", F64(1.0))
        a = pm.Normal("a", F64(0.0), tau_a, shape=3)
        b = pm.Normal("b", F64(0.0), tau_b, shape=4)
        pm.Normal("y", a[CROSSED_A] + b[CROSSED_B], F64(0.5), observed=Y_CROSSED)
    return pmo.marginalize_laplace(model, ["a", "b"])


def _two_effects_log_marginal(y, z_1, z_2, s_1, s_2, noise_variance):
    """log p(y, log s_1, log s_2) of y ~ N(0, s_1² Z_1 Z_1ᵀ + s_2² Z_2 Z_2ᵀ + noise I) with
    s_k ~ HalfNormal(1), in the log-transformed space."""
    cov = s_1**2 * z_1 @ z_1.T + s_2**2 * z_2 @ z_2.T + noise_variance * np.eye(y.size)
    return (
        scipy.stats.multivariate_normal.logpdf(y, np.zeros(y.size), cov)
        + scipy.stats.halfnorm.logpdf([s_1, s_2]).sum()
        + np.log(s_1 * s_2)
    )


def test_several_latents_are_marginalized_jointly():
    """a and b share observations, so H is dense across them; the joint marginal is exact:
    y ~ N(0, tau_a² Z_a Z_aᵀ + tau_b² Z_b Z_bᵀ + 0.25 I)."""
    compiled = Compiled(crossed_marginal(), ["tau_a_log__", "tau_b_log__"])
    z_a, z_b = np.eye(3)[CROSSED_A], np.eye(4)[CROSSED_B]
    for tau_a, tau_b in [(0.7, 1.3), (2.0, 0.2)]:
        expected = _two_effects_log_marginal(Y_CROSSED, z_a, z_b, tau_a, tau_b, 0.25)
        flat = [np.log(tau_a), np.log(tau_b)]
        assert_allclose(compiled.logp(flat), expected, rtol=0, atol=1e-8)
        # eps = 1e-5, as for the intercepts model
        assert_allclose(
            compiled.dlogp(flat), central_differences(compiled.logp, flat, 1e-5), atol=1e-6
        )


def test_recover_latent_with_several_latents():
    idata = az.from_dict(
        {"posterior": {"tau_a": np.full((2, 50), 0.7), "tau_b": np.full((2, 50), 1.3)}}
    )
    pmo.recover_latent(crossed_marginal(), idata, random_seed=1, progressbar=False)
    assert idata.posterior["a"].shape == (2, 50, 3) and idata.posterior["b"].shape == (2, 50, 4)
    assert bool(idata.posterior["a_b_solved"].all())


#: nested random effects: 6 counties in 2 regions, 4 observations per county
NESTED_REGION = np.arange(6) % 2
NESTED_COUNTY = np.repeat(np.arange(6), 4)
Y_NESTED = np.random.default_rng(0).normal(size=NESTED_COUNTY.size)


@cache
def nested_marginal() -> pm.Model:
    """The county effects are centred on their region's effect: the likelihood reads c only, and
    r reaches it through c's prior (PyTensor's graph_replace refused such a pair)."""
    with pm.Model(coords={"region": range(2), "county": range(6)}) as model:
        s_r = pm.HalfNormal("s_r", F64(1.0))
        s_c = pm.HalfNormal("s_c", F64(1.0))
        r = pm.Normal("r", F64(0.0), s_r, dims="region")
        c = pm.Normal("c", r[NESTED_REGION], s_c, dims="county")
        pm.Normal("y", c[NESTED_COUNTY], F64(0.9), observed=Y_NESTED)
    return pmo.marginalize_laplace(model, ["r", "c"])


def test_nested_latents_are_marginalized_exactly():
    """y ~ N(0, s_r² Z_r Z_rᵀ + s_c² Z_c Z_cᵀ + 0.81 I), Z_r the region of each observation."""
    compiled = Compiled(nested_marginal(), ["s_r_log__", "s_c_log__"])
    z_r, z_c = np.eye(2)[NESTED_REGION][NESTED_COUNTY], np.eye(6)[NESTED_COUNTY]
    for s_r, s_c in [(0.7, 0.4), (1.5, 0.1)]:
        expected = _two_effects_log_marginal(Y_NESTED, z_r, z_c, s_r, s_c, 0.81)
        assert_allclose(compiled.logp([np.log(s_r), np.log(s_c)]), expected, rtol=0, atol=1e-8)
    idata = az.from_dict({"posterior": {"s_r": np.full((1, 4), 0.7), "s_c": np.full((1, 4), 0.4)}})
    pmo.recover_latent(nested_marginal(), idata, random_seed=1, progressbar=False)
    assert idata.posterior["r"].dims[-1] == "region" and idata.posterior["c"].shape == (1, 4, 6)


def test_recover_latent_with_nested_hyperparameters():
    """b ~ Normal(a, 1) is the latent's mean: recovery replaces both by their draws (a reaches
    the latent's graph only through b). Per group u_g ~ N(b, σ²) under 4 Poisson counts, so the
    draws are N(u*_g, 1/H_g): u*_g solves (b − u)/σ² + Σ(y − eᵘ) = 0, H_g = 1/σ² + 4 e^{u*_g}."""
    counts = np.random.default_rng(0).poisson(2, 20)
    group = np.repeat(np.arange(5), 4)
    with pm.Model() as model:
        a = pm.Normal("a", F64(0.0), F64(1.0))
        b = pm.Normal("b", a, F64(1.0))
        u = pm.Normal("u", b, F64(1.0), shape=5)
        pm.Poisson("y", pm.math.exp(u[group]), observed=counts)
    marginal = pmo.marginalize_laplace(model, "u")
    idata = az.from_dict(
        {"posterior": {"a": np.zeros((1, N_DRAWS)), "b": np.full((1, N_DRAWS), 0.5)}}
    )
    pmo.recover_latent(marginal, idata, random_seed=1, progressbar=False, mean_correction=False)
    sums = np.bincount(group, counts)
    mode = np.array(
        [scipy.optimize.brentq(lambda u, s=s: 0.5 - u + s - 4 * np.exp(u), -5, 5) for s in sums]
    )
    _check_draws_against(idata.posterior["u"].values[0], mode, np.diag(1 / (1 + 4 * np.exp(mode))))


Y_POSITIVE = np.array([1.0, 2.0, 0.5])
SIGMA_POSITIVE = F64(0.5)


def _positive_mode_and_curvature(s):
    """With z = log lam and lam ~ LogNormal(0, s), the prior density of z (log-Jacobian
    included) is N(z | 0, s): ℓ(z) = log N(z | 0, s) + log N(y | e^z, σ). The mode solves
    −z/s² + (y − e^z) e^z/σ² = 0 (decreasing in z); H = 1/s² + (2 e^{2z} − y e^z)/σ²."""
    sigma2 = SIGMA_POSITIVE**2

    def score(z, y):
        return -z / s**2 + (y - np.exp(z)) * np.exp(z) / sigma2

    z = np.array([scipy.optimize.brentq(score, -10, 5, args=(y,), xtol=1e-14) for y in Y_POSITIVE])
    return z, 1 / s**2 + (2 * np.exp(2 * z) - Y_POSITIVE * np.exp(z)) / sigma2


def test_transformed_latent_is_marginalized_in_its_unconstrained_space():
    with pm.Model() as model:
        s = pm.HalfNormal("s", F64(1.0))
        lam = pm.LogNormal("lam", F64(0.0), s, shape=3)
        pm.Normal("y", lam, SIGMA_POSITIVE, observed=Y_POSITIVE)
    with pytest.warns(pmo.PymcOptimWarning, match="The prior of `lam` .* is not Gaussian"):
        marginal = pmo.marginalize_laplace(model, "lam", hessian_structure="diagonal")

    s_value = 0.8
    z, curvature = _positive_mode_and_curvature(s_value)
    expected = (
        scipy.stats.halfnorm.logpdf(s_value)
        + np.log(s_value)
        + np.sum(
            scipy.stats.norm.logpdf(z, 0, s_value)
            + scipy.stats.norm.logpdf(Y_POSITIVE, np.exp(z), SIGMA_POSITIVE)
            + 0.5 * np.log(2 * np.pi)
            - 0.5 * np.log(curvature)
        )
    )
    logp = marginal.compile_logp()({"s_log__": np.array(np.log(s_value))})
    assert_allclose(logp, expected, rtol=0, atol=1e-9)

    # the draws are exp of N(z* + δ, 1/H), δ = −H′/(2H²) the mean correction (−H⁻¹ ∂_z ½ log H,
    # H′ = (4e^{2z} − y e^z)/σ² by hand), or of N(z*, 1/H) without it: their logs match within
    # 4 standard errors
    slope = (4 * np.exp(2 * z) - Y_POSITIVE * np.exp(z)) / SIGMA_POSITIVE**2
    for corrected, centre in ((True, z - slope / (2 * curvature**2)), (False, z)):
        idata = az.from_dict({"posterior": {"s": np.full((2, N_DRAWS // 2), s_value)}})
        pmo.recover_latent(
            marginal, idata, random_seed=5, progressbar=False, mean_correction=corrected
        )
        log_draws = np.log(idata.posterior["lam"].values.reshape(-1, 3))
        _check_draws_against(log_draws, centre, np.diag(1 / curvature))


# --- 5. errors ------------------------------------------------------------------------------------
def test_unknown_latent_name_raises():
    with pytest.raises(ValueError, match="`latent` 'u' is not a variable of the model"):
        pmo.marginalize_laplace(intercepts_model(), "u")


def test_latent_listed_twice_raises():
    model = intercepts_model()
    for latent in (["x", "x"], ["x", model["x"]]):
        with pytest.raises(ValueError, match="`latent` lists 'x' twice"):
            pmo.marginalize_laplace(model, latent)


def test_missing_observations_raise_naming_the_variable():
    """PyMC imputes an observed y with NaNs as a free y_unobserved, which depends on the latent:
    the error says so and how to proceed, whether only x or also y_unobserved is named."""
    y = Y.copy()
    y[[0, 3]] = np.nan
    with pm.Model() as model:
        tau = pm.HalfNormal("tau", TAU_SD)
        x = pm.Normal("x", F64(0.0), tau, shape=N_GROUPS)
        with pytest.warns(UserWarning, match="missing values"):
            pm.Normal("y", x[GROUP], SIGMA_Y, observed=y)
    for latent in ("x", ["x", "y_unobserved"]):
        with pytest.raises(NotImplementedError, match="`y` has missing values.*Drop the missing"):
            pmo.marginalize_laplace(model, latent)


def test_observed_latent_raises():
    with pytest.raises(ValueError, match="`latent` 'y' is observed"):
        pmo.marginalize_laplace(intercepts_model(), "y")


def test_deterministic_latent_raises():
    model = intercepts_model()
    with model:
        pm.Deterministic("mu_twice", 2 * model["mu"])
    with pytest.raises(ValueError, match="`latent` 'mu_twice' is not a free random variable"):
        pmo.marginalize_laplace(model, "mu_twice")


def test_discrete_latent_raises():
    with pm.Model() as model:
        k = pm.Poisson("k", F64(2.0))
        pm.Normal("y", k, F64(1.0), observed=[1.0, 2.0])
    with pytest.raises(ValueError, match="`latent` 'k' is discrete"):
        pmo.marginalize_laplace(model, "k")


def test_latent_without_observed_dependents_raises():
    model = intercepts_model()
    with model:
        pm.Normal("loose", F64(0.0), F64(1.0), shape=3)
    with pytest.raises(ValueError, match="`latent` 'loose': no observed variable depends on it"):
        pmo.marginalize_laplace(model, "loose")


def test_free_variable_depending_on_the_latent_is_not_implemented():
    model = intercepts_model()
    with model:
        pm.Normal("child", model["x"], F64(1.0), dims="group")
    with pytest.raises(NotImplementedError, match="`child` .* depends on a marginalized latent"):
        pmo.marginalize_laplace(model, "x")


def test_unknown_on_failure_raises():
    with pytest.raises(
        ValueError, match="`on_failure` must be one of 'reject', 'raise', 'warn'; got 'x'"
    ):
        pmo.marginalize_laplace(intercepts_model(), "x", on_failure="x")


def test_unknown_hessian_structure_raises():
    with pytest.raises(ValueError, match="`hessian_structure` must be one of"):
        pmo.marginalize_laplace(intercepts_model(), "x", hessian_structure="banded")
    with pytest.raises(ValueError, match="`hessian_structure='block_diagonal'` needs `block_size`"):
        pmo.marginalize_laplace(intercepts_model(), "x", hessian_structure="block_diagonal")
    with pytest.raises(ValueError, match="`block_size` is only used with `hessian_structure='bl"):
        pmo.marginalize_laplace(intercepts_model(), "x", block_size=2)


def test_non_gaussian_latent_prior_warns():
    with pm.Model() as model:
        x = pm.StudentT("x", nu=F64(4.0), mu=F64(0.0), sigma=F64(1.0), shape=3)
        pm.Normal("y", x, F64(1.0), observed=[0.1, -0.2, 0.3])
    with pytest.warns(pmo.PymcOptimWarning, match=r"The prior of `x` \(StudentTRV\) is not Gauss"):
        marginal = pmo.marginalize_laplace(model, "x")
    assert [p.name for p in marginal.potentials] == ["laplace_marginal"]


def test_recover_latent_on_a_model_not_made_by_marginalize_laplace_raises():
    idata = az.from_dict({"posterior": {"mu": np.zeros((1, 2)), "tau": np.ones((1, 2))}})
    with pytest.raises(TypeError, match="must be a model returned by `pmo.marginalize_laplace`"):
        pmo.recover_latent(intercepts_model(), idata, progressbar=False)


def test_recover_latent_with_an_unknown_mode_names_the_argument():
    marginal = pmo.marginalize_laplace(poisson_model(), "x")
    idata = az.from_dict({"posterior": {"mu": np.zeros((1, 2)), "tau": np.ones((1, 2))}})
    with pytest.raises(ValueError, match=r"`mode` must be a PyTensor compile mode.*'FOO'"):
        pmo.recover_latent(marginal, idata, mode="FOO", progressbar=False)


def test_recover_latent_without_the_hyperparameters_raises():
    idata = az.from_dict({"posterior": {"mu": np.zeros((1, 2)), "sigma_y": np.ones((1, 2))}})
    marginal = pmo.marginalize_laplace(intercepts_model(sigma_y_free=True), "x")
    with pytest.raises(ValueError, match=r"lacks the hyperparameters \['tau'\]"):
        pmo.recover_latent(marginal, idata, progressbar=False)


def test_mean_correction_must_be_a_flag():
    idata = az.from_dict({"posterior": {"mu": np.zeros((1, 2)), "sigma_y": np.ones((1, 2))}})
    marginal = pmo.marginalize_laplace(intercepts_model(sigma_y_free=True), "x")
    with pytest.raises(TypeError, match="`mean_correction` must be True or False; got 'mean'"):
        pmo.recover_latent(marginal, idata, progressbar=False, mean_correction="mean")
    with pytest.raises(TypeError, match="`mean_correction` must be True or False; got None"):
        pmo.fit_inla(intercepts_model(sigma_y_free=True), "x", mean_correction=None)


# --- 6. a non-Gaussian likelihood and the failure policy ------------------------------------------
N_COUNT_GROUPS, N_PER_COUNT_GROUP = 4, 5
COUNT_GROUP = np.repeat(np.arange(N_COUNT_GROUPS), N_PER_COUNT_GROUP)
COUNTS = np.random.default_rng(3).poisson(
    np.exp(1.0 + np.array([-0.5, 0.0, 0.3, 0.8]))[COUNT_GROUP]
)


def poisson_model() -> pm.Model:
    with pm.Model(coords={"group": np.arange(N_COUNT_GROUPS)}) as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        tau = pm.HalfNormal("tau", F64(1.0))
        x = pm.Normal("x", mu, tau, dims="group")
        pm.Poisson("y", pm.math.exp(x[COUNT_GROUP]), observed=COUNTS)
    return model


def _poisson_modes(mu, tau):
    """x*_g, the mode of ℓ_g(x) = log N(x | mu, tau) + Σᵢ log Poisson(yᵢ | eˣ) for each group: the
    root of the (decreasing) score (mu − x)/tau² + Σ yᵢ − n eˣ."""
    modes = []
    for g in range(N_COUNT_GROUPS):
        y = COUNTS[COUNT_GROUP == g]

        def score(x, y=y):
            return (mu - x) / tau**2 + y.sum() - y.size * np.exp(x)

        modes.append(scipy.optimize.brentq(score, -20, 20, xtol=1e-14))
    return np.array(modes)


def poisson_laplace(mu, tau):
    """The Laplace approximation computed group by group with scipy, in the unconstrained space:
    Σ_g ℓ_g(x*_g) + ½ log 2π − ½ log H_g, H_g = −ℓ_g''(x*_g) = 1/tau² + n e^{x*_g}."""
    out = scipy.stats.norm.logpdf(mu, 0, 2) + scipy.stats.halfnorm.logpdf(tau) + np.log(tau)
    for g, x_star in enumerate(_poisson_modes(mu, tau)):
        y = COUNTS[COUNT_GROUP == g]
        ell = (
            scipy.stats.norm.logpdf(x_star, mu, tau)
            + scipy.stats.poisson.logpmf(y, np.exp(x_star)).sum()
        )
        curvature = 1 / tau**2 + y.size * np.exp(x_star)
        out += ell + 0.5 * np.log(2 * np.pi) - 0.5 * np.log(curvature)
    return out


def poisson_laplace_gradient(mu, tau):
    """d/d(mu, log tau) of `poisson_laplace`, by hand.

    Envelope theorem for ℓ_g (∂ℓ_g/∂x = 0 at x*): ∂ℓ_g/∂mu = (x* − mu)/tau², ∂ℓ_g/∂log tau =
    (x* − mu)²/tau² − 1. The implicit function theorem on the score: dx*/dmu = (1/tau²)/H,
    dx*/dlog tau = −2 (mu − x*)/tau² / H. Then d log H = (n e^{x*} dx* − 2/tau² dlog tau)/H.
    Hyperpriors: −mu/4 and 1 − tau² (half-normal of scale 1 plus the log-Jacobian).
    """
    x = _poisson_modes(mu, tau)
    n = np.bincount(COUNT_GROUP)
    curvature = 1 / tau**2 + n * np.exp(x)
    dx_dmu = 1 / tau**2 / curvature
    dx_dlogtau = -2 * (mu - x) / tau**2 / curvature
    d_mu = (x - mu) / tau**2 - 0.5 * n * np.exp(x) * dx_dmu / curvature
    d_logtau = (
        (x - mu) ** 2 / tau**2 - 1 - 0.5 * (n * np.exp(x) * dx_dlogtau - 2 / tau**2) / curvature
    )
    return np.array([d_mu.sum() - mu / 4, d_logtau.sum() + 1 - tau**2])


def test_poisson_marginal_equals_the_groupwise_laplace_approximation():
    compiled = Compiled(
        pmo.marginalize_laplace(poisson_model(), "x", hessian_structure="diagonal"),
        ["mu", "tau_log__"],
    )
    for mu, tau in [(1.0, 0.5), (0.0, 2.0), (2.0, 0.1)]:
        flat = [mu, np.log(tau)]
        # The inner Newton converges quadratically: its last step leaves the mode accurate far
        # beyond its 1e-8 stopping test (|log p| ≲ 100 here).
        assert_allclose(compiled.logp(flat), poisson_laplace(mu, tau), rtol=0, atol=1e-9)
        gradient = compiled.dlogp(flat)
        assert_allclose(gradient, poisson_laplace_gradient(mu, tau), rtol=1e-7, atol=1e-7)
        # eps = 1e-5, as for the Gaussian models
        assert_allclose(
            gradient,
            central_differences(compiled.logp, flat, 1e-5),
            rtol=1e-6,
            atol=1e-6,
        )


def test_negative_binomial_marginal_compiles_as_pm_sample_does_and_equals_the_groupwise_laplace():
    """pm.NegativeBinomial's Hessian holds 0 / x terms on which PyMC's pre-gradient rewrites
    (canonicalize without a ShapeFeature) cycle forever: `logp_dlogp_function`, what pm.sample
    compiles, hung. Built apart from them (`graphs_at_mode`), it compiles; the alarm turns a hang
    back into a failure. Value against the Laplace approximation computed group by group with
    scipy (the mode by brentq on the score, H = 1/τ² + Σ (y + α) α eˣ / (α + eˣ)²), to the solver's
    accuracy as for the Poisson model; gradient against central differences."""
    import signal

    # float64: PyMC builds p = sigmoid(log(alpha) - log(mu)), and a Python float 2.5 becomes a
    # float32 constant whose log is taken in float32 (an error of ~1e-7 in the log likelihood)
    alpha = F64(2.5)

    def model():
        with pm.Model() as m:
            mu = pm.Normal("mu", F64(0.0), F64(2.0))
            tau = pm.HalfNormal("tau", F64(1.0))
            x = pm.Normal("x", mu, tau, shape=N_COUNT_GROUPS)
            pm.NegativeBinomial("y", mu=pm.math.exp(x[COUNT_GROUP]), alpha=alpha, observed=COUNTS)
        return m

    def laplace(mu, tau):
        out = scipy.stats.norm.logpdf(mu, 0, 2) + scipy.stats.halfnorm.logpdf(tau) + np.log(tau)
        for g in range(N_COUNT_GROUPS):
            y = COUNTS[COUNT_GROUP == g]

            def score(x, y=y):
                return (mu - x) / tau**2 + (y - (y + alpha) * np.exp(x) / (alpha + np.exp(x))).sum()

            x = scipy.optimize.brentq(score, -20, 20, xtol=1e-14)
            p = alpha / (alpha + np.exp(x))
            ell = scipy.stats.norm.logpdf(x, mu, tau) + scipy.stats.nbinom.logpmf(y, alpha, p).sum()
            curvature = (
                1 / tau**2 + ((y + alpha) * alpha * np.exp(x) / (alpha + np.exp(x)) ** 2).sum()
            )
            out += ell + 0.5 * np.log(2 * np.pi) - 0.5 * np.log(curvature)
        return out

    marginal = pmo.marginalize_laplace(model(), "x")
    assert pmo.laplace_info(marginal).structure.kind == "diagonal"

    def hang(*args):
        raise TimeoutError("logp_dlogp_function did not finish in 600 s (it compiles in ~25 s)")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(600)
    try:
        fn = marginal.logp_dlogp_function(ravel_inputs=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    fn.set_extra_values({})
    names = [v.name for v in fn._grad_vars]
    assert names == ["mu", "tau_log__"]
    # no fused node reads a variable twice (one read 19 variables as 127 inputs, which made the
    # VM's garbage collection 3 of the call's 5.6 ms at G = 300: rewrites/composite_inputs.py)
    nodes = fn._pytensor_function.maker.fgraph.toposort()
    assert all(len(set(n.inputs)) == len(n.inputs) for n in nodes if isinstance(n.op, Elemwise))
    for mu, tau in [(1.0, 0.5), (0.0, 2.0)]:
        flat = np.array([mu, np.log(tau)])
        value, gradient = fn(flat)
        assert_allclose(value, laplace(mu, tau), rtol=0, atol=1e-9)
        assert_allclose(
            gradient,
            central_differences(lambda q: fn(q)[0], flat, 1e-5),
            rtol=1e-6,
            atol=1e-6,
        )


@pytest.mark.parametrize("on_failure", ["reject", "raise", "warn"])
def test_failed_inner_solve_follows_the_failure_policy(on_failure):
    marginal = pmo.marginalize_laplace(
        poisson_model(), "x", on_failure=on_failure, optimizer_kwargs={"max_iter": 1}
    )
    logp = marginal.compile_logp()
    # one Newton step from x = 0 cannot reach the mode of a Poisson log likelihood
    point = {"mu": np.array(1.0), "tau_log__": np.array(np.log(0.5))}
    if on_failure == "reject":
        assert logp(point) == -np.inf
    elif on_failure == "raise":
        with pytest.raises(AssertionError, match="the inner solve of the Laplace marginal"):
            logp(point)
    else:
        with pytest.warns(pmo.PymcOptimWarning, match="Laplace marginal did not converge; using"):
            value = logp(point)
        # the marginal at the last iterate: finite, and not the converged one
        converged = pmo.marginalize_laplace(poisson_model(), "x").compile_logp()(point)
        assert np.isfinite(value) and abs(value - converged) > 1e-6


def test_converged_marginal_does_not_warn_under_the_warn_policy():
    logp = pmo.marginalize_laplace(poisson_model(), "x", on_failure="warn").compile_logp()
    # warnings are errors in this suite: a spurious warning fails the test
    assert np.isfinite(logp({"mu": np.array(1.0), "tau_log__": np.array(np.log(0.5))}))


def test_marginal_at_a_point_does_not_depend_on_what_was_evaluated_before():
    """The target is a function of θ alone (no warm start leaks between evaluations)."""
    logp = pmo.marginalize_laplace(poisson_model(), "x").compile_logp()
    point = {"mu": np.array(1.0), "tau_log__": np.array(np.log(0.5))}
    first = logp(point)
    for mu, log_tau in [(-3.0, 2.0), (4.0, -3.0), (0.5, 0.0)]:
        logp({"mu": np.array(mu), "tau_log__": np.array(log_tau)})
        assert_allclose(logp(point), first, rtol=0, atol=1e-8)


# --- 7. the Hessian's layout, read off the model --------------------------------------------------
def _auto_structure(model, latent):
    return pmo.laplace_info(pmo.marginalize_laplace(model, latent)).structure


def test_auto_structure_of_independent_effects_is_diagonal():
    assert _auto_structure(intercepts_model(), "x").kind == "diagonal"
    assert _auto_structure(poisson_model(), "x").kind == "diagonal"


def test_auto_structure_of_correlated_effects_per_group_is_block_diagonal():
    structure = _auto_structure(slopes_model(), "x")
    assert (structure.kind, structure.block_size) == ("block_diagonal", 2)


def test_auto_structure_of_crossed_effects_is_dense():
    assert pmo.laplace_info(crossed_marginal()).structure.kind == "dense"


def test_auto_structure_sees_a_correlation_that_vanishes_at_the_initial_point():
    """An LKJ correlation is 0 at the initial point, where the blocks look diagonal; the probe
    jitters the hyperparameters too, so it finds the 3×3 blocks."""
    groups = np.repeat(np.arange(4), 2)
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "c", n=3, eta=F64(2.0), sd_dist=pm.Exponential.dist(F64(1.0)), compute_corr=True
        )
        u = pm.MvNormal("u", F64(0.0), chol=chol, shape=(4, 3))
        pm.Poisson("y", pm.math.exp(u[groups].sum(-1)), observed=np.arange(8) % 3)
    structure = _auto_structure(model, "u")
    assert (structure.kind, structure.block_size) == ("block_diagonal", 3)


Y_WALK = np.array([0.3, -0.1, 0.8, 1.4, 0.9, 2.0])


def walk_model() -> pm.Model:
    with pm.Model() as model:
        s = pm.HalfNormal("s", F64(1.0))
        u = pm.GaussianRandomWalk(
            "u", sigma=s, init_dist=pm.Normal.dist(F64(0.0), F64(1.0)), shape=Y_WALK.size
        )
        pm.Normal("y", u, F64(0.5), observed=Y_WALK)
    return model


def test_random_walk_latent_gives_the_exact_gaussian_marginal():
    """u₀ ~ N(0, 1), u_t = u_{t-1} + N(0, s²): Cov(u_i, u_j) = 1 + s² min(i, j), and
    y ~ N(0, Cov(u) + 0.25 I)."""
    compiled = Compiled(pmo.marginalize_laplace(walk_model(), "u"), ["s_log__"])
    t = np.arange(Y_WALK.size)
    for s in [0.3, 1.0, 2.5]:
        cov = 1.0 + s**2 * np.minimum.outer(t, t) + 0.25 * np.eye(t.size)
        expected = (
            scipy.stats.multivariate_normal.logpdf(Y_WALK, np.zeros(t.size), cov)
            + scipy.stats.halfnorm.logpdf(s)
            + np.log(s)
        )
        assert_allclose(compiled.logp([np.log(s)]), expected, rtol=0, atol=1e-8)


def test_auto_structure_of_a_random_walk_is_prior_precision_plus_curvature():
    """A random walk's H = Q + diag(w): Q read off the prior, the likelihood's W diagonal
    (pymc_optim.model.latent_gaussian)."""
    with pm.Model() as model:
        s = pm.HalfNormal("s", F64(1.0))
        u = pm.GaussianRandomWalk(
            "u", sigma=s, init_dist=pm.Normal.dist(F64(0.0), F64(1.0)), shape=6
        )
        pm.Poisson("y", pm.math.exp(u), observed=np.arange(6))
    assert _auto_structure(model, "u") == LatentGaussianStructure(form="precision")


def test_auto_structure_matches_the_exact_marginal():
    """The detected layouts give the exact Gaussian marginal (a wrong layout would not)."""
    compiled = Compiled(pmo.marginalize_laplace(slopes_model(), "x"), ["mu", "sigma_y_log__"])
    for mu, sigma_y in SLOPE_POINTS:
        flat = [*mu, np.log(sigma_y)]
        assert_allclose(compiled.logp(flat), slopes_marginal(np.array(mu), sigma_y), atol=1e-8)


def test_deterministic_among_the_prior_parameters_is_kept():
    """sigma = Deterministic(tau^-1/2) feeds the prior: the density is derived with sigma's
    graph intact (a stand-in for tau inside it would cut the graph)."""
    with pm.Model() as model:
        tau = pm.Gamma("tau", F64(2.0), F64(1.0))
        sigma = pm.Deterministic("sigma", tau**-0.5)
        pm.Normal("b", F64(0.0), sigma, shape=4)
        pm.Normal("y", model["b"], F64(0.5), observed=np.array([1.0, 2.0, 3.0, 4.0]))
    marginal = pmo.marginalize_laplace(model, "b")
    assert [d.name for d in marginal.deterministics] == ["sigma"]
    t = 1.3
    expected = (
        scipy.stats.norm.logpdf([1.0, 2.0, 3.0, 4.0], 0.0, np.sqrt(1 / t + 0.25)).sum()
        + scipy.stats.gamma.logpdf(t, 2.0)
        + np.log(t)
    )
    assert_allclose(marginal.compile_logp()({"tau_log__": np.log(t)}), expected, atol=1e-8)


@pytest.mark.parametrize("structure", ["diagonal", "dense"])
def test_recover_latent_warm_starts_each_solve_at_the_previous_mode(structure, monkeypatch):
    """Each draw's inner solve starts at the previous draw's mode (fewer Newton steps), and
    converges to the mode of its own θ: the exact groupwise modes (brentq to 1e-14), within the
    Newton stop (|gradient| < 1e-8 with curvature ≥ 1/tau² ≥ 0.4 here: mode error < 3e-8)."""
    from pymc_optim.model import laplace as laplace_module

    marginal = pmo.marginalize_laplace(poisson_model(), "x", hessian_structure=structure)
    rng = np.random.default_rng(0)
    posterior = {"mu": rng.normal(1.0, 0.3, (2, 15)), "tau": rng.uniform(0.3, 1.5, (2, 15))}
    solves = []
    original = laplace_module._recover

    def recording(marginal_model, solve, *args, **kwargs):
        def spy(draw, point, start, noise):
            outputs, mode, success = solve(draw, point, start, noise)
            solves.append((np.array(start), np.array(mode), [float(p) for p in point]))
            return outputs, mode, success

        return original(marginal_model, spy, *args, **kwargs)

    monkeypatch.setattr(laplace_module, "_recover", recording)
    idata = pmo.recover_latent(
        marginal, az.from_dict({"posterior": posterior}), random_seed=1, progressbar=False
    )
    assert bool(idata.posterior["x_solved"].all()) and len(solves) == 30
    for (start, _, _), (_, previous, _) in zip(solves[1:], solves[:-1], strict=True):
        if start.any():  # each chain starts cold at the initial point (zeros here)
            assert_allclose(start, previous, rtol=0, atol=0)
    assert sum(not start.any() for start, _, _ in solves) == 2  # one cold start per chain
    for _, mode, (mu, tau) in solves:
        assert_allclose(mode, _poisson_modes(mu, tau), rtol=0, atol=3e-8)


def test_recover_latent_compiles_in_the_mode_asked_for_and_counts_draws(monkeypatch):
    """``mode="NUMBA"`` (nutpie's backend) draws the same latents as the default C backend from
    the same seed: both sequential solves take the same chord and Newton steps and evaluate H
    and the mean correction at the same last iterate z, so the draws differ by the backends'
    rounding alone (LAPACK calls against numpy's, summation orders), amplified by cond(H) ≈ 10
    here: 1e-12. The progress bar advances once per draw of every chain, not per chain."""
    pytest.importorskip("numba")
    from rich.progress import Progress

    from pymc_optim.model import laplace as laplace_module

    marginal = pmo.marginalize_laplace(poisson_model(), "x", hessian_structure="dense")
    rng = np.random.default_rng(0)
    posterior = {"mu": rng.normal(1.0, 0.3, (2, 4)), "tau": rng.uniform(0.3, 1.5, (2, 4))}
    advanced = []
    monkeypatch.setattr(Progress, "advance", lambda self, task, advance=1: advanced.append(1))
    draws = {}
    for mode in [None, "NUMBA"]:
        idata = pmo.recover_latent(
            marginal, az.from_dict({"posterior": posterior}), random_seed=1, mode=mode
        )
        draws[mode] = idata.posterior["x"].values
        assert bool(idata.posterior["x_solved"].all())
    assert len(advanced) == 2 * 2 * 4
    assert_allclose(draws["NUMBA"], draws[None], rtol=0, atol=1e-12)
    # one compiled function per mode, kept with the marginal
    functions = laplace_module._laplace_node(marginal).tag.recovery_functions
    modes = {key[2] for key in functions}
    assert modes == {None, "NUMBA"}
