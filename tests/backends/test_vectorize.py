"""Batched graph-native solves run as one stacked problem (no Blockwise loop), like solo ones."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.graph import vectorize_graph
from pytensor.tensor.blockwise import Blockwise

import pymc_optim as pmo
from pymc_optim.graph.solver_op import SolverOp

A_BATCH = np.array([[1.0, 2.0, 1.2], [0.5, 1.0, 1.5], [2.0, 0.1, 0.7]])


def looped_solvers(fn):
    """Solver Ops wrapped in a Blockwise, which loops over the batch in Python."""
    return [
        node.op
        for node in fn.maker.fgraph.toposort()
        if isinstance(node.op, Blockwise) and isinstance(node.op.core_op, SolverOp)
    ]


def build(kind, structure):
    x, a, b = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,)), pt.scalar("b")
    if kind == "minimize":
        x_star, ok = pmo.minimize(
            (pt.exp(x) - a * x + 0.5 * b * x**2).sum() + 0.1 * (x[0] * x[1]) ** 2,
            x,
            x0=np.zeros(3),
            method="newton",
            structure=structure,
        )
    elif kind == "root":
        x_star, ok = pmo.root(
            x**3 + b * x - a, x, x0=np.ones(3), method="newton", structure=structure
        )
    else:
        x_star, ok = pmo.fixed_point(
            0.5 * b * pt.cos(a * x), x, x0=np.zeros(3), method=kind, structure=structure
        )
    return x_star, ok, a, b


CASES = [
    ("minimize", "dense"),
    ("root", "dense"),
    ("root", "diagonal"),
    ("iteration", "dense"),
    ("newton", "diagonal"),
]


@pytest.mark.parametrize("kind, structure", CASES)
def test_batched_values_and_gradients_match_solo_solves(kind, structure):
    x_star, ok, a, b = build(kind, structure)
    loss = (x_star**2).sum()
    outputs = [x_star, ok, *pt.grad(loss, [a, b])]
    a_batch = pt.matrix("a_batch", shape=(None, 3))
    batched = pytensor.function([a_batch, b], vectorize_graph(outputs, {a: a_batch}))
    assert not looped_solvers(batched)
    assert any(isinstance(node.op, SolverOp) for node in batched.maker.fgraph.toposort())
    solo = pytensor.function([a, b], outputs)
    got = batched(A_BATCH, 0.9)
    assert got[1].shape == (3,) and got[1].all()
    for i, a_val in enumerate(A_BATCH):
        want = solo(a_val, 0.9)
        if kind in ("iteration", "anderson"):
            # fixed-point iterations share one stopping test across the batch: x* agrees to
            # ~1e-8/(1 − contraction)
            assert_allclose(got[0][i], want[0], atol=1e-7)
            assert_allclose(got[2][i], want[2], rtol=1e-6, atol=1e-8)
            assert_allclose(got[3][i], want[3], rtol=1e-6, atol=1e-8)
        else:  # Newton decides per problem: the iterates of the solo solve, to rounding
            assert_allclose(got[0][i], want[0], rtol=1e-12, atol=1e-14)
            assert_allclose(got[2][i], want[2], rtol=1e-12, atol=1e-14)
            assert_allclose(got[3][i], want[3], rtol=1e-12, atol=1e-14)


def test_batched_solve_under_jax():
    pytest.importorskip("jax")
    x_star, _, a, b = build("minimize", "dense")
    a_batch = pt.matrix("a_batch", shape=(3, 3))
    outputs = vectorize_graph([x_star, pt.grad((x_star**2).sum(), b)], {a: a_batch})
    want = pytensor.function([a_batch, b], outputs)(A_BATCH, 0.9)
    got = pytensor.function([a_batch, b], outputs, mode="JAX")(A_BATCH, 0.9)
    for g, w in zip(got, want, strict=True):
        assert_allclose(np.asarray(g), w, rtol=1e-9)


def test_dense_batching_without_a_static_size_falls_back_to_a_loop():
    x, a = pt.vector("x"), pt.vector("a")
    # dense by choice: "auto" would find this objective's Hessian diagonal, which stacks natively
    x_star, _ = pmo.minimize(
        ((x - a) ** 2).sum(), x, x0=np.zeros(2), method="newton", structure="dense"
    )
    a_batch = pt.matrix("a_batch")
    fn = pytensor.function([a_batch], vectorize_graph(x_star, {a: a_batch}))
    assert looped_solvers(fn)
    assert_allclose(fn(A_BATCH[:, :2]), A_BATCH[:, :2], atol=1e-8)


@pytest.mark.parametrize("mode", ["FAST_RUN", "NUMBA", "JAX"])
def test_a_failing_problem_leaves_the_others_as_solved_alone(mode):
    """Per-problem step lengths, stopping and success: each problem of a batch follows its own
    solve's iterates, whatever the others do (here: one needs the line search, one takes full
    steps, one is NaN and fails)."""
    if mode == "JAX":
        pytest.importorskip("jax")
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    u = x - a
    # log cosh: the full Newton step overshoots for |u| ≳ 1.1 and must be shortened
    objective = pt.log(pt.cosh(u)).sum() + 0.01 * (u[0] - u[1]) ** 2
    x_star, ok = pmo.minimize(objective, x, x0=np.zeros(3), method="newton")
    info = pmo.solution_info(x_star)
    outputs = [x_star, ok, info.n_iterations, info.n_evaluations]
    a_batch = pt.matrix("a_batch", shape=(3, 3))
    batched = pytensor.function([a_batch], vectorize_graph(outputs, {a: a_batch}), mode=mode)
    assert not looped_solvers(batched)
    solo = pytensor.function([a], outputs, mode=mode)
    values = np.array([[3.0, -2.5, 1.5], [0.3, 0.2, -0.1], [1.0, np.nan, 0.5]])
    got = [np.asarray(g) for g in batched(values)]
    assert got[1].tolist() == [True, True, False]
    assert got[2].shape == got[3].shape == (3,)
    assert got[3][0] > got[2][0] + 1 and got[3][1] == got[2][1] + 1  # backtracked / did not
    for i, row in enumerate(values):
        want = [np.asarray(w) for w in solo(row)]
        if want[1]:
            assert_allclose(got[0][i], want[0], rtol=1e-12, atol=1e-14)
        assert [g[i].item() for g in got[1:]] == [w.item() for w in want[1:]], i
