"""Same `random_seed`, same draws: with one core and with two (worker processes unpickle the
compiled model), for a model with a scipy-backed `pmo.minimize` and one with
`marginalize_laplace`; and under nutpie, with its default numba backend (both models and a
graph-native `pmo.minimize`) and with JAX (the graph-native ones; JAX cannot call scipy). Each
test prints its row of the determinism table
(``pytest -s tests/test_determinism.py | grep DETERMINISM``)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo

SAMPLE = dict(tune=50, draws=50, chains=2, random_seed=7, progressbar=False)
SAMPLE["compute_convergence_checks"] = False


def minimize_model() -> pm.Model:
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        x = pt.vector("x", shape=(2,))
        x_star, success = pmo.minimize(((x - a) ** 2).sum() + pt.exp(x).sum(), x, x0=np.zeros(2))
        pm.Potential("failed", pt.switch(success, 0.0, -np.inf))
        pm.Normal("y", x_star.sum(), 1.0, observed=np.array([-0.4, 0.1]))
    return model


def newton_minimize_model() -> pm.Model:
    """`minimize_model` solved in the graph (method="newton"): nutpie compiles it with numba
    or JAX (a scipy-backed solve runs in numba's object mode, and not at all under JAX)."""
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        x = pt.vector("x", shape=(2,))
        x_star, success = pmo.minimize(
            ((x - a) ** 2).sum() + pt.exp(x).sum(), x, x0=np.zeros(2), method="newton"
        )
        pm.Potential("failed", pt.switch(success, 0.0, -np.inf))
        pm.Normal("y", x_star.sum(), 1.0, observed=np.array([-0.4, 0.1]))
    return model


def laplace_model() -> pm.Model:
    counts = np.array([0, 3, 1, 5, 2, 2, 4, 1])
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        u = pm.Normal("u", 0.0, tau, shape=4)
        pm.Poisson("y", pt.exp(b0 + u[np.arange(8) % 4]), observed=counts)
    return pmo.marginalize_laplace(model, "u")


def _report(sampler, build, one, two, again, other):
    first = next(iter(one))
    print(
        f"DETERMINISM | {sampler} | {build.__name__} | "
        f"cores 1 = cores 2: {all(np.array_equal(one[k], two[k]) for k in one)} | "
        f"rerun: {all(np.array_equal(one[k], again[k]) for k in one)} | "
        f"other seed differs: {not np.array_equal(one[first], other[first])} | "
        f"draws compared: {sum(v.size for v in one.values())}"
    )


def _draws(model, cores, seed=7):
    with model:
        idata = pm.sample(cores=cores, **{**SAMPLE, "random_seed": seed})
    return {name: idata.posterior[name].values for name in idata.posterior.data_vars}


@pytest.mark.parametrize(
    "build", [minimize_model, pytest.param(laplace_model, marks=pytest.mark.slow)]
)
def test_same_seed_same_draws_with_one_and_two_cores(build):
    one, two, again = _draws(build(), 1), _draws(build(), 2), _draws(build(), 1)
    other = _draws(build(), 1, seed=8)
    _report("pm.sample", build, one, two, again, other)
    _assert_deterministic(one, two, again, other)


def _assert_deterministic(one, two, again, other):
    assert one.keys() == two.keys() == again.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
        np.testing.assert_array_equal(one[name], again[name])
    first = next(iter(one))
    assert not np.array_equal(one[first][0], one[first][1])  # chains differ
    assert not np.array_equal(one[first], other[first])  # and seeds do


@pytest.mark.slow
@pytest.mark.parametrize(
    "build, backend",
    [
        (minimize_model, "numba"),  # the scipy solve in numba's object mode
        (newton_minimize_model, "numba"),
        (laplace_model, "numba"),
        (newton_minimize_model, "jax"),
        (laplace_model, "jax"),
    ],
)
def test_same_seed_same_draws_under_nutpie(build, backend):
    """nutpie compiled once (numba, its default backend, or JAX), sampled with one and two
    cores."""
    nutpie = pytest.importorskip("nutpie")
    options = {} if backend == "numba" else {"backend": "jax", "gradient_backend": "jax"}
    compiled = nutpie.compile_pymc_model(build(), **options)

    def draws(cores, seed=7):
        idata = nutpie.sample(
            compiled, draws=50, tune=50, chains=2, cores=cores, seed=seed, progress_bar=False
        )
        return {name: idata.posterior[name].values for name in idata.posterior.data_vars}

    one, two, again, other = draws(1), draws(2), draws(1), draws(1, seed=8)
    _report(f"nutpie ({backend})", build, one, two, again, other)
    _assert_deterministic(one, two, again, other)


def test_a_scipy_backed_solve_under_nutpie_jax_says_what_runs():
    """JAX cannot call scipy inside a compiled function: the error names the graph-native
    method."""
    nutpie = pytest.importorskip("nutpie")
    with pytest.raises(NotImplementedError, match=r"cannot run under the JAX backend. Use `meth"):
        nutpie.compile_pymc_model(minimize_model(), backend="jax", gradient_backend="jax")
