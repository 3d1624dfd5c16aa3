"""PyTensor's ``local_useless_switch`` without its exponential growth of a constant's stack trace.

``switch(c, a, a) → a`` (``local_useless_switch``, canonicalize and specialize) copies the
traces of the node's outputs *and inputs* onto ``a`` with ``copy_stack_trace``: ``a`` is among
the inputs twice, so its trace list is appended to itself twice — it triples at each firing.
When ``a`` is a constant merged across the graph (the ``1`` of every ``switch(lt(1, 0), 1, 1)``
that ``local_subtensor_merge`` leaves behind when it merges ``shape(v)[1:][0]``), m firings give
it 3^m entries. The kriged gradient of a sum-to-zero RW2 (N = 20) has 36 such merges: the
trace reached 1.3·10⁸ entries (3.5 GB) before PyTensor raised MemoryError inside the rewrite
(without a memory limit the OS killed the process); RW1's 14 merges stopped at 5·10⁵.

The wrapper keeps the rewrite and its result, and gives ``a`` its own trace once plus the
switch's outputs' traces (what the rewrite means to record), so the trace stays linear in the
number of rewrites. Installed on import on PyTensor's rewriter object itself (the same object
in every rewrite database that holds it), through :mod:`pymc_optim.rewrites.switch`:
``pmo.disable_rewrites()`` gives the rewriter its own function back.
"""

from __future__ import annotations

import functools

from pytensor.tensor.rewriting import basic as _tensor_rewriting

from pymc_optim.rewrites.switch import install

__all__ = ["without_self_trace_copies"]


def without_self_trace_copies(fn):
    """`fn` (a node rewriter's function) with the traces of returned inputs not self-appended."""
    if getattr(fn, "_pymc_optim_trace_safe", False):
        return fn

    @functools.wraps(fn)
    def rewrite(fgraph, node):
        before = {id(var): list(getattr(var.tag, "trace", [])) for var in node.inputs}
        replacements = fn(fgraph, node)
        for var in replacements or ():
            if id(var) in before:  # an input returned as it is: its trace plus the outputs'
                added = [t for out in node.outputs for t in getattr(out.tag, "trace", [])]
                var.tag.trace = before[id(var)] + added
        return replacements

    rewrite._pymc_optim_trace_safe = True
    return rewrite


def _install() -> None:
    rewriter = _tensor_rewriting.local_useless_switch
    pytensors = rewriter.fn
    if getattr(pytensors, "_pymc_optim_trace_safe", False):
        return  # already wrapped (the module was reloaded)
    wrapped = without_self_trace_copies(pytensors)

    def put() -> None:
        rewriter.fn = wrapped

    def take() -> None:
        rewriter.fn = pytensors

    install(put, take)


_install()
