"""`pymc_optim.fit_inla`: INLA-style integration over the hyperparameters.

The reference case is a Gaussian–Gaussian random-intercepts model, where the Laplace marginal is
exact, so the exact posterior of θ = (mu, sigma) is known in closed form,

    log p(mu, sigma | y) = log p(mu) + log p(sigma) + Σ_g log N(ȳ_g | mu, sigma² + s²/n) + c,

and a fine 2-d quadrature of it (written here in numpy, independently of PyMC) gives reference
means, sds and quantiles. Errors are measured in units of the exact posterior sd.
"""

from __future__ import annotations

import itertools
import warnings
from functools import cache
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest
import scipy.optimize
import scipy.stats
from numpy.testing import assert_allclose

import pymc_optim as pmo
from pymc_optim.model import inla as inla_module
from pymc_optim.model import inla_ccd, inla_integration
from pymc_optim.model.laplace_target import LaplaceTarget

F64 = np.float64
#: agreement with the exact quadrature, in posterior sds (the issue's target)
QUADRATURE_TOLERANCE_SD = 0.02

# --- the Gaussian–Gaussian model ------------------------------------------------------------------
N_GROUPS, N_PER_GROUP = 12, 4
S_Y = F64(1.0)
MU_SD, SIGMA_SD = F64(5.0), F64(2.0)


def _simulate(n_groups: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), N_PER_GROUP)
    x = rng.normal(1.0, 0.7, n_groups)
    return group, x[group] + rng.normal(0.0, float(S_Y), group.size)


def gaussian_model(n_groups: int = N_GROUPS) -> pm.Model:
    group, y = _simulate(n_groups)
    coords = {"group": [f"g{g}" for g in range(n_groups)], "obs": np.arange(y.size)}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", F64(0.0), MU_SD)
        sigma = pm.HalfNormal("sigma", SIGMA_SD)
        x = pm.Normal("x", mu, sigma, dims="group")
        pm.Deterministic("x_centred", x - mu, dims="group")
        pm.Normal("y", x[group], S_Y, observed=y, dims="obs")
    return model


def exact_log_posterior(mu, log_sigma, n_groups: int = N_GROUPS):
    """log p(mu, log sigma | y) + c in the unconstrained space (with the log-Jacobian)."""
    group, y = _simulate(n_groups)
    ybar = np.array([y[group == g].mean() for g in range(n_groups)])
    sigma = np.exp(log_sigma)
    variance = sigma**2 + S_Y**2 / N_PER_GROUP
    out = scipy.stats.norm.logpdf(mu, 0.0, MU_SD) + scipy.stats.halfnorm.logpdf(sigma, 0, SIGMA_SD)
    out = out + log_sigma
    for value in ybar:
        out = out + scipy.stats.norm.logpdf(value, mu, np.sqrt(variance))
    return out


@cache
def exact_reference(n_groups: int = N_GROUPS):
    """Mean, sd, 5% and 95% quantiles of mu and sigma by an 801 x 801 quadrature.

    The box spans more than ±8 posterior sds in both coordinates; the lattice's step is ~0.02
    sd, so the midpoint rule's error (second order) is ~1e-4 sd, far below the 2% tested.
    """
    mu0, ls0 = scipy.optimize.minimize(
        lambda t: -exact_log_posterior(t[0], t[1], n_groups), [1.0, 0.0]
    ).x
    mus = np.linspace(mu0 - 3.5, mu0 + 3.5, 801)
    log_sigmas = np.linspace(ls0 - 4.0, ls0 + 3.0, 801)
    m, ls = np.meshgrid(mus, log_sigmas, indexing="ij")
    lp = exact_log_posterior(m, ls, n_groups)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    out = {}
    for name, values, marginal in [("mu", mus, w.sum(1)), ("sigma", np.exp(log_sigmas), w.sum(0))]:
        mean = marginal @ values
        sd = np.sqrt(marginal @ (values - mean) ** 2)
        cdf = np.cumsum(marginal) - 0.5 * marginal  # midpoint rule, second order
        q = np.interp([0.05, 0.95], cdf, values)
        out[name] = {"mean": mean, "sd": sd, "q05": q[0], "q95": q[1]}
    out["mode"] = np.array([mu0, ls0])
    return out


