"""The latent-Gaussian path of `marginalize_laplace` (`pymc_optim.model.latent_gaussian`; the
file's name differs from tests/linalg/test_latent_gaussian.py's because pytest imports test
modules by their basename).

On every prior it reads, the marginal (value and gradient, as `pm.sample` compiles them) must
equal the general graph-derived Hessian's (``hessian_structure="dense"``) to 1e-8 (the issue's
criterion): the two compute the same marginal with different factorizations of well-conditioned
6 × 6 systems (condition ≲ 1e3), so they agree to ~1e-12. The compiled graph must hold one
Newton solve whose A is built from the parts (no row-by-row dense Jacobian).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.linalg.latent_gaussian import LatentGaussianStructure

COUNTS = np.array([1, 3, 2, 0, 4, 2])
COORDS = np.linspace(0.0, 3.0, COUNTS.size)
#: ring adjacency of the six areas (ICAR and CAR)
RING = np.roll(np.eye(6, dtype="int64"), 1, 1) + np.roll(np.eye(6, dtype="int64"), -1, 1)


def _kernel(scale):
    return scale**2 * pt.exp(-((COORDS[:, None] - COORDS[None, :]) ** 2) / 2.0) + 1e-6 * np.eye(6)


def _prior(kind, s):
    init = pm.Normal.dist(0.2, 1.5)
    X = COORDS[:, None]
    if kind == "mvnormal_cov":
        return pm.MvNormal("f", mu=0.1 * np.ones(6), cov=_kernel(s))
    if kind == "expquad_cov":  # as the PyMC GP docs write a kernel
        cov = s**2 * pm.gp.cov.ExpQuad(1, ls=1.3)(X) + 1e-6 * pt.eye(6)
        return pm.MvNormal("f", mu=np.zeros(6), cov=cov)
    if kind == "gp_latent":
        gp = pm.gp.Latent(cov_func=s**2 * pm.gp.cov.ExpQuad(1, ls=1.3))
        return gp.prior("f", X, reparameterize=False)
    if kind == "mvnormal_chol":
        return pm.MvNormal("f", mu=np.zeros(6), chol=pt.linalg.cholesky(_kernel(s)))
    if kind == "mvnormal_tau":
        return pm.MvNormal("f", mu=np.zeros(6), tau=pt.linalg.inv(_kernel(s)))
    if kind == "icar":
        return pm.ICAR("f", W=RING, sigma=s)
    if kind == "car":
        return pm.CAR("f", mu=np.zeros(6), W=RING, alpha=0.8, tau=1.0 / s**2)
    if kind == "ar":
        return pm.AR("f", rho=[0.7], sigma=s, init_dist=init, steps=5)
    if kind == "ar_constant":
        return pm.AR("f", rho=[0.3, 0.7], sigma=s, constant=True, init_dist=init, steps=5)
    if kind == "random_walk":
        return pm.GaussianRandomWalk("f", mu=0.1, sigma=s, init_dist=init, steps=5)
    raise AssertionError(kind)


PRIORS = {
    "mvnormal_cov": "covariance",
    "expquad_cov": "covariance",
    "gp_latent": "covariance",
    "mvnormal_chol": "covariance",
    "mvnormal_tau": "precision",
    "icar": "precision",
    "car": "precision",
    "ar": "precision",
    "ar_constant": "precision",
    "random_walk": "precision",
}


def _model(kind):
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        f = _prior(kind, s)
        pm.Poisson("y", mu=pt.exp(f), observed=COUNTS)
    return model


def _sampler_function(model):
    """The logp+dlogp function `pm.sample`'s NUTS compiles (default, C backend)."""
    step = pm.NUTS(model=model)
    fn = step._logp_dlogp_func
    fn.set_extra_values({})
    return fn


def _newton_structures(fn):
    nodes = fn._pytensor_function.maker.fgraph.apply_nodes
    return [node.op.condition.structure for node in nodes if isinstance(node.op, NewtonOp)]


