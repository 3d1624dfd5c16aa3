"""pymc_optim.model.laplace_predictive: ``pmo.sample_posterior_predictive`` refuses a Laplace
marginal model with the recipe; PyMC's own function is left as PyMC wrote it."""

from __future__ import annotations

import re
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pymc.sampling.forward
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pymc.model.fgraph import clone_model

import pymc_optim as pmo

F64 = np.float64
GROUP = np.repeat(np.arange(4), 3)
Y = np.random.default_rng(5).normal(1.0, 1.0, GROUP.size)
RECIPE = r"(?s)Predict in the original model.*pmo.recover_latent\(marginal_model, idata\)"


def intercepts_model() -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        tau = pm.HalfNormal("tau", F64(1.0))
        x = pm.Normal("x", mu, tau, shape=4)
        pm.Deterministic("rate", pt.exp(mu + x))
        pm.Deterministic("mu_twice", 2 * mu)  # not of the latent: stays in the marginal model
        pm.Normal("y", x[GROUP], F64(0.7), observed=Y)
    return model


def posterior_at(mu, tau):
    return az.from_dict({"posterior": {"mu": np.array([mu]), "tau": np.array([tau])}})


@pytest.mark.parametrize("transform", [lambda m: m, clone_model], ids=["marginal", "cloned"])
def test_the_marginal_model_raises_the_recipe(transform):
    """PyMC would return an empty DataTree (the observed `y` went with the latent)."""
    marginal = transform(pmo.marginalize_laplace(intercepts_model(), "x"))
    idata = posterior_at([0.5, 1.0], [0.8, 1.2])
    with (
        marginal,
        pytest.raises(
            NotImplementedError, match=r"observed variables \['y'\] were integrated out with the la"
        ) as error,
    ):
        pmo.sample_posterior_predictive(idata, progressbar=False)
    assert re.search(RECIPE, str(error.value))
    with pytest.raises(NotImplementedError, match=RECIPE):
        pmo.sample_posterior_predictive(idata, model=marginal)
    # naming a variable integrated out (observed, latent, Deterministic of the latent)
    for name in ("y", "x", "rate"):
        with pytest.raises(NotImplementedError, match=rf"`var_names` \['{name}'\] are not var"):
            pmo.sample_posterior_predictive(idata, model=marginal, var_names=[name])
    with pytest.raises(NotImplementedError, match=r"`var_names` \['y'\] are not var"):
        pmo.sample_posterior_predictive(idata, model=marginal, sample_vars=["y"])


def test_variables_of_the_marginal_model_are_predicted_by_pymc():
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    idata = posterior_at([0.5, 1.0], [0.8, 1.2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PyMC: Potentials are ignored
        predictive = pmo.sample_posterior_predictive(
            idata, model=marginal, var_names=["mu_twice"], progressbar=False
        )
        by_sample_vars = pmo.sample_posterior_predictive(
            idata, model=marginal, sample_vars=["mu_twice"], progressbar=False
        )
    assert_allclose(predictive.posterior_predictive["mu_twice"], 2 * idata.posterior["mu"])
    assert_allclose(by_sample_vars.posterior_predictive["mu_twice"], 2 * idata.posterior["mu"])


def test_any_other_model_gets_pymcs_draws():
    model = intercepts_model()
    posterior = {"mu": np.array([[0.5, 1.0]]), "tau": np.ones((1, 2)), "x": np.zeros((1, 2, 4))}
    idata = az.from_dict({"posterior": posterior})
    ours = pmo.sample_posterior_predictive(idata, model, random_seed=3, progressbar=False)
    pymcs = pm.sample_posterior_predictive(idata, model, random_seed=3, progressbar=False)
    assert_allclose(ours.posterior_predictive["y"], pymcs.posterior_predictive["y"])


def test_pymcs_function_is_pymcs_own_and_returns_no_latent_draws():
    """Importing pymc_optim replaces nothing of PyMC's; in a marginal model PyMC's function has
    no latent to draw: nothing comes back for `var_names=None` (with PyMC's warning about the
    Potential that holds the marginal), a KeyError for an integrated-out name."""
    assert pm.sample_posterior_predictive is pymc.sampling.forward.sample_posterior_predictive
    assert pm.sample_posterior_predictive.__module__ == "pymc.sampling.forward"
    assert not hasattr(pm.sample_posterior_predictive, "__wrapped__")
    marginal = pmo.marginalize_laplace(intercepts_model(), "x")
    idata = posterior_at([0.5, 1.0], [0.8, 1.2])
    with pytest.warns(UserWarning, match="Potentials .* ignored"):
        predictive = pm.sample_posterior_predictive(idata, model=marginal, progressbar=False)
    assert "posterior_predictive" not in predictive.children
    for name in ("x", "y"):
        with pytest.raises(KeyError), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            pm.sample_posterior_predictive(idata, model=marginal, var_names=[name])