@cache
def fitted(integration: str, n_groups: int = N_GROUPS, draws: int = 1000):
    return pmo.fit_inla(
        gaussian_model(n_groups),
        "x",
        integration=integration,
        draws=draws,
        random_seed=2026,
        progressbar=False,
    )


def errors_in_sd(idata, n_groups: int = N_GROUPS):
    reference = exact_reference(n_groups)
    inla = idata.inla
    out = {}
    for name in ["mu", "sigma"]:
        ref, row = reference[name], inla.sel(hyperparameter=name)
        out[name] = {
            "mean": (float(row["mean"]) - ref["mean"]) / ref["sd"],
            "sd": (float(row["sd"]) - ref["sd"]) / ref["sd"],
            "q05": (float(row["quantiles"].sel(quantile=0.05)) - ref["q05"]) / ref["sd"],
            "q95": (float(row["quantiles"].sel(quantile=0.95)) - ref["q95"]) / ref["sd"],
        }
    return out


# --- mode and Hessian -----------------------------------------------------------------------------
def test_mode_and_hessian_match_the_exact_marginal():
    """The mode by BFGS and the finite-difference Hessian against the closed form.

    The exact posterior's Hessian comes from PyTensor's symbolic second derivative of the
    closed-form marginal (a model with ȳ_g ~ N(mu, sigma² + s²/n)), a second route independent
    of the Laplace machinery. Tolerance: the mode to BFGS's gradient tolerance divided by the
    curvature (~1e-7); the Hessian's central differences carry a relative error ~1e-6
    (step 1e-4, see `_FD_STEP`).
    """
    idata = fitted("grid")
    reference = exact_reference()
    assert_allclose(idata.inla["mode"].values, reference["mode"], atol=1e-5)

    group, y = _simulate(N_GROUPS)
    ybar = np.array([y[group == g].mean() for g in range(N_GROUPS)])
    with pm.Model() as collapsed:
        mu = pm.Normal("mu", F64(0.0), MU_SD)
        sigma = pm.HalfNormal("sigma", SIGMA_SD)
        pm.Normal("ybar", mu, pm.math.sqrt(sigma**2 + S_Y**2 / N_PER_GROUP), observed=ybar)
    d2logp = collapsed.compile_d2logp(jacobian=True, negate_output=False)
    mode = idata.inla["mode"].values
    exact = d2logp({"mu": mode[0], "sigma_log__": mode[1]})
    assert_allclose(idata.inla["hessian"].values, -exact, rtol=1e-5)
    assert list(idata.inla["hyper"].values) == ["mu", "sigma_log__"]


# --- integration against the exact quadrature -----------------------------------------------------
def test_grid_agrees_with_the_exact_quadrature():
    idata = fitted("grid")
    assert idata.inla.attrs["integration"] == "grid"
    for name, errors in errors_in_sd(idata).items():
        for statistic, error in errors.items():
            assert abs(error) < QUADRATURE_TOLERANCE_SD, (name, statistic, error)
    # the draws follow the same posterior: means within 4 Monte Carlo standard errors
    reference = exact_reference()
    for name in ["mu", "sigma"]:
        draws = idata.posterior[name].values.ravel()
        se = reference[name]["sd"] / np.sqrt(draws.size)
        assert abs(draws.mean() - reference[name]["mean"]) < 4 * se, name


def test_auto_uses_the_grid_for_two_hyperparameters():
    idata = pmo.fit_inla(gaussian_model(), "x", draws=10, random_seed=1, progressbar=False)
    assert idata.inla.attrs["integration"] == "grid"
    assert_allclose(idata.inla["mean"].values, fitted("grid").inla["mean"].values)


@pytest.mark.slow
def test_ccd_agrees_with_the_exact_quadrature_when_theta_is_nearly_gaussian():
    """CCD: 9 points for 2 hyperparameters, exact for a Gaussian posterior in z.

    With 200 groups the posterior of (mu, log sigma) is close to Gaussian and the CCD meets the
    2% target. With 12 groups it does not (sd of mu 11% low: mu's marginal is a scale mixture
    over sigma, heavier-tailed than nine points can see); that case is pinned below.
    """
    idata = fitted("ccd", 200)
    errors = errors_in_sd(idata, 200)
    for name in ["mu", "sigma"]:
        for statistic in ["mean", "sd"]:
            assert abs(errors[name][statistic]) < QUADRATURE_TOLERANCE_SD, (name, errors)


