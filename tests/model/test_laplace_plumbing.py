"""The model plumbing of `marginalize_laplace` / `recover_latent`: Deterministics of the latent,
per-draw success, the Laplace information carried in the graph (model transformations keep it),
Gaussian priors, predictive checks and model comparison in the original model, and messages.

The reference model is Gaussian–Gaussian (random intercepts with a known observation sd), so
the conditional posterior of the latent given θ is known in closed form.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
import scipy.stats
from numpy.testing import assert_allclose
from pymc.model.fgraph import clone_model

import pymc_optim as pmo
from pymc_optim.model.laplace import LaplaceMarginal

F64 = np.float64
N_GROUPS, N_PER_GROUP = 4, 3
GROUP = np.repeat(np.arange(N_GROUPS), N_PER_GROUP)
SIGMA_Y = F64(0.7)
Y = np.random.default_rng(5).normal(1.0, 1.0, GROUP.size)


def intercepts_model(*, deterministics: bool = True) -> pm.Model:
    coords = {"group": [f"g{g}" for g in range(N_GROUPS)], "obs": np.arange(GROUP.size)}
    with pm.Model(coords=coords) as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        tau = pm.HalfNormal("tau", F64(1.0))
        x = pm.Normal("x", mu, tau, dims="group")
        if deterministics:
            rate = pm.Deterministic("rate", pt.exp(mu + x), dims="group")
            # a Deterministic of a Deterministic of the latent, and one using the data
            pm.Deterministic("log_rate_mean", pt.log(rate).mean())
            pm.Deterministic("mu_twice", 2 * mu)  # not of the latent: stays in the model
        y = pm.Normal("y", x[GROUP], SIGMA_Y, observed=Y, dims="obs")
        if deterministics:
            pm.Deterministic("residual", y - x[GROUP], dims="obs")
    return model


def conditional(mu, tau):
    """Mean and covariance of x | y, θ (exact)."""
    precision = np.eye(N_GROUPS) / tau**2 + np.diag(np.bincount(GROUP)) / SIGMA_Y**2
    cov = np.linalg.inv(precision)
    return cov @ (mu / tau**2 + np.bincount(GROUP, Y) / SIGMA_Y**2), cov


def posterior_at(mu, tau, n_chains=2):
    """A DataTree whose posterior draws are the given hyperparameters (one row per chain)."""
    mu, tau = (
        np.broadcast_to(mu, (n_chains, np.size(mu))),
        np.broadcast_to(tau, (n_chains, np.size(tau))),
    )
    return az.from_dict({"posterior": {"mu": mu.copy(), "tau": tau.copy()}})


def recover(marginal, idata, random_seed=0):
    return pmo.recover_latent(marginal, idata, random_seed=random_seed, progressbar=False)


# --- Deterministics of the latent ---------------------------------------------------------------
def test_deterministics_of_the_latent_leave_the_marginal_and_are_recovered():
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    assert sorted(marginal.named_vars) == ["laplace_marginal", "mu", "mu_twice", "tau"]
    assert pmo.laplace_info(marginal).deterministics == ["rate", "log_rate_mean", "residual"]

    idata = recover(marginal, posterior_at([0.5, 1.0, -0.3], [0.8, 1.2, 0.4]))
    post = idata.posterior
    assert post["rate"].dims == ("chain", "draw", "group")
    assert list(post["rate"]["group"].values) == [f"g{g}" for g in range(N_GROUPS)]
    assert post["residual"].dims == ("chain", "draw", "obs")
    mu = post["mu"].values[..., None]
    assert_allclose(post["rate"], np.exp(mu + post["x"].values), rtol=1e-12)
    assert_allclose(post["log_rate_mean"], (mu + post["x"].values).mean(-1), rtol=1e-12)
    assert_allclose(post["residual"], Y - post["x"].values[..., GROUP], rtol=0, atol=1e-12)


def test_an_observed_variable_may_depend_on_a_deterministic_of_the_latent():
    """rate = exp(b0 + u); y ~ Poisson(rate): the common way of writing a GLMM."""
    counts = np.array([0, 3, 1, 5, 2, 2, 4, 1])
    with pm.Model() as model:
        b0 = pm.Normal("b0", F64(0.0), F64(1.0))
        u = pm.Normal("u", F64(0.0), F64(0.5), shape=4)
        rate = pm.Deterministic("rate", pt.exp(b0 + u))
        pm.Poisson("y", rate[np.arange(8) % 4], observed=counts)
    with pm.Model() as inline:  # the same model without the Deterministic
        b0 = pm.Normal("b0", F64(0.0), F64(1.0))
        u = pm.Normal("u", F64(0.0), F64(0.5), shape=4)
        pm.Poisson("y", pt.exp(b0 + u)[np.arange(8) % 4], observed=counts)
    points = [{"b0": np.array(b)} for b in (-1.0, 0.3, 1.2)]
    logp = pmo.marginalize_laplace(model, "u").compile_logp()
    reference = pmo.marginalize_laplace(inline, "u").compile_logp()
    for point in points:
        assert_allclose(logp(point), reference(point), rtol=1e-12)


def test_a_deterministic_of_a_hyperparameter_read_next_to_the_hyperparameter_itself():
    """The likelihood and a Deterministic of the latent read sigma and tau = sigma⁻² both: the
    Hessian at the mode and the recovery graph take each as an input (taking only the outermost
    once left sigma's own reading without an input: MissingInputError)."""
    counts = np.array([0, 3, 1, 5, 2, 2, 4, 1])
    group = np.arange(8) % 4

    def model(with_tau: bool) -> pm.Model:
        with pm.Model() as model:
            sigma = pm.HalfNormal("sigma", F64(1.0))
            u = pm.Normal("u", F64(0.0), sigma, shape=4)
            if with_tau:
                tau = pm.Deterministic("tau", sigma**-2)
                eta = u[group] * tau * sigma**2 + 0.1 * sigma  # = u + 0.1 σ
                pm.Deterministic("d", u * tau + sigma)
            else:
                eta = u[group] + 0.1 * sigma
            pm.Poisson("y", pt.exp(eta), observed=counts)
        return model

    marginal = pmo.marginalize_laplace(model(True), "u")
    logp = marginal.compile_logp()
    reference = pmo.marginalize_laplace(model(False), "u").compile_logp()
    for s in (0.3, 0.8, 1.5):
        point = {"sigma_log__": np.log(s)}
        assert_allclose(logp(point), reference(point), rtol=1e-12)
    posterior = az.from_dict({"posterior": {"sigma": np.array([[0.4, 0.9, 1.3]])}})
    idata = pmo.recover_latent(marginal, posterior, random_seed=1, progressbar=False)
    sigma = idata.posterior["sigma"].values[..., None]
    d, u = idata.posterior["d"].values, idata.posterior["u"].values
    assert_allclose(d, u / sigma**2 + sigma, rtol=1e-12)


# --- per-draw success ----------------------------------------------------------------------------
def failing_model() -> pm.Model:
    """The likelihood scales the latent by √c: NaN, so a failed inner solve, for c < 0."""
    with pm.Model() as model:
        c = pm.HalfNormal("c", F64(1.0))
        x = pm.Normal("x", F64(0.0), F64(1.0), shape=3)
        pm.Normal("y", x[np.arange(6) % 3] * pt.sqrt(c - 0.5), F64(1.0), observed=Y[:6])
    return pmo.marginalize_laplace(model, "x")


def test_a_failing_draw_is_marked_and_changes_no_other_draw():
    marginal = failing_model()
    good = np.array([[1.5, 0.9, 2.0, 1.1, 3.0]])
    bad = good.copy()
    bad[0, [1, 3]] = 0.2  # c - 0.5 < 0: the inner solve fails at these draws
    recovered = [
        pmo.recover_latent(
            marginal, az.from_dict({"posterior": {"c": c}}), random_seed=3, progressbar=False
        ).posterior
        for c in (good, bad)
    ]
    assert recovered[0]["x_solved"].values.tolist() == [[True] * 5]
    assert recovered[1]["x_solved"].values.tolist() == [[True, False, True, False, True]]
    keep = [0, 2, 4]  # same seed, same noise: the converged draws are the same draws
    assert_allclose(
        recovered[1]["x"].values[:, keep], recovered[0]["x"].values[:, keep], atol=1e-10
    )


# --- the Laplace information travels in the graph -----------------------------------------------
def test_recover_latent_works_on_a_cloned_marginal_model():
    marginal = clone_model(pmo.marginalize_laplace(intercepts_model(), "x"))
    theta = (0.4, 0.9)
    n = 3000
    idata = recover(marginal, posterior_at(np.full(n, theta[0]), np.full(n, theta[1])), 1)
    draws = idata.posterior["x"].values.reshape(-1, N_GROUPS)
    mean, cov = conditional(*theta)
    # within 4 standard errors of the exact conditional mean
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), 4 * np.sqrt(np.diag(cov) / (2 * n)))


