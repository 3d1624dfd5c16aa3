"""Inline PyTensor's ``AllocDiag`` OpFromGraph without cloning the graph above it.

PyTensor's ``late_inline_OpFromGraph`` (specialize) inlines ``pt.diag(v)`` (an OpFromGraph, e.g.
in the gradient of ``pt.diagonal``) by ``clone_replace``, which clones the replacement inputs'
graphs too: every solver Op above ``v`` (a Laplace marginal's ``x*`` under ``diag(H)``'s
gradient) gets a fresh copy at each inlining. MergeOptimizer merges the copies back only when
nothing rewrote them differently in between, and the copies that survive each run the solve
again: the 1.7 s Finland marginal ran its inner Newton solve three times per logp+gradient.

This rewrite runs first (between stabilize and specialize) and builds the inner graph on the
node's own inputs, so the graph above them is shared, not copied.
"""

from __future__ import annotations

from pytensor.compile import optdb
from pytensor.compile.rewriting import inline_ofg_node
from pytensor.graph.rewriting.basic import dfs_rewriter, node_rewriter
from pytensor.tensor.basic import AllocDiag
from pytensor.tensor.blockwise import Blockwise

__all__ = ["INLINE_REWRITE", "inline_without_cloning_inputs"]

#: The rewrite's name in PyTensor's optdb (exclude it with ``mode.excluding(INLINE_REWRITE)``).
INLINE_REWRITE = "pymc_optim_inline_alloc_diag"


def inline_without_cloning_inputs(node):
    """The outputs of the OpFromGraph `node`, its inner graph rebuilt on ``node.inputs``."""
    return inline_ofg_node(node)


@node_rewriter([AllocDiag, Blockwise])
def _inline_alloc_diag(fgraph, node):
    if isinstance(node.op, Blockwise):
        # Cholesky's gradient writes Blockwise(AllocDiag), unwrapped only after specialize
        core = node.op.core_op
        unbatched = all(i.type.ndim == 1 for i in node.inputs)  # AllocDiag's core: a vector
        if not (isinstance(core, AllocDiag) and unbatched):
            return None
        node = core(*node.inputs).owner
    return inline_without_cloning_inputs(node)


# Position 1.9: after canonicalize and stabilize (whose AllocDiag rewrites want the OpFromGraph
# form) and before specialize (2), where PyTensor's cloning inliner would run. Again at 48.9
# (before merge2 and the inplace rewrites) for the AllocDiags that specialize creates: left in
# place they run as OpFromGraph in Python, ~5 ms each on a 100 × 100 matrix.
optdb.register(INLINE_REWRITE, dfs_rewriter(_inline_alloc_diag), "fast_run", position=1.9)
optdb.register(
    f"{INLINE_REWRITE}_late", dfs_rewriter(_inline_alloc_diag), "fast_run", position=48.9
)