def test_ccd_on_a_skewed_posterior_is_only_second_order_and_says_so():
    """Few groups: the CCD's moments are off by more than the grid's (documented limitation),
    and its split-normal draws part from the design's means by more than 0.1 sd: a warning
    points to importance sampling."""
    with pytest.warns(pmo.PymcOptimWarning, match=r"fit_inla \(ccd\): .* posterior sd apart for"):
        idata = fitted.__wrapped__("ccd")
    assert idata.inla.attrs["ccd_fit_mean_gap_sd"] > inla_module.CCD_GAP_THRESHOLD_SD
    ccd, grid = errors_in_sd(idata), errors_in_sd(fitted("grid"))
    assert idata.inla.sizes["point"] == 9
    # the mean of mu is symmetric enough for the design; its sd is not
    assert abs(ccd["mu"]["mean"]) < QUADRATURE_TOLERANCE_SD
    assert abs(ccd["mu"]["sd"]) > 5 * abs(grid["mu"]["sd"])


def test_grid_on_a_standard_gaussian_whose_fine_lattice_ends_on_the_box():
    """The grid's box on a bivariate standard Gaussian ends at z = ±4, where numpy's arange
    stepped past the last node (4 + 5e-15) and the cubic interpolator refused the fine lattice
    (seen at G = 3,000 in bench_inla). The fine lattice now ends on the box; the rule's moments
    are those of the standard Gaussian, to the lattice's smoothing (sd 0.06, so the variance
    1 + 0.06² within 1%) and the tail beyond ±4 (mass 6e-5)."""

    class StandardGaussian:
        progress = None

        def log_density(self, points):
            return -0.5 * (np.atleast_2d(points) ** 2).sum(axis=1)

    result = inla_integration.grid(
        StandardGaussian().log_density, np.zeros(2), 0.0, np.eye(2), 100, np.random.default_rng(0)
    )
    assert_allclose(np.abs(result.points).max(axis=0), 4.0)
    assert_allclose(np.abs(result.support).max(axis=0), 4.0)
    mean, sd = inla_integration.moments([result.support], result.support_weights)
    assert_allclose(mean, 0.0, atol=1e-10)
    assert_allclose(sd, 1.0, rtol=0.01)
    assert np.all(np.abs(result.draws) <= 4.0)


def test_ccd_design_and_weights():
    """Points on the sphere of radius f₀√m, a resolution-V fraction, and weights that integrate
    a standard Gaussian and its second moment exactly (to rounding)."""
    for m in range(1, 13):
        z = inla_module.ccd_design(m)
        radius = inla_ccd.CCD_F0 * np.sqrt(m)
        assert_allclose(np.linalg.norm(z[1:], axis=1), radius)
        assert_allclose(z[0], 0.0)
        if m > 1:
            cube = z[1 + 2 * m :] / inla_ccd.CCD_F0
            # resolution V: main effects and two-factor interactions mutually orthogonal
            columns = [cube[:, i] for i in range(m)]
            columns += [cube[:, i] * cube[:, j] for i, j in itertools.combinations(range(m), 2)]
            gram = np.array(columns) @ np.array(columns).T
            assert_allclose(gram, len(cube) * np.eye(len(columns)), atol=1e-9)
        # exp(log Δ_k) is Δ_k φ(0); φ(z_k)/φ(0) = exp(−|z_k|²/2)
        mass = np.exp(inla_module.ccd_log_weights(m) - 0.5 * (z**2).sum(axis=1))
        assert_allclose(mass.sum(), 1.0, rtol=1e-12)
        assert_allclose(np.einsum("k,ki,kj->ij", mass, z, z), np.eye(m), atol=1e-12)
    # the fraction is the smallest regular one for these m (Box & Hunter 1961)
    sizes = {m: len(inla_module.ccd_design(m)) - 1 - 2 * m for m in (2, 4, 5, 6, 7)}
    assert sizes == {2: 4, 4: 16, 5: 16, 6: 32, 7: 64}


