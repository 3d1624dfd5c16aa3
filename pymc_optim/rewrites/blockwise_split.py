"""A batched ``Split`` whose axis and sizes are not batched becomes one ``Split``.

The gradient of a ``concatenate`` is a ``Split``. Vectorizing it (``vectorize_graph``, or a
``Blockwise`` of a solver, whose implicit gradient pulls back through the user's
concatenations) gives ``Blockwise{Split}`` whenever the sizes carry batch dimensions, even
broadcastable ones (PyTensor's own batching rule takes only sizes with none). That costs a
Python loop over the batch in the C backend and does not run under JAX at all: inside the
``Blockwise`` the split sizes are traced values, and ``jnp.split`` needs them concrete. When the
sizes do not vary along the batch (their batch dimensions are broadcastable), the batched node
is ``Split`` along the axis (an Op property) shifted past the batch dimensions.

Registered in the ``specialize`` pass (``fast_run``, hence the C, numba and JAX modes); exclude
it with ``mode.excluding("pymc_optim_blockwise_split")``, or for the whole process with
``pmo.disable_rewrites()`` (it acts on any batched ``Split``, not only pymc_optim's graphs).
"""

from __future__ import annotations

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.basic import Split
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.rewriting.basic import register_specialize

from pymc_optim.rewrites.switch import enabled

__all__ = ["BLOCKWISE_SPLIT_REWRITE"]

#: The rewrite's name and tag in PyTensor's optdb.
BLOCKWISE_SPLIT_REWRITE = "pymc_optim_blockwise_split"


@node_rewriter([Blockwise])
def _unbatched_split(fgraph, node):
    if not enabled():
        return None
    core = node.op.core_op
    if not isinstance(core, Split):
        return None
    x, splits = node.inputs
    batch_ndim = node.op.batch_ndim(node)
    splits = _unbatched(splits, 1)
    if splits is None:
        return None  # the sizes may differ along the batch
    core_ndim = x.type.ndim - batch_ndim
    core_axis = core.axis
    if not -core_ndim <= core_axis < core_ndim:
        return None  # Split itself reports the bad axis
    shifted = core_axis + batch_ndim if core_axis >= 0 else core_axis
    outputs = Split(core.len_splits, shifted)(x, splits)
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