def test_the_marker_is_removed_when_the_model_is_compiled():
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    (potential,) = marginal.potentials
    assert isinstance(potential.owner.op, LaplaceMarginal)
    fn = marginal.compile_logp()
    ops = [type(node.op) for node in fn.f.maker.fgraph.apply_nodes]
    assert LaplaceMarginal not in ops
    # and the gradient passes through it: d/dmu of the marginal is finite and nonzero
    dlogp = marginal.compile_dlogp()(marginal.initial_point())
    assert np.all(np.isfinite(dlogp)) and dlogp[0] != 0


def test_recover_latent_on_a_model_without_the_marginal_says_what_to_do():
    idata = posterior_at([0.0], [1.0])
    with pytest.raises(TypeError, match="no potential of the model holds a Laplace marginal"):
        pmo.recover_latent(intercepts_model(), idata, progressbar=False)


# --- Gaussian priors ------------------------------------------------------------------------------
W = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]])


@pytest.mark.parametrize(
    "prior",
    [
        lambda: pm.ICAR("x", W=W),
        lambda: pm.CAR("x", mu=np.zeros(4), W=W, alpha=0.5, tau=F64(1.0)),
        lambda: pm.MvNormal("x", mu=np.zeros(4), tau=np.eye(4)),
        lambda: pm.GaussianRandomWalk("x", init_dist=pm.Normal.dist(), steps=3),
        lambda: pm.AR("x", rho=[0.5], sigma=F64(1.0), init_dist=pm.Normal.dist(), steps=3),
        lambda: pm.ZeroSumNormal("x", shape=4),
        lambda: pm.KroneckerNormal("x", mu=np.zeros(4), covs=[np.eye(2), np.eye(2)]),
    ],
    ids=["ICAR", "CAR", "MvNormal-tau", "GaussianRandomWalk", "AR", "ZeroSumNormal", "Kronecker"],
)
def test_gaussian_priors_do_not_warn(prior):
    with pm.Model() as model:
        x = prior()
        pm.Normal("y", x, F64(1.0), observed=[0.1, -0.2, 0.3, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmo.PymcOptimWarning)
        marginal = pmo.marginalize_laplace(model, "x")
    assert np.isfinite(marginal.compile_logp()(marginal.initial_point()))


@pytest.mark.parametrize("kind", ["GaussianRandomWalk", "AR"])
def test_a_random_scale_of_the_innovations_is_a_parameter_not_a_component(kind):
    # `sigma` is a model variable (HalfNormal) among the prior's inputs: a parameter of the
    # Gaussian walk, not one of its component distributions (it used to warn "not Gaussian")
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        if kind == "AR":
            x = pm.AR("x", rho=[0.5], sigma=sigma, init_dist=pm.Normal.dist(), steps=3)
        else:
            x = pm.GaussianRandomWalk("x", sigma=sigma, init_dist=pm.Normal.dist(), steps=3)
        pm.Normal("y", x, F64(1.0), observed=[0.1, -0.2, 0.3, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", pmo.PymcOptimWarning)
        pmo.marginalize_laplace(model, "x")


def test_a_random_walk_of_student_t_innovations_is_not_gaussian():
    with pm.Model() as model:
        innovations = pm.StudentT.dist(nu=F64(3.0))
        x = pm.RandomWalk("x", innovation_dist=innovations, init_dist=pm.Normal.dist(), steps=3)
        pm.Normal("y", x, F64(1.0), observed=[0.1, -0.2, 0.3, 0.0])
    with pytest.warns(pmo.PymcOptimWarning, match=r"The prior of `x` \(RandomWalkRV\) is not Ga"):
        pmo.marginalize_laplace(model, "x")


# --- predictive checks and model comparison in the original model --------------------------------
def test_posterior_predictive_and_loo_in_the_original_model():
    model = intercepts_model(deterministics=False)
    marginal = pmo.marginalize_laplace(model, "x")
    n = 200
    idata = recover(marginal, posterior_at(np.linspace(0, 1, n), np.linspace(0.5, 1.5, n)), 2)
    with model:
        pm.sample_posterior_predictive(
            idata, extend_inferencedata=True, random_seed=3, progressbar=False
        )
    assert idata.posterior_predictive["y"].shape == (2, n, GROUP.size)
    # the one-liner: pointwise log likelihood at the recovered latents, then PSIS-LOO
    log_likelihood = pm.compute_log_likelihood(idata, model=model, progressbar=False)
    expected = scipy.stats.norm.logpdf(Y, idata.posterior["x"].values[..., GROUP], SIGMA_Y)
    assert_allclose(log_likelihood.log_likelihood["y"], expected, rtol=1e-10)
    loo = az.loo(log_likelihood)
    assert np.isfinite(loo.elpd)


RECIPE = r"(?s)Predict in the original model.*pmo.recover_latent\(marginal_model, idata\)"


@pytest.mark.slow
def test_the_marginal_model_samples_summarizes_and_refuses_to_predict():
    """pm.sample (its DataTree) and az.summary of a marginal model; pmo's predictive guard."""
    model = intercepts_model(deterministics=False)
    marginal = pmo.marginalize_laplace(model, "x")
    with marginal:
        idata = pm.sample(
            tune=50,
            draws=50,
            chains=1,
            random_seed=4,
            progressbar=False,
            compute_convergence_checks=False,
        )
        with pytest.raises(NotImplementedError, match=RECIPE):
            pmo.sample_posterior_predictive(idata)
    assert list(az.summary(idata, kind="stats").index) == ["mu", "tau"]
    # PyMC 6 writes an `observed_data` group even when the model observes nothing: it must
    # hold no (stand-in) observed variable
    observed = idata.children.get("observed_data")
    assert observed is None or list(observed.data_vars) == []
    # the recipe the error shows runs
    idata = recover(marginal, idata, 5)
    with model:
        pm.sample_posterior_predictive(
            idata, extend_inferencedata=True, random_seed=6, progressbar=False
        )
    assert idata.posterior_predictive["y"].shape == (1, 50, GROUP.size)


# --- messages -------------------------------------------------------------------------------------
def test_model_none_raises():
    with pytest.raises(TypeError, match="`model` of `marginalize_laplace` must be a `pm.Model`; g"):
        pmo.marginalize_laplace(None, "x")
    with pytest.raises(TypeError, match="`marginal_model` of `recover_latent` must be a `pm.Mod"):
        recover(None, posterior_at([0.0], [1.0]))


def test_idata_that_is_not_a_datatree_with_a_posterior_raises_naming_idata():
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    posterior = posterior_at([0.0], [1.0]).posterior
    with pytest.raises(
        TypeError,
        match=r"`idata` of `recover_latent` must be an xarray.DataTree .*; got a Dataset\. .*"
        r"DataTree.from_dict",
    ):
        pmo.recover_latent(marginal, posterior.to_dataset(), progressbar=False)
    # the posterior group itself is a DataTree, but holds no `posterior` group
    with pytest.raises(TypeError, match=r"`idata` of `recover_latent` .* groups \[\]"):
        pmo.recover_latent(marginal, posterior, progressbar=False)


def test_hyperparameter_fixed_by_do_leaves_the_latent_shape_alone():
    """pm.do turns sigma into a 0-d data container, a parameter of the latent's prior: not its
    size (it was refused as 'a shape that depends on the data ['sigma']')."""
    with pm.Model(coords={"group": range(4)}) as model:
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", F64(0.0), sigma, dims="group")
        pm.Normal("y", u, F64(1.0), observed=np.array([0.5, -1.0, 2.0, 0.0]))
    fixed = pmo.marginalize_laplace(pm.do(model, {"sigma": 0.7}), "u")
    # y_g ~ N(0, 0.7² + 1) independently: exact
    logp = fixed.compile_logp()({})
    expected = scipy.stats.norm.logpdf([0.5, -1.0, 2.0, 0.0], 0, np.sqrt(1.49)).sum()
    assert_allclose(logp, expected, rtol=0, atol=1e-10)


def test_latent_sized_by_data_raises():
    with pm.Model() as model:
        design = pm.Data("design", np.ones(5))
        u = pm.Normal("u", F64(0.0), F64(1.0), shape=design.shape[0])
        pm.Normal("y", u, F64(1.0), observed=np.zeros(5))
    with pytest.raises(
        NotImplementedError, match=r"`latent` 'u' has a shape that depends on the data \['design'"
    ):
        pmo.marginalize_laplace(model, "u")


def test_hyperparameter_of_the_wrong_shape_raises():
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    idata = az.from_dict({"posterior": {"mu": np.zeros((2, 3, 2)), "tau": np.ones((2, 3))}})
    with pytest.raises(
        ValueError, match=r"`idata.posterior\['mu'\]` must have shape \(chain, draw, \*\(\)\)"
    ):
        pmo.recover_latent(marginal, idata, progressbar=False)


def gp_poisson_model(d: int, length: float, seed: int) -> pm.Model:
    """A GP latent of `d` points on [0, `length`] (MvNormal with an ExpQuad covariance) under
    Poisson counts: a dense latent-Gaussian Hessian."""
    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        ls = pm.InverseGamma("ls", F64(3.0), F64(3.0))
        cov = pm.gp.cov.ExpQuad(1, ls=ls)(np.linspace(0, length, d)[:, None]) + 1e-6 * np.eye(d)
        f = pm.MvNormal("f", mu=np.zeros(d), cov=cov)
        pm.Poisson("y", pt.exp(f), observed=rng.poisson(1.0, d))
    return model


def test_a_dense_hessian_that_will_not_fit_is_refused_before_the_marginal_is_built(monkeypatch):
    """The marginal's (d, d) matrices against the memory left (here 1 MB, as if the machine were
    full): a MemoryError that says why and what to do, not the kernel killing the process."""
    from pymc_optim.model import laplace_structure

    monkeypatch.setattr(laplace_structure, "available_memory", lambda: 10**6)
    model = gp_poisson_model(100, 1.0, seed=0)  # 16 matrices of 100 × 100 float64: 1.28 MB
    with pytest.raises(
        MemoryError,
        match=r"the latent has 100 values and its Hessian is dense \('latent_gaussian' structure"
        r"\).*\(0\.0 GiB\), more than the 0\.0 GiB of memory available.*nothing was built.*"
        r"`hessian_structure='sparse'`",
    ):
        pmo.marginalize_laplace(model, "f")
    # a diagonal Hessian grows linearly in d: the same memory is enough
    assert pmo.laplace_info(pmo.marginalize_laplace(intercepts_model(), "x")).structure.kind == (
        "diagonal"
    )


def test_a_large_gp_latent_skips_the_numerical_hessian_pattern(monkeypatch):
    """A latent with a Gaussian prior to read (here a GP of SPARSE_MIN_SIZE points) gets the
    latent-Gaussian form without the numerical pattern: n reverse passes, each through the whole
    prior (100 s at 5,000 points), would only find it dense."""
    from pymc_optim.linalg import detect

    def no_probe(*args, **kwargs):
        raise AssertionError("the numerical Hessian pattern ran")

    monkeypatch.setattr(detect, "numeric_pattern", no_probe)
    model = gp_poisson_model(detect.SPARSE_MIN_SIZE, 5.0, seed=1)
    structure = pmo.laplace_info(pmo.marginalize_laplace(model, "f")).structure
    assert (structure.kind, structure.form) == ("latent_gaussian", "covariance")
