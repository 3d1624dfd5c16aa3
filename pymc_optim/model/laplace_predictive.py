"""``pm.sample_posterior_predictive`` in a Laplace marginal model: the recipe, not silence."""

from __future__ import annotations

import pymc as pm

from pymc_optim.model.laplace_marker import laplace_marker

__all__ = ["check_posterior_predictive", "guard_posterior_predictive"]


def guard_posterior_predictive() -> None:
    """Make ``pm.sample_posterior_predictive`` raise the recipe in a Laplace marginal model.

    PyMC 6.4's ``sample_posterior_predictive`` picks ``model.observed_RVs`` (and the
    Deterministics depending on them) when `var_names` and `sample_vars` are None, and returns
    an empty result, touching no variable, when there are none. Every model attribute it reads
    before that is read by ``pm.sample`` too, and a stand-in observed variable in the marginal
    model would enter ``observed_data``, the log likelihood (``az.loo`` would run on it) and prior
    predictive draws. So the check is a wrapper of the function, which calls PyMC's unchanged
    for every other model, installed once where PyMC exposes it (``pm``, ``pymc.sampling``,
    ``pymc.sampling.forward``).
    """
    import functools
    import inspect
    import sys

    import pymc.sampling.forward as forward

    original = forward.sample_posterior_predictive
    if getattr(original, "_pymc_optim_laplace_guard", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def sample_posterior_predictive(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        model = pm.modelcontext(bound.arguments.get("model"))
        # var_names defaults to sample_vars when that is given
        var_names = bound.arguments.get("var_names")
        if var_names is None:
            var_names = bound.arguments.get("sample_vars")
        check_posterior_predictive(model, var_names)
        return original(*args, **kwargs)

    sample_posterior_predictive._pymc_optim_laplace_guard = True
    for name in ("pymc.sampling.forward", "pymc.sampling", "pymc"):
        module = sys.modules.get(name)
        if getattr(module, "sample_posterior_predictive", None) is original:
            module.sample_posterior_predictive = sample_posterior_predictive


def check_posterior_predictive(model: pm.Model, var_names) -> None:
    """Refuse ``pm.sample_posterior_predictive`` in a Laplace marginal model where PyMC would
    silently leave out the observed variables (they were integrated out with the latent)."""
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
            f"{list(op.latent_names)}: it would silently return no draws of them"
        )
    raise NotImplementedError(
        "`pm.sample_posterior_predictive` in a model returned by `pmo.marginalize_laplace`: "
        f"{what}. Predict in the original model from recovered latent draws:\n\n"
        "    idata = pmo.recover_latent(marginal_model, idata)\n"
        "    with model:  # the model given to pmo.marginalize_laplace\n"
        "        pm.sample_posterior_predictive(idata, extend_inferencedata=True)\n\n"
        "and compare models the same way: `az.loo(pm.compute_log_likelihood(idata, "
        "model=model))`. To predict variables of the marginal model only, name them in "
        "`var_names`."
    )
