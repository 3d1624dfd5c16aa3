"""Posterior predictive sampling that refuses a Laplace marginal model with the recipe."""

from __future__ import annotations

from typing import Any

import pymc as pm

from pymc_optim.model.laplace_marker import laplace_marker

__all__ = ["check_posterior_predictive", "sample_posterior_predictive"]


def sample_posterior_predictive(
    trace: Any,
    model: pm.Model | None = None,
    *,
    var_names: str | list[str] | None = None,
    sample_vars: str | list[str] | None = None,
    **kwargs: Any,
) -> Any:
    """``pm.sample_posterior_predictive``, refusing what it cannot do in a Laplace marginal model.

    In a model returned by :func:`marginalize_laplace` the observed variables that depend on the
    latent were integrated out with it. There, PyMC's function (left as PyMC wrote it) returns
    no draws of them when `var_names` is None — an empty result, with PyMC's warning that
    Potentials are ignored — and a ``KeyError`` for the latent's or the observations' names.
    This function raises instead, with the recipe: :func:`recover_latent`, then PyMC's
    function in the original model. For every other model, and for `var_names` naming variables
    the marginal model has, it is PyMC's function with the same arguments.

    Parameters
    ----------
    trace : DataTree, Dataset, MultiTrace or list of dict
        As for ``pm.sample_posterior_predictive``.
    model : pm.Model, optional
        The model; the one of the ``with`` context when None.
    var_names, sample_vars : str or list of str, optional
        As for ``pm.sample_posterior_predictive`` (`var_names` defaults to `sample_vars`).
    **kwargs
        Passed on to ``pm.sample_posterior_predictive``.

    Returns
    -------
    predictive : DataTree or dict
        What ``pm.sample_posterior_predictive`` returns.

    Raises
    ------
    NotImplementedError
        In a Laplace marginal model, when `var_names` (or `sample_vars`) is None or names a
        variable integrated out; the message shows the recipe.

    Examples
    --------
    >>> import arviz as az, numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 1.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=3)
    ...     y = pm.Normal("y", u, 1.0, observed=np.array([0.5, -1.0, 2.0]))
    >>> marginal = pmo.marginalize_laplace(model, "u")
    >>> idata = az.from_dict({"posterior": {"mu": np.zeros((1, 2))}})
    >>> try:
    ...     pmo.sample_posterior_predictive(idata, marginal)
    ... except NotImplementedError as error:
    ...     print("pmo.recover_latent(marginal_model, idata)" in str(error))
    True
    """
    model = pm.modelcontext(model)
    check_posterior_predictive(model, sample_vars if var_names is None else var_names)
    return pm.sample_posterior_predictive(
        trace, model, var_names=var_names, sample_vars=sample_vars, **kwargs
    )


def check_posterior_predictive(model: pm.Model, var_names) -> None:
    """Refuse posterior predictive sampling in a Laplace marginal model where PyMC would leave
    out the observed variables (they were integrated out with the latent)."""
    op = laplace_marker(model)
    if op is None:
        return
    removed = [*op.observed_names, *op.output_names]  # observed, latents, their Deterministics
    if var_names is not None:
        asked = [var_names] if isinstance(var_names, str) else list(var_names)
        gone = [name for name in asked if name in removed or name not in model.named_vars]
        if not gone:
            return  # variables of the marginal model: PyMC predicts them
        what = f"`var_names` {gone} are not variables of the marginal model"
    else:
        what = (
            "with `var_names=None` PyMC predicts the model's observed variables, and the "
            f"observed variables {list(op.observed_names)} were integrated out with the latent "
            f"{list(op.latent_names)}: it would return no draws of them"
        )
    raise NotImplementedError(
        "Posterior predictive sampling in a model returned by `pmo.marginalize_laplace`: "
        f"{what}. Predict in the original model from recovered latent draws:\n\n"
        "    idata = pmo.recover_latent(marginal_model, idata)\n"
        "    with model:  # the model given to pmo.marginalize_laplace\n"
        "        pm.sample_posterior_predictive(idata, extend_inferencedata=True)\n\n"
        "and compare models the same way: `az.loo(pm.compute_log_likelihood(idata, "
        "model=model))`. To predict variables of the marginal model only, name them in "
        "`var_names`."
    )
