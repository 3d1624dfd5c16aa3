"""Argument checks of the Laplace marginal and its recovery: the latents, the model, flags."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim._warnings import PymcOptimWarning

__all__ = [
    "check_draw_shape",
    "check_flag",
    "check_latents",
    "check_mode",
    "check_model",
    "imputed_name",
    "is_gaussian",
    "missing_values_error",
]

#: Latent priors for which the Laplace approximation is exact given a Gaussian likelihood.
#: By the class name of their Op in PyMC 5.28 (pm.Normal, pm.MvNormal with `cov`, `chol` or `tau`,
#: pm.ZeroSumNormal, pm.CAR, pm.ICAR, pm.MatrixNormal, pm.KroneckerNormal; pm.gp latents are
#: MvNormal). ICAR and CAR are Gaussian Markov random fields (ICAR's precision is singular
#: along the constant vector; its zero-sum constraint is in its log density).
_GAUSSIAN_PRIORS = {
    "NormalRV",
    "MvNormalRV",
    "PrecisionMvNormalRV",
    "ZeroSumNormalRV",
    "CARRV",
    "ICARRV",
    "MatrixNormalRV",
    "KroneckerNormalRV",
    "GMRF",  # pymc_optim.distributions.gmrf (CustomDist class names)
    "ICAR",
    "RW",
}
#: Gaussian when the distributions they are built from are (pm.GaussianRandomWalk is a RandomWalk
#: of Normal innovations; pm.AR's innovations are Normal, its `init_dist` need not be).
_GAUSSIAN_IF_COMPONENTS_ARE = {"RandomWalkRV", "AutoRegressiveRV"}


def check_latents(model: pm.Model, latent) -> list[TensorVariable]:
    """The free random variables `latent` names in `model` (names or variables), each checked:
    continuous, listed once, of a fixed size; a PymcOptimWarning when its prior is not
    Gaussian. A ValueError or NotImplementedError names the latent otherwise."""
    items = list(latent) if isinstance(latent, list | tuple) else [latent]
    if not items:
        raise ValueError("`latent` must name at least one variable.")
    out = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if name not in model.named_vars:
            raise ValueError(
                f"`latent` {item!r} is not a variable of the model; free variables: "
                f"{[rv.name for rv in model.free_RVs]}.{_gp_marginal_hint(model)}"
            )
        rv = model[name]
        if imputed_name(model.named_vars, name) is not None:
            raise missing_values_error(name)
        if rv in model.observed_RVs:
            raise ValueError(
                f"`latent` {name!r} is observed; only free variables can be marginalized."
                f"{_gp_marginal_hint(model)}"
            )
        if rv not in model.free_RVs:
            raise ValueError(f"`latent` {name!r} is not a free random variable of the model.")
        if not rv.type.dtype.startswith("float"):
            raise ValueError(
                f"`latent` {name!r} is discrete ({rv.type.dtype}); the Laplace approximation "
                "needs a continuous latent."
            )
        if rv in out:
            raise ValueError(f"`latent` lists {name!r} twice ({items!r}); name each variable once.")
        _check_static_size(model, rv)
        if not is_gaussian(rv, model):
            warnings.warn(
                f"The prior of `{name}` ({type(rv.owner.op).__name__}) is not Gaussian: the "
                "Laplace approximation may be poor. Check it against full NUTS.",
                PymcOptimWarning,
                stacklevel=3,
            )
        out.append(rv)
    return out


def _gp_marginal_hint(model: pm.Model) -> str:
    """What to do instead, for a model whose GP is already integrated out (an observed
    MvNormal, as `pm.gp.Marginal.marginal_likelihood` writes it)."""
    if not any(type(rv.owner.op).__name__ == "MvNormalRV" for rv in model.observed_RVs):
        return ""
    return (
        " An observed MvNormal (`pm.gp.Marginal`'s `marginal_likelihood`) is a Gaussian process "
        "integrated out exactly already: sample the model as it is. For a non-Gaussian "
        "likelihood, write the GP with `pm.gp.Latent` or `pm.gp.HSGP` and pass the name given "
        "to its `prior` (e.g. `pmo.marginalize_laplace(model, 'f')`)."
    )


def is_gaussian(rv, model: pm.Model) -> bool:
    """Whether the prior of `rv` is Gaussian given its parameters: a Gaussian distribution, or a
    random walk / AR whose component distributions (init and innovations, the unregistered
    ``.dist`` inputs) are; the model's own variables among its inputs are parameters (an
    innovation scale ``sigma ~ HalfNormal``), not components."""
    kind = type(rv.owner.op).__name__
    if kind in _GAUSSIAN_PRIORS:
        return True
    if kind in _GAUSSIAN_IF_COMPONENTS_ARE:
        parameters = set(model.basic_RVs)
        components = [
            i
            for i in rv.owner.inputs
            if i.owner is not None and hasattr(i.owner.op, "ndim_supp") and i not in parameters
        ]
        return all(type(c.owner.op).__name__ in _GAUSSIAN_PRIORS for c in components)
    return False


def _check_static_size(model: pm.Model, rv) -> None:
    """A latent's size is fixed when the marginal is built (the inner solve's x0 has it): refuse
    one whose size follows a pm.Data container, which `pm.set_data` may resize. (A dim's length
    is a shared variable too, but resizing a dim is a model change, not new data.)"""
    if None not in rv.type.shape:
        return
    containers = set(model.data_vars)
    # the size input, and containers of one or more dimensions among the parameters (a 0-d one,
    # such as a hyperparameter fixed by pm.do, cannot change the shape)
    size, params = rv.owner.inputs[1], rv.owner.inputs[2:]
    data = [v.name for v in ancestors([size]) if v in containers]
    data += [v.name for v in ancestors(params) if v in containers and v.type.ndim > 0]
    if data:
        size = np.shape(model.initial_point()[model.rvs_to_values[rv].name])
        raise NotImplementedError(
            f"`latent` {rv.name!r} has a shape that depends on the data {sorted(set(data))} "
            f"(now {size}): the marginal fixes the latent's size when it is built, so changing "
            "the data afterwards (`pm.set_data`) would be wrong. Give the latent a fixed shape "
            f"(`shape={size}`, or `dims`) before marginalizing it."
        )


def imputed_name(names, name: str | None) -> str | None:
    """The observed variable whose missing values the free variable `name` holds (PyMC splits an
    observed `y` with NaNs into an observed `y_observed` and a free `y_unobserved`), else None;
    `names` are the model's variable names."""
    if not (name or "").endswith("_unobserved"):
        return None
    base = name[: -len("_unobserved")]
    return base if f"{base}_observed" in names else None


