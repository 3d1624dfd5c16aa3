"""A batched ``Split`` whose axis and sizes are not batched becomes one ``Split``.

The gradient of a ``concatenate`` is a ``Split``. Vectorizing it (``vectorize_graph``, or a
``Blockwise`` of a solver, whose implicit gradient pulls back through the user's
concatenations) gives ``Blockwise{Split}``, since PyTensor has no batching rule for ``Split``.
That costs a Python loop over the batch in the C backend and does not run under JAX at all:
inside the ``Blockwise`` the split sizes are traced values, and ``jnp.split`` needs them
concrete. When the axis is a constant and neither it nor the sizes vary along the batch (their
batch dimensions are broadcastable), the batched node is ``Split`` along the axis shifted past
the batch dimensions.

Registered in the ``specialize`` pass (``fast_run``, hence the C, numba and JAX modes); exclude
it with ``mode.excluding("pymc_optim_blockwise_split")``.
"""

from __future__ import annotations

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.basic import Split, get_scalar_constant_value
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.rewriting.basic import register_specialize

__all__ = ["BLOCKWISE_SPLIT_REWRITE"]

#: The rewrite's name and tag in PyTensor's optdb.
BLOCKWISE_SPLIT_REWRITE = "pymc_optim_blockwise_split"


@node_rewriter([Blockwise])
def _unbatched_split(fgraph, node):
    core = node.op.core_op
    if not isinstance(core, Split):
        return None
    x, axis, splits = node.inputs
    batch_ndim = node.op.batch_ndim(node)
    axis, splits = _unbatched(axis, 0), _unbatched(splits, 1)
    if axis is None or splits is None:
        return None  # the axis or the sizes may differ along the batch
    try:
        core_axis = int(get_scalar_constant_value(axis))
    except NotScalarConstantError:
        return None
    core_ndim = x.type.ndim - batch_ndim
    if not -core_ndim <= core_axis < core_ndim:
        return None  # Split itself reports the bad axis
    shifted = core_axis + batch_ndim if core_axis >= 0 else core_axis
    outputs = Split(core.len_splits)(x, shifted, splits)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    for old, new in zip(node.outputs, outputs, strict=True):
        if old.type.broadcastable != new.type.broadcastable:
            return None
        new.name = old.name
    return outputs


def _unbatched(var, core_ndim: int):
    """`var` without its batch dimensions when they are all broadcastable (length 1), else
    None."""
    batch = var.type.ndim - core_ndim
    if batch < 0 or not all(var.type.broadcastable[:batch]):
        return None
    return var[(0,) * batch] if batch else var


register_specialize(_unbatched_split, name=BLOCKWISE_SPLIT_REWRITE)
