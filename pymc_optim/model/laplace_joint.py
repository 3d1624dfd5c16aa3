"""ℓ(z, θ): the log density of marginalized latents and of what depends on them, on one flat z."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import ModelDeterministic, ModelObservedRV, ModelVar, fgraph_from_model
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim._modes import PYTHON_MODE
from pymc_optim.backends.packing import Packer
from pymc_optim.model._fgraph import replace_variables
from pymc_optim.model.laplace_checks import imputed_name, missing_values_error

__all__ = ["JointDensity", "joint_log_density", "split"]


def joint_log_density(model: pm.Model, latent_rvs, blocks, initial_point: dict) -> JointDensity:
    """ℓ(z, θ) of `latent_rvs` in `model`, with what the marginal and its recovery need.

    `blocks` holds, per latent, the matrix A of a linear constraint A x = 0 carried by its
    transform (:func:`pymc_optim.model.constraints.constraint_matrix`), or None. `initial_point`
    is the model's: the inner solve starts there, and it fixes the latents' static shapes.

    Raises
    ------
    NotImplementedError
        When a free variable (other than a latent) or a Potential depends on a latent.
    ValueError
        When no observed variable depends on a latent.
    """
    fgraph, memo = fgraph_from_model(model, inlined_views=True)
    latent_fg = [memo[rv] for rv in latent_rvs]
    deterministics = _inline_latent_deterministics(fgraph, latent_fg)
    order = {var.name: i for i, var in enumerate(model.deterministics)}
    deterministics.sort(key=lambda item: order[item[0]])  # the user's order
    dependents = _observed_dependents(fgraph, latent_fg, latent_rvs)

    # ℓ(z, θ) on one flat unconstrained control z holding every latent, so that the Hessian's
    # layout is one contiguous vector (and batching over draws stays native).
    starts = [
        np.asarray(initial_point[model.rvs_to_values[original].name]) for original in latent_rvs
    ]
    for i, (original, block) in enumerate(zip(latent_rvs, blocks, strict=True)):
        if block is not None:  # the constrained latent's own N values
            transform = model.rvs_to_transforms[original]
            backward = transform.backward(pt.as_tensor(starts[i]))
            starts[i] = np.asarray(pytensor.function([], backward, mode=PYTHON_MODE)())
    x0 = np.concatenate([start.ravel() for start in starts])
    z = pt.tensor(dtype=x0.dtype, shape=x0.shape, name="latent_unconstrained")
    pieces = split(z, [start.shape for start in starts])
    constrained, log_jacobians = [], []
    for rv, piece, block in zip(latent_fg, pieces, blocks, strict=True):
        transform = rv.owner.op.transform
        if transform is None or block is not None:
            constrained.append(piece)
            log_jacobians.append(pt.constant(0.0))
        else:
            inputs = rv.owner.inputs[0].owner.inputs
            constrained.append(transform.backward(piece, *inputs))
            log_jacobians.append(transform.log_jac_det(piece, *inputs).sum())
    to_constrained = dict(zip(latent_fg, constrained, strict=True))
    terms = []
    for rv, x, log_jac in zip(latent_fg, constrained, log_jacobians, strict=True):
        prior = replace_variables(rv.owner.inputs[0], to_constrained)
        terms.append(_logp(prior, x).sum() + log_jac)
    for obs in dependents:
        obs_rv, data = obs.owner.inputs[0], obs.owner.inputs[1]
        terms.append(_logp(replace_variables(obs_rv, to_constrained), data).sum())
    constraint = None
    if any(block is not None for block in blocks):
        constraint = _stacked_constraint(blocks, [start.size for start in starts])
    return JointDensity(
        fgraph=fgraph,
        latent_fg=latent_fg,
        deterministics=deterministics,
        dependents=dependents,
        z=z,
        x0=x0,
        constrained=constrained,
        to_constrained=to_constrained,
        joint=pt.add(*terms),
        likelihood_terms=terms[len(latent_fg) :],
        constraint=constraint,
    )


class JointDensity(NamedTuple):
    """ℓ(z, θ) written on the model's FunctionGraph, and the pieces of the model around it.

    Attributes
    ----------
    fgraph : the model's FunctionGraph, the latents' Deterministics inlined and removed.
    latent_fg : the latents in `fgraph`.
    deterministics : ``(name, expression)`` of the Deterministics of the latents, in the
        model's order.
    dependents : the observed variables that depend on a latent (in `fgraph`).
    z : the flat unconstrained latent vector (static shape ``x0.shape``).
    x0 : the model's initial point of z.
    constrained : each latent's value as a graph of z.
    to_constrained : `latent_fg` → `constrained`.
    joint : ℓ(z, θ), the log density of the latents (with their log-Jacobians) and of
        `dependents`.
    likelihood_terms : the log densities of `dependents`, one per variable.
    constraint : the (k, d) matrix A of the constraint A z = 0 on z, or None.
    """

    fgraph: FunctionGraph
    latent_fg: list
    deterministics: list
    dependents: list
    z: TensorVariable
    x0: np.ndarray
    constrained: list
    to_constrained: dict
    joint: TensorVariable
    likelihood_terms: list
    constraint: np.ndarray | None


def split(flat, shapes):
    """Consecutive pieces of the vector `flat`, reshaped to `shapes`."""
    return Packer.from_shapes(shapes, flat.dtype).unpack(flat)


def _inline_latent_deterministics(fgraph, latent_fg):
    """Remove the Deterministics that depend on a latent from `fgraph`, writing their
    expressions in their place (an observed variable may depend on one); return their
    ``(name, expression)`` in topological order, for recover_latent."""
    latent_set = set(latent_fg)
    out = []
    for node in fgraph.toposort():
        if not isinstance(node.op, ModelDeterministic):
            continue
        var, expression = node.outputs[0], node.inputs[0]
        if not latent_set & set(ancestors([expression], blockers=list(latent_set))):
            continue
        index = fgraph.outputs.index(var)
        fgraph.replace(var, expression, import_missing=True)
        fgraph.remove_output(index)
        out.append((var.name, expression))
    return out


def _stacked_constraint(blocks, sizes) -> np.ndarray:
    """The (k, d) constraint on the flat latent: each latent's A at its offset."""
    rows, offset = [], 0
    for block, size in zip(blocks, sizes, strict=True):
        if block is not None:
            padded = np.zeros((block.shape[0], sum(sizes)))
            padded[:, offset : offset + size] = block
            rows.append(padded)
        offset += size
    return np.vstack(rows)