def test_importance_sampling_agrees_with_the_quadrature_within_monte_carlo_error():
    idata = fitted("importance")
    inla = idata.inla
    assert inla.attrs["integration"] == "importance"
    k = float(inla["pareto_k"])
    assert np.isfinite(k) and k < inla_module.PARETO_K_THRESHOLD
    weights = np.exp(inla["log_weights"].values)
    ess = 1.0 / np.sum(weights**2)
    reference = exact_reference()
    for name in ["mu", "sigma"]:
        error = float(inla["mean"].sel(hyperparameter=name)) - reference[name]["mean"]
        assert abs(error) < 4 * reference[name]["sd"] / np.sqrt(ess), (name, error, ess)


def test_empirical_bayes_fixes_theta_at_the_mode():
    idata = fitted("empirical_bayes")
    mode = exact_reference()["mode"]
    assert_allclose(idata.posterior["mu"].values, mode[0], atol=1e-5)
    assert_allclose(idata.posterior["sigma"].values, np.exp(mode[1]), rtol=1e-5)
    assert idata.inla.sizes["point"] == 1
    # the latent still varies: x | θ̂, y is Gaussian, not a point
    assert float(idata.posterior["x"].std("draw").min()) > 0.1


# --- the DataTree ---------------------------------------------------------------------------------
def test_posterior_has_the_original_names_dims_and_coords():
    model = gaussian_model()
    idata = fitted("grid")
    posterior = idata.posterior
    assert posterior.sizes == {"chain": 1, "draw": 1000, "group": N_GROUPS}
    assert list(posterior["x"].dims) == ["chain", "draw", "group"]
    assert list(posterior["group"].values) == list(model.coords["group"])
    # the model's deterministics are computed from the joint draws
    assert_allclose(posterior["x_centred"], posterior["x"] - posterior["mu"])
    summary = az.summary(idata, var_names=["mu", "sigma", "x"], kind="stats")
    assert len(summary) == 2 + N_GROUPS
    with model:
        predictive = pm.sample_posterior_predictive(idata, random_seed=1, progressbar=False)
    assert predictive.posterior_predictive["y"].shape == (1, 1000, N_GROUPS * N_PER_GROUP)


def test_latent_draws_follow_the_exact_posterior_mean():
    """E[x_g | y] = E_θ[E[x_g | θ, y]], by the same quadrature: within 4 Monte Carlo errors."""
    group, y = _simulate(N_GROUPS)
    ybar = np.array([y[group == g].mean() for g in range(N_GROUPS)])
    mus = np.linspace(-2.0, 4.0, 301)
    log_sigmas = np.linspace(-5.0, 2.5, 301)
    m, ls = np.meshgrid(mus, log_sigmas, indexing="ij")
    lp = exact_log_posterior(m, ls)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    precision = np.exp(-2 * ls)[..., None] + N_PER_GROUP / S_Y**2
    conditional = (m[..., None] * np.exp(-2 * ls)[..., None] + N_PER_GROUP * ybar / S_Y**2) / (
        precision
    )
    exact = np.einsum("ij,ijg->g", w, conditional)
    draws = fitted("grid").posterior["x"].values[0]
    se = draws.std(axis=0) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - exact) < 4 * se)


def test_the_inla_group():
    inla = fitted("grid").inla
    weights = np.exp(inla["log_weights"].values)
    assert_allclose(weights.sum(), 1.0)
    assert inla["points"].dims == ("point", "hyper")
    assert inla.attrs["n_evaluations"] >= inla.sizes["point"]
    # the marginal densities integrate to one and peak near the mode of each marginal
    for name in ["mu", "sigma"]:
        row = inla.sel(hyperparameter=name)
        x, density = row["density_x"].values, row["density"].values
        assert abs(np.trapezoid(density, x) - 1.0) < 0.01
    assert np.isnan(float(inla["pareto_k"]))


