"""Graphs written on a model's FunctionGraph (PyMC's ``ModelVar`` nodes), as marginalize_laplace
builds them: the model variables a graph reads, and a graph at the latent's mode kept apart from
PyMC's pre-gradient rewrites."""

from __future__ import annotations

from functools import partial

import pytensor.tensor as pt
from pymc.model.fgraph import ModelVar
from pytensor import config
from pytensor.compile.builders import OpFromGraph
from pytensor.gradient import DisconnectedType, NullType, disconnected_type, grad
from pytensor.graph.basic import Constant
from pytensor.graph.op import io_connection_pattern
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

__all__ = ["graphs_at_mode", "outer_inputs", "replace_variables"]


def replace_variables(outputs, replace: dict):
    """``graph_replace(outputs, replace, strict=False)`` where one replaced variable may be
    computed from another: of nested random effects ``r`` and ``c ~ Normal(r[region], s)``, a
    likelihood reads ``c`` only, and PyTensor's graph_replace raises "is not a part of graph"
    for ``r``, an ancestor it reaches only through ``c``. The keys `outputs` do not reach without
    passing through another key are dropped first: they are replaced with it."""
    reached = set(
        ancestors(
            outputs if isinstance(outputs, list | tuple) else [outputs], blockers=list(replace)
        )
    )
    used = {key: value for key, value in replace.items() if key in reached}
    return graph_replace(outputs, used, strict=False)


def outer_inputs(outputs, exclude) -> list:
    """The model variables (and shared variables) `outputs` read, not looking inside a model
    variable: a Deterministic and the variable it is computed from both appear when `outputs`
    read both."""
    excluded = set(exclude)
    found, seen, stack = [], set(), list(outputs)[::-1]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in excluded or isinstance(v, Constant):
            continue
        if v.owner is None or isinstance(v.owner.op, ModelVar):
            found.append(v)  # data (shared variables) and other roots, or a model variable
        else:
            stack.extend(v.owner.inputs[::-1])
    return found


def graphs_at_mode(expressions, z: TensorVariable, z_star) -> list[TensorVariable]:
    """`expressions` (graphs of the latent `z`: its Hessian, a gradient) at the mode `z_star`,
    applied as one inline OpFromGraph of z and the model variables they read.

    PyMC rewrites a model's logp (canonicalize and stabilize, without a ShapeFeature) before it
    differentiates it, and the derivatives of some log densities hold 0 / x terms those rewrites
    never finish with: without a ShapeFeature PyTensor's `local_zero_div` rebuilds 0 / x as
    alloc(0, shape(0 / x)), which holds the division again (a cycle with `local_shape_ground`).
    ``pm.NegativeBinomial``'s Hessian made ``logp_dlogp_function`` (and ``pm.sample``) hang.
    PyMC 6 rewrites an OpFromGraph's inner graph too (`pregrad_inner_graphs`); on this closed
    graph of z and the model variables it finishes (the negative-binomial test in
    ``tests/model/test_laplace.py`` turns a hang into a failure), and compiling inlines it
    (fast_run) with a ShapeFeature.
    """
    others = outer_inputs(expressions, exclude=[z])
    inputs, outputs = [z, *others], list(expressions)
    pattern = io_connection_pattern(inputs, outputs)
    op = OpFromGraph(
        inputs,
        outputs,
        inline=True,
        on_unused_input="ignore",
        name="at_mode",
        connection_pattern=pattern,
        pullback=partial(_structural_pullback, pattern),
    )
    return op(z_star, *others, return_list=True)


def _structural_pullback(pattern, inputs, outputs, output_grads):
    """The inner graph's pullback, with a gradient for every input: zero where the input reaches
    the outputs only through paths without a derivative (a Gaussian likelihood's Hessian reads
    z's shape, not its values), undefined where the outputs' cotangents are.

    PyTensor checks a pullback against the Op's connection pattern, which is structural, and
    keeps the pattern of the graph as built when it rewrites the inner graph (`pattern`, given
    here too); its own pullback then calls such an input disconnected and the gradient of the
    whole model fails.
    """
    known = {
        out: g
        for out, g in zip(outputs, output_grads, strict=True)
        if not isinstance(g.type, DisconnectedType | NullType)
    }
    if known:
        grads = grad(
            None,
            wrt=list(inputs),
            known_grads=known,
            disconnected_inputs="ignore",
            return_disconnected="disconnected",
            null_gradients="return",
        )
    else:
        grads = [disconnected_type() for _ in inputs]
    out = []
    for x, g, row in zip(inputs, grads, pattern, strict=True):
        reached = [c for c, connected in zip(output_grads, row, strict=True) if connected]
        live = [c for c in reached if not isinstance(c.type, DisconnectedType)]
        if not reached:
            out.append(disconnected_type())
        elif live and all(isinstance(c.type, NullType) for c in live):
            out.append(live[0])
        elif isinstance(g.type, DisconnectedType):
            out.append(pt.zeros(x.shape, dtype=config.floatX))
        else:
            out.append(g)
    return out