def missing_values_error(imputed: str) -> NotImplementedError:
    """The error for a latent-dependent free variable `imputed` that holds missing values."""
    observed = imputed[: -len("_unobserved")]
    return NotImplementedError(
        f"`{observed}` has missing values: PyMC imputes them as the free variable `{imputed}`, "
        "which depends on the marginalized latent, and a Laplace marginal needs everything that "
        f"depends on the latent observed. Drop the missing entries of `{observed}` (and the "
        "matching rows of its indices or covariates) before marginalizing, then predict them "
        "from the recovered latent (e.g. pm.sample_posterior_predictive on a model over all rows)."
    )


def check_model(model, argument: str, function: str) -> None:
    """A TypeError unless `model`, the `argument` of `function`, is a ``pm.Model``."""
    if not isinstance(model, pm.Model):
        raise TypeError(
            f"`{argument}` of `{function}` must be a `pm.Model`; got {model!r}. Pass the model "
            "itself (e.g. `with pm.Model() as model: ...`, then `model`); it is not taken from "
            "the model context."
        )


def check_flag(value, argument: str, what_false_does: str) -> None:
    """A TypeError unless the flag `argument` is True or False."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(
            f"`{argument}` must be True or False; got {value!r}. Pass `{argument}=False` to "
            f"{what_false_does}."
        )


def check_mode(mode) -> None:
    """`recover_latent`'s `mode` names a PyTensor compile mode (or is one)."""
    if mode is None:
        return
    from pytensor.compile.mode import get_mode

    try:
        get_mode(mode)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"`mode` must be a PyTensor compile mode, e.g. 'NUMBA', 'JAX' or None (the default "
            f"C backend); got {mode!r} ({error})."
        ) from None


def check_draw_shape(rv, shape, n_chains: int, n_draws: int) -> None:
    """A ValueError unless the posterior draws of `rv` have `rv`'s shape after (chain, draw)."""
    expected = rv.type.shape
    got = tuple(shape)[2:]
    if len(got) != len(expected) or any(
        e is not None and e != g for e, g in zip(expected, got, strict=True)
    ):
        expected_text = tuple("?" if e is None else e for e in expected)
        raise ValueError(
            f"`idata.posterior[{rv.name!r}]` must have shape (chain, draw, *{expected_text}) "
            f"(`{rv.name}` in the model has shape {expected_text}); got {tuple(shape)}. Pass the "
            "posterior of this marginal model (from `pm.sample` on it)."
        )
