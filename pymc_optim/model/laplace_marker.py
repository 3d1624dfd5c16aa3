"""The marker of a Laplace marginal in a model's graph, and :func:`laplace_info` that reads it."""

from __future__ import annotations

from typing import NamedTuple

import pymc as pm
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.rewriting.basic import register_canonicalize
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.structure import LinearStructure
from pymc_optim.model.laplace_checks import check_model

__all__ = ["LaplaceInfo", "LaplaceMarginal", "laplace_info", "laplace_marker", "laplace_node"]


def laplace_info(marginal_model: pm.Model) -> LaplaceInfo:
    """The Laplace marginal's latent names, Hessian structure, mode, Hessian and success flag.

    Read from the graph of the model's ``laplace_marginal`` potential, so it survives model
    transformations such as ``pm.model.fgraph.clone_model``.

    Raises
    ------
    TypeError
        If `marginal_model` was not made by :func:`marginalize_laplace`.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> with pm.Model() as model:
    ...     mu = pm.Normal("mu", 0.0, 1.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=3)
    ...     y = pm.Normal("y", u, 1.0, observed=np.array([0.5, -1.0, 2.0]))
    >>> info = pmo.laplace_info(pmo.marginalize_laplace(model, "u"))
    >>> info.names, info.structure.kind
    (['u'], 'diagonal')
    """
    check_model(marginal_model, "marginal_model", "laplace_info")
    node = laplace_node(marginal_model)
    op = node.op
    _, mode, hessian, success, *_ = node.inputs
    n = len(op.latent_names)
    return LaplaceInfo(
        list(op.latent_names), list(op.output_names[n:]), op.structure, mode, hessian, success
    )


class LaplaceInfo(NamedTuple):
    """What :func:`marginalize_laplace` built, read off a marginal model's graph.

    Attributes
    ----------
    names : the marginalized latents.
    deterministics : the Deterministics of the latent that :func:`recover_latent` computes.
    structure : the layout of H (`LinearStructure`), chosen or detected.
    mode : x*(θ), flat and unconstrained, a graph of the model's variables.
    hessian : H(θ) at the mode, in the structure's compact form.
    success : whether the inner solve converged.
    """

    names: list[str]
    deterministics: list[str]
    structure: LinearStructure
    mode: TensorVariable
    hessian: TensorVariable
    success: TensorVariable


class LaplaceMarginal(Op):
    """The Laplace marginal's value (its first input, passed through), marked in the model's
    graph with what :func:`recover_latent` needs.

    `observed_names` are the observed variables integrated out with the latents (for the
    error of ``pmo.sample_posterior_predictive`` in the marginal model, see
    :func:`pymc_optim.model.laplace_predictive.sample_posterior_predictive`).

    Inputs are ``[marginal, mode, hessian, success, *params]``; the inner graph
    ``recovery_inputs = [z, *placeholders] → recovery_outputs`` maps a flat unconstrained latent
    draw z and the model variables `params` to the latent variables and their Deterministics.
    Carried as a node of the potential's graph, this survives what copies a model's graph
    (``clone_model``, ``do``, ``observe``), where an attribute of the model would not. The
    marker is removed when the graph is compiled (a canonicalization rewrite), so it costs the
    sampler nothing; its gradient is the identity on the marginal.
    """

    view_map = {0: [0]}

    def __init__(
        self,
        *,
        latent_names,
        output_names,
        dims,
        structure,
        recovery_inputs,
        recovery_outputs,
        observed_names=(),
        constraint=None,
    ):
        self.latent_names = tuple(latent_names)
        self.observed_names = tuple(observed_names)  # integrated out with the latents
        self.output_names = tuple(output_names)
        self.dims = tuple(None if d is None else tuple(d) for d in dims)
        self.structure = structure
        self.recovery_inputs = list(recovery_inputs)
        self.recovery_outputs = list(recovery_outputs)
        #: the (k, d) matrix A of the kriging constraint A z = 0 on the flat latent, or None
        self.constraint = constraint

    def make_node(self, marginal, mode, hessian, success, *params):
        inputs = [pt.as_tensor_variable(v) for v in (marginal, mode, hessian, success)]
        inputs += list(params)
        return Apply(self, inputs, [inputs[0].type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        return [output_grads[0], *(disconnected_type() for _ in inputs[1:])]

    def connection_pattern(self, node):
        return [[True], *([False] for _ in node.inputs[1:])]

    def __str__(self):
        return f"LaplaceMarginal{{{', '.join(self.latent_names)}}}"


@register_canonicalize
@node_rewriter([LaplaceMarginal])
def remove_laplace_marker(fgraph, node):
    """The compiled log density needs only the marginal's value."""
    return [node.inputs[0]]


def laplace_node(model: pm.Model):
    """The node of the LaplaceMarginal marker among `model`'s potentials; a TypeError naming
    `marginal_model` when there is none."""
    for var in model.potentials:
        node = var.owner
        if node is not None and isinstance(node.op, LaplaceMarginal):
            return node
    raise TypeError(
        "`marginal_model` must be a model returned by `pmo.marginalize_laplace` (or a copy of "
        "one, e.g. by `pm.model.fgraph.clone_model`): no potential of the model holds a Laplace "
        f"marginal; its potentials are {[p.name for p in model.potentials]}. If the model was "
        "rebuilt by a transformation that drops potentials, call `pmo.marginalize_laplace` on "
        "the transformed original model instead."
    )


def laplace_marker(model: pm.Model):
    """The LaplaceMarginal Op of `model`'s potentials, or None."""
    for var in model.potentials:
        if var.owner is not None and isinstance(var.owner.op, LaplaceMarginal):
            return var.owner.op
    return None
