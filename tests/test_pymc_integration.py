"""Solver Ops inside PyMC models: the Laplace-marginal regression test (random intercepts).

A Poisson random-intercepts model (30 groups of 5 counts, simulated with a fixed seed) whose
random effects u are integrated out by a hand-written Laplace approximation:

    log p(y | mu, sigma) ≈ ℓ(u*) + (G/2) log 2π − ½ log det H,   u* = argmaxᵤ ℓ(u),

with ℓ(u) = log N(u | 0, sigma) + log Poisson(y | exp(mu + u[group])) built from ``pm.logp``
terms and u* from ``pmo.minimize``. The Hessian H = −∇²ℓ(u*) is diagonal: 1/sigma² plus the sum
of the Poisson rates in each group. The model's gradient therefore runs through the implicit
gradient of u*(mu, sigma), inside the graphs that ``pm.sample`` compiles and pickles.
"""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.optimize
import scipy.stats
from pytensor.graph.replace import graph_replace

import pymc_optim as pmo

N_GROUPS, N_PER_GROUP = 30, 5
MU_TRUE, SIGMA_TRUE = 1.0, 0.5
#: a point of the unconstrained space near the posterior mode
POINT = {"mu": np.array(0.9), "sigma_log__": np.array(np.log(0.4))}


def simulate(seed: int = 1):
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, SIGMA_TRUE, N_GROUPS)
    group = np.repeat(np.arange(N_GROUPS), N_PER_GROUP)
    y = rng.poisson(np.exp(MU_TRUE + u[group]))
    return y, group


Y, GROUP = simulate()


def laplace_model(method: str = "BFGS", optimizer_kwargs=None) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pt.vector("u", shape=(N_GROUPS,))
        joint = (
            pm.logp(pm.Normal.dist(0.0, sigma), u).sum()
            + pm.logp(pm.Poisson.dist(pt.exp(mu + u[GROUP])), Y).sum()
        )
        u_star, success = pmo.minimize(
            -joint, u, x0=np.zeros(N_GROUPS), method=method, optimizer_kwargs=optimizer_kwargs
        )
        rates = pt.exp(mu + u_star[GROUP])
        hessian_diagonal = 1.0 / sigma**2 + pt.zeros(N_GROUPS)[GROUP].inc(rates)
        pm.Potential(
            "laplace",
            graph_replace(joint, {u: u_star})
            + 0.5 * N_GROUPS * np.log(2 * np.pi)
            - 0.5 * pt.log(hessian_diagonal).sum(),
        )
        pm.Deterministic("converged", success)
    return model


def laplace_logp_reference(mu: float, sigma: float) -> float:
    """The model's log density at (mu, log sigma), from scipy alone."""

    def negative_joint(u):
        rates = np.exp(mu + u[GROUP])
        value = -scipy.stats.norm(0.0, sigma).logpdf(u).sum()
        value -= scipy.stats.poisson(rates).logpmf(Y).sum()
        gradient = u / sigma**2 + np.bincount(GROUP, rates - Y, minlength=N_GROUPS)
        return value, gradient

    def hessian(u):
        return np.diag(1 / sigma**2 + np.bincount(GROUP, np.exp(mu + u[GROUP])))

    res = scipy.optimize.minimize(
        negative_joint, np.zeros(N_GROUPS), jac=True, hess=hessian, method="trust-exact"
    )
    assert res.success
    _, log_det = np.linalg.slogdet(hessian(res.x))
    laplace = -res.fun + 0.5 * N_GROUPS * np.log(2 * np.pi) - 0.5 * log_det
    priors = scipy.stats.norm(0.0, 2.0).logpdf(mu) + scipy.stats.halfnorm(0.0, 1.0).logpdf(sigma)
    return laplace + priors + np.log(sigma)  # log-Jacobian of sigma = exp(sigma_log__)


def central_differences(logp, point, eps):
    grads = []
    for name in point:
        up, down = dict(point), dict(point)
        up[name] = point[name] + eps
        down[name] = point[name] - eps
        grads.append((logp(up) - logp(down)) / (2 * eps))
    return np.array(grads)


