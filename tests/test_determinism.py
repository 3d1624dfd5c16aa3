"""Same `random_seed`, same draws: with one core and with two (worker processes unpickle the
compiled model), for a model with a scipy-backed `pmo.minimize` and one with
`marginalize_laplace`."""

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


def laplace_model() -> pm.Model:
    counts = np.array([0, 3, 1, 5, 2, 2, 4, 1])
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        u = pm.Normal("u", 0.0, tau, shape=4)
        pm.Poisson("y", pt.exp(b0 + u[np.arange(8) % 4]), observed=counts)
    return pmo.marginalize_laplace(model, "u")


def _draws(model, cores):
    with model:
        idata = pm.sample(cores=cores, **SAMPLE)
    return {name: idata.posterior[name].values for name in idata.posterior.data_vars}


@pytest.mark.parametrize(
    "build", [minimize_model, pytest.param(laplace_model, marks=pytest.mark.slow)]
)
def test_same_seed_same_draws_with_one_and_two_cores(build):
    one, two, again = _draws(build(), 1), _draws(build(), 2), _draws(build(), 1)
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
        np.testing.assert_array_equal(one[name], again[name])
    assert not np.array_equal(one[next(iter(one))][0], one[next(iter(one))][1])  # chains differ
