"""pymc_optim.rewrites.stack_trace: PyTensor's useless-switch rewrite without the tripling of a
shared branch's stack trace."""

import pytensor.tensor as pt
from pytensor.graph.fg import FunctionGraph
from pytensor.tensor.rewriting.basic import local_useless_switch

import pymc_optim  # noqa: F401  (installs the wrapper)


def test_a_constant_shared_by_many_useless_switches_keeps_a_linear_trace():
    """Twelve switch(c_i, one, one) on the same constant: each firing returns `one`, whose trace
    PyTensor appended to itself twice (3^12 = 531,441 entries); wrapped, it keeps its own
    entries plus the switches' outputs' (none here: built without traces)."""
    one = pt.constant(1.0)
    one.tag.trace = [[("file.py", 1, "f", "one = 1")]]
    x = pt.scalar("x")
    switches = [pt.switch(pt.lt(x, float(i)), one, one) for i in range(12)]
    for s in switches:
        s.tag.trace = []
    fgraph = FunctionGraph([x], switches, clone=False)
    for s in switches:
        assert local_useless_switch.transform(fgraph, s.owner) == [one]
    assert one.tag.trace == [[("file.py", 1, "f", "one = 1")]]


def test_the_switch_outputs_trace_is_still_copied_to_the_branch():
    a = pt.scalar("a")
    a.tag.trace = [[("a.py", 1, "f", "a")]]
    out = pt.switch(pt.lt(a, 0.0), a, a)
    out.tag.trace = [[("out.py", 2, "g", "out")]]
    fgraph = FunctionGraph([a], [out], clone=False)
    assert local_useless_switch.transform(fgraph, out.owner) == [a]
    assert a.tag.trace == [[("a.py", 1, "f", "a")], [("out.py", 2, "g", "out")]]