def test_plot_inla_marginals():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    idata = fitted("grid")
    axes = pmo.plot_inla_marginals(idata, var_names="sigma")  # a name, as ArviZ takes it
    (line,) = axes[0].get_lines()
    assert_allclose(line.get_xdata(), idata.inla["density_x"].sel(hyperparameter="sigma"))
    with pytest.raises(ValueError, match=r"`var_names` \['tau'\] are not among"):
        pmo.plot_inla_marginals(idata, var_names=["tau"])
    with pytest.raises(ValueError, match=r"`var_names` is empty"):
        pmo.plot_inla_marginals(idata, var_names=[])
    import matplotlib.pyplot as plt

    _, one_axis = plt.subplots()
    with pytest.raises(ValueError, match=r"`ax` must hold one axis per plotted .* \(2: .* got 1"):
        pmo.plot_inla_marginals(idata, ax=one_axis)
    without_inla = idata.copy()
    del without_inla["inla"]
    with pytest.raises(TypeError, match=r"`idata` of `plot_inla_marginals` .* \['posterior'\]"):
        pmo.plot_inla_marginals(without_inla)
    with pytest.raises(TypeError, match=r"`pmo.fit_inla` .* got a Dataset"):
        pmo.plot_inla_marginals(idata.inla.to_dataset())


