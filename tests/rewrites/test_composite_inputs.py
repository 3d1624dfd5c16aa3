"""A fused elementwise node that reads one variable at several inputs reads it once."""

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from numpy.testing import assert_allclose
from pytensor.compile import get_default_mode
from pytensor.tensor.elemwise import Elemwise

from pymc_optim.rewrites.composite_inputs import COMPOSITE_INPUTS_REWRITE


def composite_node(fn):
    (node,) = [
        n
        for n in fn.maker.fgraph.toposort()
        if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, ps.Composite)
    ]
    return node


def test_repeated_inputs_of_a_composite_become_one_and_keep_computing_in_place():
    a, b, c = (ps.float64(name) for name in "abc")
    composite = ps.Composite([a, b, c], [ps.exp(a) * b + ps.log(c) * a, a - b * c])
    x, y = pt.vector("x"), pt.vector("y")
    s, t = pt.cumsum(x), pt.cumsum(y)  # intermediates (not fused): one can be overwritten
    outputs = Elemwise(composite)(s, s, t)
    fn = pytensor.function([x, y], outputs)
    reference = pytensor.function(
        [x, y], outputs, mode=get_default_mode().excluding(COMPOSITE_INPUTS_REWRITE)
    )
    node = composite_node(fn)
    assert len(node.inputs) == len(set(node.inputs))
    assert len(composite_node(reference).inputs) > len(set(composite_node(reference).inputs))
    x_val, y_val = np.array([0.5, 1.0, 2.0]), np.array([1.0, 0.3, 4.0])
    assert_allclose(fn(x_val, y_val), reference(x_val, y_val), rtol=1e-15)
    u, v = np.cumsum(x_val), np.cumsum(y_val)
    assert_allclose(fn(x_val, y_val), [np.exp(u) * u + np.log(v) * u, u - u * v], rtol=1e-14)
    # computed in place of t, which moved from the third input to the second
    assert dict(composite_node(reference).op.inplace_pattern) == {0: 2}
    assert dict(node.op.inplace_pattern) == {0: 1}