def _observed_dependents(fgraph, latent_fg, latent_rvs):
    """The observed variables of `fgraph` that depend on a latent; an error when a free
    variable or a Potential does, or when no observed variable depends on some latent."""
    dependents = []
    latent_set = set(latent_fg)
    for node in fgraph.toposort():
        if not isinstance(node.op, ModelVar):
            continue
        var = node.outputs[0]
        if var in latent_set:
            continue
        depends = bool(latent_set & set(ancestors([node.inputs[0]], blockers=list(latent_set))))
        if not depends:
            continue
        if isinstance(node.op, ModelObservedRV):
            dependents.append(var)
        elif imputed_name({out.name for out in fgraph.outputs}, var.name) is not None:
            raise missing_values_error(var.name)
        else:
            raise NotImplementedError(
                f"`{var.name}` ({type(node.op).__name__}) depends on a marginalized latent; only "
                "observed variables and Deterministics may depend on it. Marginalize it too or "
                "drop it."
            )
    for rv, rv_fg in zip(latent_rvs, latent_fg, strict=True):
        if not any(rv_fg in ancestors([d.owner.inputs[0]]) for d in dependents):
            raise ValueError(
                f"`latent` {rv.name!r}: no observed variable depends on it, so there is nothing "
                "to marginalize against."
            )
    return dependents


def _logp(rv, value):
    """``pm.logp(rv, value)`` where `rv`'s inputs may be model variables of the fgraph.

    Deriving some log densities (e.g. GaussianRandomWalk's) clones the graph above the variable,
    which would duplicate the model's variables; the density is derived on stand-ins for them
    and written back on them.
    """
    # only the outermost model variables: standing in for one inside another (a Deterministic's
    # input) would cut the graph between them
    model_vars = [
        v
        for v in ancestors([rv, value], blockers=None)
        if v.owner is not None and isinstance(v.owner.op, ModelVar)
    ]
    inner = set(ancestors([i for v in model_vars for i in v.owner.inputs]))
    model_vars = [v for v in model_vars if v not in inner]
    standins = {v: v.type() for v in model_vars}
    derived = pm.logp(*graph_replace([rv, value], standins, strict=False))
    return graph_replace(derived, {s: v for v, s in standins.items()}, strict=False)