def test_importance_weights_and_a_vector_hyperparameter():
    """Importance weights that underflow to 0 have log weight −inf, not a numpy warning (it
    warned 'divide by zero encountered in log'); a vector hyperparameter's name plots each of
    its values."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(2)
    group = np.repeat(np.arange(6), 3)
    design = rng.normal(size=(group.size, 2))
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        u = pm.Normal("u", 0.0, sigma, shape=6)
        pm.Normal("y", design @ beta + u[group], 0.5, observed=rng.normal(size=group.size))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        idata = pmo.fit_inla(
            model, "u", integration="importance", draws=200, random_seed=1, progressbar=False
        )
    assert_allclose(np.exp(idata.inla["log_weights"].values).sum(), 1.0)
    with warnings.catch_warnings():  # a weight exp(−10⁴) underflows; its log does not
        warnings.simplefilter("error", RuntimeWarning)
        assert_allclose(inla_integration.log_normalize([0.0, -1e4, -np.inf]), [0.0, -1e4, -np.inf])
    axes = pmo.plot_inla_marginals(idata, var_names=["beta"])
    assert [axis.get_title() for axis in axes] == ["beta[0]", "beta[1]"]


def test_the_marginal_is_evaluated_point_by_point_as_documented():
    """The loop over points (documented) gives the value of the marginal model's own logp."""
    idata = fitted("grid")
    model = inla_module._without_latent_deterministics(gaussian_model(), "x")
    assert "x_centred" not in model.named_vars  # marginalize_laplace refuses it
    marginal = pmo.marginalize_laplace(model, "x")
    logp = marginal.compile_logp(jacobian=True)
    points = idata.inla["points"].values[[0, idata.inla.sizes["point"] // 2, -1]]
    log_density = idata.inla["log_density"].values[[0, idata.inla.sizes["point"] // 2, -1]]
    for point, value in zip(points, log_density, strict=True):
        assert_allclose(logp({"mu": point[0], "sigma_log__": point[1]}), value, rtol=1e-10)


def test_one_warm_started_compiled_marginal_serves_the_whole_fit(monkeypatch):
    """The mode search, the grid and the latent draws all use the target's compiled function
    (one function with the inner solver), whose inner Newton starts at an input (the previous
    mode), not at a constant."""
    import pytensor
    from pytensor.graph.basic import Constant

    from pymc_optim.backends.newton import NewtonOp

    compiled = []
    original = pytensor.function

    def recording(*args, **kwargs):
        compiled.append(original(*args, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(pytensor, "function", recording)
    idata = pmo.fit_inla(gaussian_model(), "x", draws=50, random_seed=1, progressbar=False)
    with_solver = [
        [node for node in fn.maker.fgraph.apply_nodes if isinstance(node.op, NewtonOp)]
        for fn in compiled
    ]
    with_solver = [nodes for nodes in with_solver if nodes]
    assert len(with_solver) == 1, len(with_solver)
    assert all(not isinstance(node.inputs[0], Constant) for node in with_solver[0])
    assert idata.inla.attrs["n_evaluations"] > 50  # the draws were solved by it too


# --- bad input and warnings -----------------------------------------------------------------------
def test_unknown_integration_and_draws():
    with pytest.raises(ValueError, match=r"`integration` must be one of .* got 'laplace'"):
        pmo.fit_inla(gaussian_model(), "x", integration="laplace")
    with pytest.raises(ValueError, match=r"`draws` must be a positive integer; got 0"):
        pmo.fit_inla(gaussian_model(), "x", draws=0)
    for draws in (None, True, "100"):  # a bool is not a count; None named draws nowhere
        with pytest.raises(ValueError, match=r"`draws` must be a positive integer; got"):
            pmo.fit_inla(gaussian_model(), "x", draws=draws)


def test_model_must_be_a_model():
    """`fit_inla("x")` inside a model context: the model is not taken from the context."""
    with pytest.raises(TypeError, match=r"`model` of `fit_inla` must be a `pm.Model`; got 'x'"):
        pmo.fit_inla("x", "u")


def test_no_free_hyperparameter_left():
    with pm.Model() as model:
        x = pm.Normal("x", F64(0.0), F64(1.0), shape=3)
        pm.Normal("y", x, F64(1.0), observed=np.zeros(3))
    with pytest.raises(ValueError, match=r"`latent` leaves no free hyperparameter"):
        pmo.fit_inla(model, "x", progressbar=False)


def test_discrete_hyperparameter():
    with pm.Model() as model:
        k = pm.Poisson("k", F64(3.0))
        x = pm.Normal("x", F64(0.0), F64(1.0), shape=3)
        pm.Normal("y", x + k, F64(1.0), observed=np.zeros(3))
    with pytest.raises(
        ValueError, match=r"continuous hyperparameters only; got the discrete .*'k'"
    ):
        pmo.fit_inla(model, "x", progressbar=False)


def test_grid_with_five_hyperparameters():
    with pm.Model() as model:
        beta = pm.Normal("beta", F64(0.0), F64(1.0), shape=3)
        mu = pm.Normal("mu", F64(0.0), F64(1.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        x = pm.Normal("x", mu + beta.sum(), sigma, shape=4)
        pm.Normal("y", x, F64(1.0), observed=np.zeros(4))
    with pytest.raises(ValueError, match=r"`integration='grid'` supports at most 2 .* has 5"):
        pmo.fit_inla(model, "x", integration="grid", progressbar=False)


def poisson_model() -> pm.Model:
    counts = np.array([0, 3, 1, 7, 2, 4, 0, 5])
    with pm.Model() as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, shape=4)
        pm.Poisson("y", pm.math.exp(u[np.repeat(np.arange(4), 2)]), observed=counts)
    return model


def test_non_finite_marginal():
    """Inner solves capped at one Newton step fail, and are rejected (−inf) everywhere."""
    with pytest.raises(ValueError, match=r"Laplace marginal log density is not finite at the star"):
        pmo.fit_inla(poisson_model(), "u", optimizer_kwargs={"max_iter": 1}, progressbar=False)


def test_mode_search_failure_warns(monkeypatch):
    monkeypatch.setattr(inla_module, "_MODE_MAXITER", 1)
    with pytest.warns(pmo.PymcOptimWarning, match=r"mode search .* did not converge.*NUTS"):
        pmo.fit_inla(
            gaussian_model(), "x", integration="empirical_bayes", draws=5, progressbar=False
        )


def test_large_pareto_k_warns(monkeypatch):
    """A proposal 5x too narrow (fault injection) gives heavy-tailed weights. Seeded: k̂ is
    an estimate, 0.76–1.1 over seeds 1–8, and one unseeded CI run drew k̂ ≤ 0.7."""
    monkeypatch.setattr(inla_integration, "_IMPORTANCE_SCALE", 0.2)
    with pytest.warns(pmo.PymcOptimWarning, match=r"Pareto k̂ .* > 0.7.*NUTS"):
        idata = pmo.fit_inla(
            gaussian_model(),
            "x",
            integration="importance",
            draws=50,
            progressbar=False,
            random_seed=1,
        )
    assert float(idata.inla["pareto_k"]) > 0.7


def test_progressbar_runs():
    with pytest.warns(pmo.PymcOptimWarning, match=r"fit_inla \(ccd\)"):  # skewed: see above
        idata = pmo.fit_inla(
            gaussian_model(), "x", integration="ccd", draws=5, progressbar=True, random_seed=3
        )
    assert idata.inla.sizes["point"] == 9


# --- sampling-based validation (slow) -------------------------------------------------------------
N_MCSE = 4.0  # Monte Carlo allowance: 4 combined standard errors


@pytest.mark.slow
def test_grid_agrees_with_nuts_on_the_marginal_model():
    model = inla_module._without_latent_deterministics(gaussian_model(), "x")
    with pmo.marginalize_laplace(model, "x"):
        nuts = pm.sample(draws=2000, tune=1000, chains=2, cores=1, random_seed=5, progressbar=False)
    inla = fitted("grid").inla
    for name in ["mu", "sigma"]:
        summary = az.summary(nuts, var_names=[name])
        difference = abs(float(inla["mean"].sel(hyperparameter=name)) - summary["mean"].iloc[0])
        assert difference < N_MCSE * summary["mcse_mean"].iloc[0], (name, difference)
        # sd: its Monte Carlo error is ~sd/sqrt(2 ESS); 4 of them
        ess = summary["ess_bulk"].iloc[0]
        allowed = N_MCSE * summary["sd"].iloc[0] / np.sqrt(2 * ess)
        assert abs(float(inla["sd"].sel(hyperparameter=name)) - summary["sd"].iloc[0]) < allowed


SEEDS = Path(__file__).parents[2] / "notebooks" / "data" / "seeds" / "Seeds.txt"
#: Published INLA results (Fong, Rue & Wakefield 2010, supplement Table 1; the data's README):
#: mean, sd.
SEEDS_INLA = {
    "alpha0": (-0.549, 0.182),
    "alpha1": (0.087, 0.298),
    "alpha2": (1.347, 0.259),
    "alpha12": (-0.821, 0.414),
    "sigma": (0.278, 0.117),
}


def seeds_model() -> pm.Model:
    """Seeds as in Fong et al.: τ ~ Gamma(0.5, 0.0164); α ~ N(0, 1000) (variance; α₀ flat
    in the paper, here N(0, 10⁶), whose effect on a posterior with sd 0.18 is ~1e-8)."""
    data = np.loadtxt(SEEDS, skiprows=1)
    r, n, x1, x2 = data[:, 0], data[:, 1], data[:, 2], data[:, 3]
    with pm.Model(coords={"plate": np.arange(len(r))}) as model:
        tau = pm.Gamma("tau", alpha=F64(0.5), beta=F64(0.0164))
        alpha0 = pm.Normal("alpha0", F64(0.0), F64(1000.0))
        alpha1 = pm.Normal("alpha1", F64(0.0), np.sqrt(F64(1000.0)))
        alpha2 = pm.Normal("alpha2", F64(0.0), np.sqrt(F64(1000.0)))
        alpha12 = pm.Normal("alpha12", F64(0.0), np.sqrt(F64(1000.0)))
        b = pm.Normal("b", F64(0.0), 1 / pm.math.sqrt(tau), dims="plate")
        pm.Deterministic("sigma", 1 / pm.math.sqrt(tau))
        eta = alpha0 + alpha1 * x1 + alpha2 * x2 + alpha12 * x1 * x2 + b
        pm.Binomial("r", n=n.astype(int), logit_p=eta, observed=r.astype(int))
    return model


@pytest.mark.slow
def test_seeds_agrees_with_published_inla():
    """Tolerances: means within 0.1 published sd plus 4 Monte Carlo errors of the draws (the
    regression coefficients are latent here, drawn by recover_latent; R-INLA integrates them
    with its simplified Laplace, this package with the Gaussian conditional, an approximation
    difference of a few hundredths of an sd on this data); sds within 10 %. σ's statistics are
    deterministic (the grid's), so they carry no Monte Carlo error."""
    latent = ["alpha0", "alpha1", "alpha2", "alpha12", "b"]
    draws = 4000
    idata = pmo.fit_inla(seeds_model(), latent, draws=draws, random_seed=7, progressbar=False)
    assert idata.inla.attrs["integration"] == "grid"
    for name, (mean, sd) in SEEDS_INLA.items():
        if name == "sigma":
            ours_mean = float(idata.inla["mean"].sel(hyperparameter="sigma"))
            ours_sd = float(idata.inla["sd"].sel(hyperparameter="sigma"))
            mcse = 0.0
        else:
            values = idata.posterior[name].values.ravel()
            ours_mean, ours_sd = values.mean(), values.std()
            mcse = ours_sd / np.sqrt(draws)
        print(name, ours_mean, ours_sd, mean, sd)
        assert abs(ours_mean - mean) < 0.1 * sd + N_MCSE * mcse, (name, ours_mean, mean)
        assert abs(ours_sd / sd - 1) < 0.1, (name, ours_sd, sd)


POISSON_GROUPS = 300


def poisson_intercepts(n_groups: int = POISSON_GROUPS, seed: int = 300) -> pm.Model:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), 5)
    counts = rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, n_groups))[group])
    with pm.Model(coords={"group": np.arange(n_groups)}) as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, dims="group")
        pm.Poisson("y", pm.math.exp(u[group]), observed=counts)
    return model


@pytest.mark.slow
def test_poisson_random_intercepts_agree_with_nuts_on_the_marginal_model():
    """G = 300: the same Laplace marginal, integrated by the grid vs sampled by NUTS. Means
    within 4 Monte Carlo errors, sds within 4 Monte Carlo errors of an sd (sd/sqrt(2 ESS))."""
    # (the Laplace error moves sigma's mean by 0.107 sd here, which fit_inla's check reports:
    # test_laplace_error.py; this test compares two integrations of the same marginal)
    idata = pmo.fit_inla(
        poisson_intercepts(), "u", random_seed=1, progressbar=False, laplace_error=False
    )
    with pmo.marginalize_laplace(poisson_intercepts(), "u"):
        nuts = pm.sample(draws=1000, tune=1000, chains=2, cores=1, random_seed=2, progressbar=False)
    inla = idata.inla
    for name in ["mu", "sigma"]:
        summary = az.summary(nuts, var_names=[name])
        ess = summary["ess_bulk"].iloc[0]
        ours_mean = float(inla["mean"].sel(hyperparameter=name))
        ours_sd = float(inla["sd"].sel(hyperparameter=name))
        print(name, ours_mean, ours_sd, summary[["mean", "sd", "mcse_mean", "ess_bulk"]].values)
        assert abs(ours_mean - summary["mean"].iloc[0]) < N_MCSE * summary["mcse_mean"].iloc[0]
        sd_error = N_MCSE * summary["sd"].iloc[0] / np.sqrt(2 * ess)
        assert abs(ours_sd - summary["sd"].iloc[0]) < sd_error


@pytest.mark.slow
def test_the_targets_success_flag_on_seeds():
    # The counting Op passed its input's buffer through without declaring the view, and an
    # inplace Op downstream overwrote it: the target returned success=False for a solve its own
    # log density (on_failure='reject') had accepted.
    latent = ["alpha0", "alpha1", "alpha2", "alpha12", "b"]
    marginal = pmo.marginalize_laplace(
        inla_module._without_latent_deterministics(seeds_model(), latent), latent
    )
    target = LaplaceTarget.from_model(marginal)
    logp, _, _, _, success = target.evaluate(target.start, with_gradient=False)
    assert np.isfinite(logp)
    assert bool(success)


def test_the_constrained_map_runs_numpy_perform_and_the_models_transforms():
    """The batched map to constrained values is compiled without C (PyTensor's Python linker:
    it is called a few times on large batches, and compiling it to C cost ~10 s of gcc with a
    cold cache); its values are the model's own transforms (sigma = exp(sigma_log__))."""
    from pytensor.link.basic import PerformLinker

    marginal = pmo.marginalize_laplace(
        inla_module._without_latent_deterministics(gaussian_model(), "x"), "x"
    )
    target = LaplaceTarget.from_model(marginal)
    assert isinstance(target.to_constrained.maker.linker, PerformLinker)
    points = np.array([[0.3, -0.5], [1.2, 0.4]])
    values = dict(zip(target.constrained_names, target.constrained(points), strict=True))
    assert_allclose(values["mu"], points[:, 0], rtol=1e-15)
    assert_allclose(values["sigma"], np.exp(points[:, 1]), rtol=1e-15)