@pytest.mark.parametrize("kind", list(PRIORS))
def test_marginal_equals_the_general_path_and_takes_the_fast_one(kind):
    model = _model(kind)
    fast = pmo.marginalize_laplace(model, "f")
    expected_structure = LatentGaussianStructure(form=PRIORS[kind])
    assert pmo.laplace_info(fast).structure == expected_structure
    general = pmo.marginalize_laplace(model, "f", hessian_structure="dense")
    fast_fn, general_fn = _sampler_function(fast), _sampler_function(general)
    # one solve per logp+gradient, with A built from Q (or K) and w
    assert _newton_structures(fast_fn) == [expected_structure]
    assert _newton_structures(general_fn) == [pmo.laplace_info(general).structure]
    if PRIORS[kind] == "covariance":
        # B = I + W^½ K W^½ factorized once (value, its gradient and the pullback share it),
        # K once; no other factorization, and no Cholesky gradient's triangular solves with n
        # right-hand sides
        ops = [
            type(node.op).__name__ for node in fast_fn._pytensor_function.maker.fgraph.toposort()
        ]
        assert ops.count("BCholesky") == 1
        assert ops.count("Cholesky") == 1
    for s_log in [-0.7, 0.0, 0.6]:
        point = np.array([s_log])
        logp, dlogp = fast_fn(point)
        expected_logp, expected_dlogp = general_fn(point)
        assert np.isfinite(logp) and np.all(dlogp != 0)
        assert_allclose(logp, expected_logp, rtol=0, atol=1e-8)
        assert_allclose(dlogp, expected_dlogp, rtol=0, atol=1e-8)


def test_non_diagonal_likelihood_curvature_keeps_the_general_path():
    """y depends on sums of neighbours: W is not diagonal, so H is not Q + diag(w)."""
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        f = pm.MvNormal("f", mu=np.zeros(6), cov=_kernel(s))
        pm.Poisson("y", mu=pt.exp(f + pt.roll(f, 1)), observed=COUNTS)
    assert pmo.laplace_info(pmo.marginalize_laplace(model, "f")).structure.kind == "dense"


def test_non_log_concave_likelihood_keeps_the_general_path_for_a_covariance_prior():
    """A Student-t likelihood has negative curvature away from its centre: B = I + W^½ K W^½
    is undefined there, so a covariance-form prior keeps the general Hessian."""
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        f = pm.MvNormal("f", mu=np.zeros(6), cov=_kernel(s))
        pm.StudentT("y", nu=1.5, mu=f, sigma=0.1, observed=COUNTS - 2.0)
    assert pmo.laplace_info(pmo.marginalize_laplace(model, "f")).structure.kind == "dense"


def test_recover_latent_draws_from_the_latent_gaussian_laplace_approximation():
    """recover_latent on the covariance form draws N(x* + δ, H⁻¹), H = K⁻¹ + W, W = diag(exp x*)
    for Poisson counts, and δ = −H⁻¹ ∇ ½ log det H(x*) = −½ H⁻¹ (diag(H⁻¹) ∘ exp x*) its mean
    correction (by hand: ∂_a log det H = (H⁻¹)_aa exp x_a), or N(x*, H⁻¹) without it: 4000
    draws at one hyperparameter, means within 5 standard errors and variances within 5 standard
    errors (sd of a sample variance: σ² √(2/n)) of dense algebra."""
    import arviz as az
    from pytensor.graph.replace import graph_replace

    model = _model("mvnormal_cov")
    fast = pmo.marginalize_laplace(model, "f")
    s, n_draws = 0.8, 4000
    info = pmo.laplace_info(fast)
    mode = graph_replace(info.mode, {fast["s"]: pt.constant(s)}, strict=False).eval()
    covariance = np.linalg.inv(np.linalg.inv(_kernel(s).eval()) + np.diag(np.exp(mode)))
    variance = np.diag(covariance)
    shift = -0.5 * covariance @ (variance * np.exp(mode))
    for corrected, mean in ((True, mode + shift), (False, mode)):
        idata = az.from_dict(posterior={"s": np.full((1, n_draws), s)})
        idata = pmo.recover_latent(
            fast, idata, random_seed=2, progressbar=False, mean_correction=corrected
        )
        assert bool(idata.posterior["f_solved"].all())
        draws = idata.posterior["f"].values.reshape(n_draws, 6)
        assert np.all(np.abs(draws.mean(0) - mean) < 5 * np.sqrt(variance / n_draws)), corrected
        assert np.all(np.abs(draws.var(0) - variance) < 5 * variance * np.sqrt(2 / n_draws))
    # the two centres are told apart: δ lies outside the 5-standard-error band (9–12 of them)
    assert np.all(np.abs(shift) > 5 * np.sqrt(variance / n_draws))


