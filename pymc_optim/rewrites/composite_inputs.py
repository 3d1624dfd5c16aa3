"""A fused elementwise node reads each of its inputs once.

PyTensor's elemwise fusion can leave one variable as several inputs of the same
``Elemwise{Composite}``: the fused Laplace marginal of a negative-binomial model had a node of
127 inputs of which 19 were distinct, and 123 outputs. The C virtual machine's garbage
collection (``allow_gc``, PyTensor's default, hence ``pm.sample``'s) then checks, after each
node, every dependent of every input position: a variable's dependents are listed once per
input position it fills, times the node's outputs, so that node alone made ~10⁴ dependents of
one variable and the marginal's logp+gradient ~1.5·10⁶ checks per call, 3 of its 5.6 ms
(``benchmarks/README.md``). Here the repeated inputs are merged into one inner input; the
arithmetic is the same.

Registered in PyTensor's ``optdb`` (``fast_run``) after its last merge pass, which is where the
repeated inputs appear (equal subgraphs feeding a fused node merged into one); exclude it with
``mode.excluding("pymc_optim_composite_unique_inputs")``, or for the whole process with
``pmo.disable_rewrites()`` (it acts on any fused node, not only pymc_optim's graphs).
"""

from __future__ import annotations

from pytensor.compile import optdb
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.basic import copy_stack_trace, dfs_rewriter, node_rewriter
from pytensor.scalar import Composite
from pytensor.tensor.elemwise import Elemwise

from pymc_optim.rewrites.switch import enabled

__all__ = ["COMPOSITE_INPUTS_REWRITE"]

#: The rewrite's name in PyTensor's optdb.
COMPOSITE_INPUTS_REWRITE = "pymc_optim_composite_unique_inputs"


@node_rewriter([Elemwise])
def _unique_composite_inputs(fgraph, node):
    if not enabled():
        return None
    composite = node.op.scalar_op
    if not isinstance(composite, Composite):
        return None
    position: dict = {}  # outer input -> its index among the distinct ones
    outer, inner, replace = [], [], {}
    inner_graph = composite.fgraph.unfreeze()  # a frozen inner graph's variables are shared
    for outer_input, inner_input in zip(node.inputs, inner_graph.inputs, strict=True):
        kept = position.get(outer_input)
        if kept is None:
            position[outer_input] = len(outer)
            outer.append(outer_input)
            inner.append(inner_input)
        else:
            replace[inner_input] = inner[kept]
    if not replace:
        return None
    # an output computed in place of an input stays in place of that input's first position
    # (an input read twice is already one buffer; two outputs on it: the first keeps it)
    inplace = {}
    for out, i in node.op.inplace_pattern.items():
        j = position[node.inputs[i]]
        if j not in inplace.values():
            inplace[out] = j
    outputs = clone_replace(inner_graph.outputs, replace=replace)
    op = Elemwise(Composite(inner, outputs), inplace_pattern=inplace)
    new_outputs = op.make_node(*outer).outputs
    if any(old.type != new.type for old, new in zip(node.outputs, new_outputs, strict=True)):
        return None
    copy_stack_trace(node.outputs, new_outputs)
    return new_outputs


# after the last merge, which makes the repeated inputs (equal subgraphs merged into one)
optdb.register(
    COMPOSITE_INPUTS_REWRITE,
    dfs_rewriter(_unique_composite_inputs, ignore_newtrees=True),
    "fast_run",
    position=100.5,
)
