"""Native batching of the graph-native solvers: B independent problems become one problem.

`vectorize_graph` (and PyMC, when it adds batch dimensions) would otherwise wrap a solver Op in a
``Blockwise``, which loops over the batch in Python. Independent problems stacked together have
a block-diagonal A (each problem's block) — so the batch is solved as *one* Newton or fixed-point
iteration on the stacked unknowns, with the per-problem structure kept inside each block:
dense blocks of size n become ``block_diagonal(n)``, diagonal stays diagonal, and a sparse A on
a pattern becomes one block per problem on that pattern (`StackedSparseStructure`: one symbolic
analysis, one numeric factorization per problem). The implicit rule
then differentiates the stacked problem with the same structured solve.

The stacked Newton solve takes its decisions per problem (step length, stopping tests,
positive-definiteness), so each problem follows the iterates of its own unbatched solve and
`success`, `n_iterations` and `n_evaluations` are per problem: a failing problem leaves the
others untouched. The stacked fixed-point iterations still share one stopping test, and report
for the whole batch (broadcast to its shape).
Where the stacked structure cannot be stated (a dense A over several control variables, or of
unknown static size) the batch falls back to PyTensor's Blockwise loop.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.replace import _vectorize_node, vectorize_graph
from pytensor.tensor.blockwise import vectorize_node_fallback
from pytensor.tensor.extra_ops import broadcast_shape

from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.structure import LinearStructure

__all__: list[str] = []


@_vectorize_node.register(NewtonOp)
@_vectorize_node.register(FixedPointOp)
def _vectorize_graph_native(op: SolverOp, node, *batched_inputs):
    core_ndims = [inp.type.ndim for inp in node.inputs]
    batch_ndims = [new.type.ndim - nd for new, nd in zip(batched_inputs, core_ndims, strict=True)]
    batch_ndim = max(batch_ndims)
    if batch_ndim == 0:
        return op.make_node(*batched_inputs)
    if op.n_extras or any(batch_ndims[op.n_controls + op.n_params :]):
        return vectorize_node_fallback(op, node, *batched_inputs)

    structure = _stacked_structure(op)
    if structure is None:
        return vectorize_node_fallback(op, node, *batched_inputs)
    batch_shape = _batch_shape(batched_inputs, batch_ndims, batch_ndim)
    x0s = [
        pt.broadcast_to(x0, (*batch_shape, *tuple(x0.shape)[bn:]))
        for x0, bn in zip(batched_inputs[: op.n_controls], batch_ndims, strict=False)
    ]
    outer_params = list(batched_inputs[op.n_controls : op.n_controls + op.n_params])

    # Inner stand-ins: batched controls, and parameters left-padded to the batch's rank.
    inner_xs = [
        pt.tensor(dtype=x.type.dtype, shape=(None,) * batch_ndim + x.type.shape, name=x.name)
        for x in op.problem.inner_xs
    ]
    new_params, padded = [], []
    for inner, outer, bn in zip(
        op.problem.inner_params, outer_params, batch_ndims[op.n_controls :], strict=False
    ):
        new = outer.type(name=inner.name) if bn else inner
        new_params.append(new)
        padded.append(pt.shape_padleft(new, batch_ndim - bn) if bn else new)
    replace = dict(
        zip([*op.problem.inner_xs, *op.problem.inner_params], [*inner_xs, *padded], strict=True)
    )

    def batched(variables):
        return [vectorize_graph(v, replace) for v in variables]

    problem = InnerProblem(inner_xs, new_params, batched(op.problem.inner_outputs), outer_params)
    condition = OptimalityCondition(
        inner_xs,
        new_params,
        batched(op.condition.residual),
        op.condition.symmetric,
        structure,
    )
    (value,) = batched([op.value])
    if isinstance(op, NewtonOp):
        (merit,) = batched([op.merit])
        new_op = NewtonOp(
            problem,
            condition=condition,
            merit=merit,
            value=value,
            minimization=op.minimization,
            tol=op.tol,
            max_iter=op.max_iter,
            # an already batched solve keeps its batch dimensions, after the new ones
            batch_ndim=batch_ndim + op.batch_ndim,
        )
    else:
        new_op = FixedPointOp(
            problem, condition=condition, method=op.method, tol=op.tol, max_iter=op.max_iter
        )
    outputs = new_op(*x0s, *outer_params)
    x_stars, diagnostics = outputs[: op.n_controls], outputs[op.n_controls :]
    if isinstance(new_op, NewtonOp):  # per problem, batch-shaped already
        return [*x_stars, *diagnostics]
    return [*x_stars, *(pt.broadcast_to(d, batch_shape) for d in diagnostics)]


def _stacked_structure(op: SolverOp) -> LinearStructure | None:
    """The per-problem structure, repeated block by block along the stacked unknowns.

    None where the stacked problem has no such structure we can state: a dense A needs the
    static size of a single control (the block size); then the batch falls back to a loop.
    """
    structure = op.condition.structure
    if hasattr(structure, "stacked"):  # sparse: one block per problem on the one pattern
        return structure.stacked()
    # A built from parts (a latent Gaussian) has no stacked form stated: like a dense A, the
    # stack is block-diagonal, its blocks differentiated from F (the parts are not carried).
    if structure.kind != "dense" and not op.condition.parts:
        return structure
    shapes = [x.type.shape for x in op.problem.inner_xs]
    # Stacked controls are contiguous per problem only when there is one control variable.
    if len(shapes) != 1 or None in shapes[0]:
        return None
    return LinearStructure("block_diagonal", int(np.prod(shapes[0], dtype=int)))


def _batch_shape(batched_inputs, batch_ndims, batch_ndim):
    """The broadcast batch shape of all inputs (symbolic), each left-padded to `batch_ndim`."""
    shapes = [
        (1,) * (batch_ndim - bn) + tuple(inp.shape)[:bn]
        for inp, bn in zip(batched_inputs, batch_ndims, strict=True)
        if bn
    ]
    return tuple(broadcast_shape(*shapes, arrays_are_shapes=True))