@pytest.mark.parametrize("kind", ["mvnormal_cov", "mvnormal_tau", "icar"])
@pytest.mark.parametrize("mode", ["NUMBA", "JAX"])
def test_marginal_is_the_same_under_numba_and_jax(kind, mode):
    """The latent-Gaussian Newton loop and its structure's solves, compiled by numba (nutpie) and
    JAX (numpyro, blackjax): logp and dlogp equal the C backend's to 1e-10 (measured ≤ 5e-13,
    rounding of a 6-element solve with a 1e-6 jitter)."""
    import warnings

    marginal = pmo.marginalize_laplace(_model(kind), "f")
    point = np.array([np.log(0.7)])
    values = {}
    for compile_mode in ("FAST_RUN", mode):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numba's and JAX's own performance notes
            fn = marginal.logp_dlogp_function(ravel_inputs=True, mode=compile_mode)
        fn.set_extra_values({})
        logp, dlogp = fn(point)
        values[compile_mode] = (float(logp), np.array(dlogp))
    assert np.isfinite(values["FAST_RUN"][0])
    assert_allclose(values[mode][0], values["FAST_RUN"][0], rtol=1e-10)
    assert_allclose(values[mode][1], values["FAST_RUN"][1], rtol=1e-10, atol=1e-12)


#: Stan's embedded Laplace + NUTS on the same model and data, 4 chains × 500 draws
#: (pymc_optim/datasets/finland/data/README.md): posterior mean and sd, and its ESS ≈ 800.
STAN_FINLAND = {"alpha": (0.712, 0.202), "rho": (19.6, 9.64)}
STAN_ESS = 800


@pytest.mark.slow
def test_finland_marginal_posterior_agrees_with_stans_embedded_laplace():
    """NUTS on the Laplace marginal of the Finland GP disease map (pm.sample, C backend) against
    Stan's published run of the same approximation: posterior means within 4 combined Monte
    Carlo standard errors (ours from ArviZ's mcse, Stan's sd/√ESS), and sds within 4 combined
    standard errors of a standard deviation, sd·√((κ − 1)/(4 ESS)) with κ the kurtosis of our
    draws (ρ's posterior is skewed and heavy-tailed, κ ≫ 3)."""
    import arviz as az

    from pymc_optim.datasets import finland_model

    marginal = pmo.marginalize_laplace(finland_model(), "theta")
    assert pmo.laplace_info(marginal).structure == LatentGaussianStructure(form="covariance")
    with marginal:
        idata = pm.sample(draws=500, tune=500, chains=4, cores=1, random_seed=19, progressbar=False)
    summary = az.summary(idata, var_names=list(STAN_FINLAND))
    assert (summary["r_hat"] < 1.01).all(), summary
    for name, (stan_mean, stan_sd) in STAN_FINLAND.items():
        draws = idata.posterior[name].values.ravel()
        mean, sd, mcse = summary.loc[name, ["mean", "sd", "mcse_mean"]]
        ess = summary.loc[name, "ess_bulk"]
        assert abs(mean - stan_mean) < 4 * np.hypot(mcse, stan_sd / np.sqrt(STAN_ESS)), summary
        kurtosis = np.mean((draws - draws.mean()) ** 4) / draws.var() ** 2
        se_sd = np.hypot(
            sd * np.sqrt((kurtosis - 1) / (4 * ess)),
            stan_sd * np.sqrt((kurtosis - 1) / (4 * STAN_ESS)),
        )
        assert abs(sd - stan_sd) < 4 * se_sd, (name, sd, se_sd, summary)