def test_the_model_log_density_matches_a_scipy_laplace_approximation():
    model = laplace_model()
    assert [v.name for v in model.value_vars] == list(POINT)
    logp = model.compile_logp()
    # BFGS stops at |∇ᵤℓ| ≈ 4e-6, which moves ½ log det H by ~1e-6: far below this tolerance
    np.testing.assert_allclose(
        logp(POINT),
        laplace_logp_reference(float(POINT["mu"]), float(np.exp(POINT["sigma_log__"]))),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "method, rtol",
    [
        # BFGS's line search loses precision at |∇ᵤℓ| ≈ 4e-6 (its default gtol is 1e-5). The
        # implicit gradient assumes ∇ᵤℓ(u*) = 0, so the two differ by about |∇ᵤℓ|·|du*/dθ|:
        # ~3e-5 on a gradient of size ~1.6, hence 1e-4 relative.
        ("BFGS", 1e-4),
        # Newton-CG converges quadratically to |∇ᵤℓ| < 1e-6; central differences with
        # eps = 1e-5 then agree to ~4e-7 relative.
        ("Newton-CG", 1e-5),
    ],
)
def test_compiled_dlogp_matches_finite_differences_of_logp(method, rtol):
    model = laplace_model(method)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    value, gradient = logp(POINT), dlogp(POINT)
    assert np.isfinite(value) and np.isfinite(gradient).all()
    assert gradient.shape == (2,)
    # eps = 1e-5: rounding of a log density of size ~300 costs 300 * 1e-16 / eps ≈ 3e-9, the
    # O(eps²) truncation ~1e-10; both far below the tolerance
    np.testing.assert_allclose(gradient, central_differences(logp, POINT, 1e-5), rtol=rtol)


def test_the_initial_point_is_finite_and_converged():
    model = laplace_model()
    point = model.initial_point()
    assert np.isfinite(model.compile_logp()(point))
    assert np.isfinite(model.compile_dlogp()(point)).all()
    (converged,) = model.replace_rvs_by_values([model["converged"]])
    assert pytensor.function(model.value_vars, converged)(**point)


@pytest.mark.slow
def test_sampling_the_laplace_marginal_recovers_mu():
    model = laplace_model()
    with model:
        idata = pm.sample(
            draws=100,
            tune=100,
            chains=2,
            cores=2,  # the solver Op must pickle into the worker processes
            random_seed=20240611,
            progressbar=False,
            compute_convergence_checks=False,
        )
    posterior = idata.posterior
    assert posterior.sizes["chain"] == 2 and posterior.sizes["draw"] == 100
    assert int(idata.sample_stats["diverging"].sum()) <= 4
    assert bool(posterior["converged"].all())
    # posterior sd of mu is ~0.09 with 150 counts; 0.3 is a wide band around the truth
    assert abs(float(posterior["mu"].mean()) - MU_TRUE) < 0.3
    assert 0.15 < float(posterior["sigma"].mean()) < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("nuts_sampler", ["pymc", "nutpie", "numpyro"])
def test_graph_native_laplace_marginal_samples_with_every_nuts_sampler(nuts_sampler):
    """method='newton' runs in the C backend (pymc), numba (nutpie) and JAX (numpyro)."""
    pytest.importorskip(nuts_sampler)
    with laplace_model(method="newton"):
        idata = pm.sample(
            draws=150,
            tune=150,
            chains=2,
            cores=1,
            random_seed=20240611,
            progressbar=False,
            nuts_sampler=nuts_sampler,
            compute_convergence_checks=False,
        )
    posterior = idata.posterior
    assert bool(posterior["converged"].all())
    # same band as the BFGS test: the posterior sd of mu is ~0.09
    assert abs(float(posterior["mu"].mean()) - MU_TRUE) < 0.3
    assert 0.15 < float(posterior["sigma"].mean()) < 1.0
