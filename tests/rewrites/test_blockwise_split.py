"""The gradient of a concatenation, batched, is one Split: in C, and under JAX, where a
Blockwise{Split} does not run. PyTensor vectorizes a Split whose sizes have no batch dimensions;
pymc_optim's rewrite takes those whose batch dimensions are broadcastable."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.graph import vectorize_graph
from pytensor.tensor.basic import Split
from pytensor.tensor.blockwise import Blockwise

import pymc_optim as pmo
from pymc_optim.rewrites.blockwise_split import BLOCKWISE_SPLIT_REWRITE


def _split_nodes(fn):
    nodes = fn.maker.fgraph.toposort()
    batched = [n for n in nodes if isinstance(n.op, Blockwise) and isinstance(n.op.core_op, Split)]
    return batched, [n for n in nodes if isinstance(n.op, Split)]


@pytest.mark.parametrize("axis", [0, -1])
def test_the_gradient_of_a_concatenation_vectorizes_to_one_split(axis):
    x, a = pt.vector("x"), pt.scalar("a")
    y = pt.concatenate([pt.cos(x[:2]) * a, pt.sin(x[2:]) * a**2], axis=axis)
    g = pt.grad((y * pt.arange(1, 5)).sum(), x)
    A = pt.vector("A")
    batched = vectorize_graph(g, {a: A})
    fn = pytensor.function([x, A], batched)
    assert _split_nodes(fn)[0] == [] and _split_nodes(fn)[1] != []
    x_val, A_val = np.array([0.1, 0.2, 0.3, 0.4]), np.array([1.0, 2.0, 3.0])
    for i, a_val in enumerate(A_val):
        w = np.arange(1, 5)
        by_hand = np.r_[-np.sin(x_val[:2]) * a_val * w[:2], np.cos(x_val[2:]) * a_val**2 * w[2:]]
        assert_allclose(fn(x_val, A_val)[i], by_hand, rtol=1e-14)


def test_sizes_that_vary_along_the_batch_are_left_alone():
    x, sizes = pt.matrix("x"), pt.lmatrix("sizes")
    parts = Blockwise(Split(2, axis=0), signature="(n),(k)->(m),(p)")(x, sizes)
    fn = pytensor.function([x, sizes], parts)
    assert _split_nodes(fn)[0] != []
    first, second = fn(np.arange(8.0).reshape(2, 4), np.array([[1, 3], [1, 3]]))
    assert_allclose(first, [[0.0], [4.0]])
    assert_allclose(second, [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])


@pytest.mark.parametrize("method", ["iteration", "newton"])
def test_a_batched_fixed_point_through_a_concatenation_runs_under_jax(method):
    """Its implicit gradient pulls back through the concatenation: a Blockwise{Split} once
    batched, whose traced sizes JAX's split refused."""
    pytest.importorskip("jax")
    x, a = pt.vector("x"), pt.scalar("a")
    T = pt.concatenate([0.5 * pt.cos(x[:2]) + a, 0.3 * pt.sin(x[2:])])
    x_star, _ = pmo.fixed_point(T, x, x0=np.zeros(4), method=method)
    A = pt.vector("A")
    outputs = vectorize_graph([x_star, pt.grad(x_star.sum(), a)], {a: A})
    a_val = np.array([0.1, 0.2])
    # the sizes reach the Split broadcast to the batch, (1, 2): PyTensor's rule leaves it batched
    unrewritten = pytensor.function(
        [A], outputs, mode=pytensor.compile.get_default_mode().excluding(BLOCKWISE_SPLIT_REWRITE)
    )
    assert _split_nodes(unrewritten)[0] != []
    got = pytensor.function([A], outputs, mode="JAX")(a_val)
    expected = pytensor.function([A], outputs)(a_val)
    for g, e in zip(got, expected, strict=True):
        assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)
    # dx₁/da = 1 / (1 + 0.5 sin x₁) at the fixed point, twice (x₁ = x₂); x₃ = x₄ = 0
    x1 = expected[0][:, 0]
    assert_allclose(expected[1], 2.0 / (1.0 + 0.5 * np.sin(x1)), rtol=1e-8)
