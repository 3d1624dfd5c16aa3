"""The scalar-specialization rewrite and constant folding in the solver Ops' inner graphs.

Each rewritten case is compiled twice, with the rewrite and without it (the mode excluding
``pymc_optim_scalar``), and checked on the compiled graph's Ops *and* on its numbers: x*, the
implicit gradients, against the unspecialized Op, against an independent reference (a bracketed
scipy root of the optimality condition) and against the analytic derivative dx*/dθ = −F_θ/F_x.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.compile import get_default_mode
from pytensor.graph.basic import Constant
from pytensor.graph.replace import vectorize_graph
from pytensor.graph.traversal import applys_between
from pytensor.tensor.blockwise import Blockwise
from scipy import optimize

import pymc_optim as pmo
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy.ops import MinimizeOp, MinimizeScalarOp, RootOp, RootScalarOp
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.rewrites.scalar import SCALAR_REWRITE

UNSPECIALIZED = get_default_mode().excluding(SCALAR_REWRITE)
A, B = 2.5, 0.7
#: BFGS at gtol 1e-11 and hybr at its default xtol 1.5e-8 (relative) meet Newton at |F| ≤ 1e-8
#: to well within this; the references are solved to rounding error.
X_RTOL = 1e-7


def solver_ops(fn) -> list:
    """The Ops of a compiled function's graph, Blockwise unwrapped to their core Op."""
    ops = [node.op for node in fn.maker.fgraph.toposort()]
    return [op.core_op if isinstance(op, Blockwise) else op for op in ops]


# --- the problems: F(x; a, b) = 0 with F_x > 0, solved by minimize (F = f') and by root -------
def objective(x, a, b):
    return pt.exp(x) - a * x + 0.5 * b * x**2  # f' = eˣ − a + b x, f'' = eˣ + b > 0


def equation(x, a, b):
    return x**3 + b * x - a  # F_x = 3x² + b > 0


def reference(kind: str, a: float, b: float) -> tuple[float, float, float]:
    """x* by a bracketed root of F to rounding error, and (dx*/da, dx*/db) = −(F_a, F_b)/F_x."""
    if kind == "minimize":
        F, F_x, F_b = (lambda z: np.exp(z) - a + b * z), (lambda z: np.exp(z) + b), (lambda z: z)
    else:
        F, F_x, F_b = (lambda z: z**3 + b * z - a), (lambda z: 3 * z**2 + b), (lambda z: z)
    x = optimize.brentq(F, -10.0, 10.0, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    return x, 1.0 / F_x(x), -F_b(x) / F_x(x)


CASES = {
    # (kind, shape of x, method, optimizer_kwargs)
    "minimize-0d-BFGS": ("minimize", (), "BFGS", {"tol": 1e-11}),
    "minimize-(1,)-CG": ("minimize", (1,), "CG", {"options": {"gtol": 1e-11, "maxiter": 500}}),
    "minimize-(1,1)-L-BFGS-B": ("minimize", (1, 1), "L-BFGS-B", {"tol": 1e-11}),
    "root-0d-hybr": ("root", (), "hybr", {}),
    "root-(1,)-lm": ("root", (1,), "lm", {}),
}


def build(kind, shape, method, optimizer_kwargs, x0=0.3):
    x = pt.tensor("x", shape=shape, dtype="float64")
    a, b = pt.scalar("a"), pt.scalar("b")
    if kind == "minimize":
        f = objective(x, a, b).sum()
        x_star, success = pmo.minimize(
            f, x, x0=np.full(shape, x0), method=method, optimizer_kwargs=optimizer_kwargs
        )
    else:
        x_star, success = pmo.root(
            equation(x, a, b), x, x0=np.full(shape, x0), method=method,
            optimizer_kwargs=optimizer_kwargs,
        )  # fmt: skip
    return x_star, success, a, b


@pytest.mark.parametrize("case", CASES)
def test_one_unknown_is_solved_by_scalar_newton_with_equal_values_and_gradients(case):
    kind, shape, method, optimizer_kwargs = CASES[case]
    x_star, success, a, b = build(kind, shape, method, optimizer_kwargs)
    info = pmo.solution_info(x_star)
    outputs = [x_star.sum(), *pt.grad(x_star.sum(), [a, b]), success, info.n_iterations]
    specialized = pytensor.function([a, b], outputs)
    unspecialized = pytensor.function([a, b], outputs, mode=UNSPECIALIZED)

    ops = solver_ops(specialized)
    newton = [op for op in ops if isinstance(op, NewtonOp)]
    assert len(newton) == 1 and not any(isinstance(op, MinimizeOp | RootOp) for op in ops)
    assert newton[0].condition.structure.kind == "diagonal"
    assert newton[0].minimization == (kind == "minimize")
    original = MinimizeOp if kind == "minimize" else RootOp
    assert any(type(op) is original for op in solver_ops(unspecialized))

    x_ref, dx_da, dx_db = reference(kind, A, B)
    x_new, ga_new, gb_new, ok_new, _ = specialized(A, B)
    x_old, ga_old, gb_old, ok_old, _ = unspecialized(A, B)
    assert ok_new and ok_old
    assert_allclose(x_new, x_ref, rtol=X_RTOL)
    assert_allclose(x_new, x_old, rtol=X_RTOL)
    # the gradient graph is the same function of x*: agreement follows x*'s
    assert_allclose([ga_new, gb_new], [dx_da, dx_db], rtol=1e-6)
    assert_allclose([ga_new, gb_new], [ga_old, gb_old], rtol=1e-6)
    # an independent route: central differences of the specialized solve
    step = 1e-5
    fd_a = (specialized(A + step, B)[0] - specialized(A - step, B)[0]) / (2 * step)
    assert_allclose(ga_new, fd_a, rtol=1e-6)


def test_options_carry_over_to_newton():
    x_star, _, a, b = build(
        "minimize", (), "BFGS", {"tol": 1e-6, "options": {"gtol": 1e-9, "maxiter": 7}}
    )
    (newton,) = [
        op for op in solver_ops(pytensor.function([a, b], x_star)) if isinstance(op, SolverOp)
    ]
    assert isinstance(newton, NewtonOp)
    assert (newton.tol, newton.max_iter) == (1e-9, 7)


def test_recompiling_reuses_the_specialized_op_and_its_compiled_functions():
    x_star, _, a, b = build("root", (), "hybr", {})
    first = pytensor.function([a, b], x_star)
    second = pytensor.function([a, b], x_star)
    (op1,), (op2,) = solver_ops(first), solver_ops(second)
    assert op1 is op2 and isinstance(op1, NewtonOp)


NOT_REWRITTEN = {
    "two-unknowns": lambda x, a, b: pmo.minimize(objective(x, a, b).sum(), x, x0=[0.0, 0.0]),
    "Powell": lambda x, a, b: pmo.minimize(objective(x, a, b).sum(), x, x0=[0.0], method="Powell"),
    "jac=False": lambda x, a, b: pmo.minimize(objective(x, a, b).sum(), x, x0=[0.0], jac=False),
    "callback": lambda x, a, b: pmo.minimize(
        objective(x, a, b).sum(), x, x0=[0.0], optimizer_kwargs={"callback": lambda r: None}
    ),
    "scipy-specific-option": lambda x, a, b: pmo.minimize(
        objective(x, a, b).sum(), x, x0=[0.0], optimizer_kwargs={"options": {"norm": 2.0}}
    ),
    "root-with-tol": lambda x, a, b: pmo.root(
        equation(x, a, b), x, x0=[0.3], optimizer_kwargs={"tol": 1e-12}
    ),
    "root-broyden1": lambda x, a, b: pmo.root(equation(x, a, b), x, x0=[0.3], method="broyden1"),
}


@pytest.mark.parametrize("case", NOT_REWRITTEN)
def test_rewrite_does_not_fire_when_the_problem_or_the_options_do_not_carry_over(case):
    size = 2 if case == "two-unknowns" else 1
    x = pt.vector("x", shape=(size,))
    a, b = pt.scalar("a"), pt.scalar("b")
    x_star, _ = NOT_REWRITTEN[case](x, a, b)
    ops = solver_ops(pytensor.function([a, b], x_star))
    assert not any(isinstance(op, NewtonOp) for op in ops)
    assert any(isinstance(op, MinimizeOp | RootOp) for op in ops)


def test_rewrite_needs_a_static_size_of_one():
    x = pt.vector("x")  # shape (None,): one element at runtime, but not provably so
    a, b = pt.scalar("a"), pt.scalar("b")
    x_star, _ = pmo.minimize(objective(x, a, b).sum(), x)
    fn = pytensor.function([x, a, b], x_star)
    assert any(type(op) is MinimizeOp for op in solver_ops(fn))


@pytest.mark.parametrize("routine", ["minimize_scalar", "root_scalar"])
def test_scalar_ops_are_never_rewritten_to_vector_ones(routine):
    x, a, b = pt.scalar("x"), pt.scalar("a"), pt.scalar("b")
    if routine == "minimize_scalar":
        x_star, _ = pmo.minimize_scalar(objective(x, a, b), x, bracket=(-1.0, 2.0))
        expected = MinimizeScalarOp
    else:
        x_star, _ = pmo.root_scalar(equation(x, a, b), x, method="brentq", bracket=(-5.0, 5.0))
        expected = RootScalarOp
    ops = solver_ops(pytensor.function([a, b], x_star))
    assert [type(op) for op in ops if isinstance(op, SolverOp)] == [expected]


def test_vectorized_solves_keep_their_batch_loop_and_per_problem_success():
    x_star, success, a, b = build("minimize", (), "BFGS", {"tol": 1e-11})
    a_batch = pt.vector("a_batch")
    xs, oks = vectorize_graph([x_star, success], {a: a_batch})
    grad = pt.grad(xs.sum(), a_batch)
    fn = pytensor.function([a_batch, b], [xs, oks, grad])
    nodes = [n.op for n in fn.maker.fgraph.toposort()]
    blockwise = [
        op for op in nodes if isinstance(op, Blockwise) and isinstance(op.core_op, SolverOp)
    ]
    assert len(blockwise) == 1 and isinstance(blockwise[0].core_op, NewtonOp)
    assert not any(isinstance(op, MinimizeOp) for op in solver_ops(fn))

    values = np.array([1.5, 2.5, np.nan, 4.0])  # one problem that cannot be solved
    x_new, ok_new, g_new = fn(values, B)
    x_old, ok_old, g_old = pytensor.function([a_batch, b], [xs, oks, grad], mode=UNSPECIALIZED)(
        values, B
    )
    # per-problem success; (BFGS at gtol 1e-11 may stop on precision loss, Newton does not)
    assert ok_new.tolist() == [True, True, False, True]
    assert not ok_old[2]
    finite = np.isfinite(values)
    refs = np.array([reference("minimize", v, B)[:2] for v in values[finite]])
    assert_allclose(x_new[finite], refs[:, 0], rtol=X_RTOL)
    assert_allclose(x_new[ok_old], x_old[ok_old], rtol=X_RTOL)
    assert_allclose(g_new[finite], refs[:, 1], rtol=1e-6)


def test_rewrite_fires_inside_pymc_logp_and_gradient_graphs():
    with pm.Model() as model:
        a = pm.Normal("a", 2.0, 1.0)
        b = pm.LogNormal("b", 0.0, 0.5)
        x = pt.scalar("x")
        x_star, _ = pmo.minimize(objective(x, a, b), x, x0=0.0, optimizer_kwargs={"tol": 1e-11})
        pm.Potential("mode", -0.5 * (x_star - 0.4) ** 2)
    point = model.initial_point()
    point = {name: value + 0.1 for name, value in point.items()}
    for compile_ in (model.compile_logp, model.compile_dlogp):
        specialized = compile_()
        unspecialized = compile_(mode=UNSPECIALIZED)
        assert any(isinstance(op, NewtonOp) for op in solver_ops(specialized.f))
        assert not any(isinstance(op, MinimizeOp) for op in solver_ops(specialized.f))
        assert any(isinstance(op, MinimizeOp) for op in solver_ops(unspecialized.f))
        assert_allclose(specialized(point), unspecialized(point), rtol=1e-7)


def test_specialized_scalar_minimize_runs_under_jax():
    pytest.importorskip("jax")
    x_star, _, a, b = build("minimize", (), "BFGS", {"tol": 1e-11})
    grad_a = pt.grad(x_star, a)
    fn = pytensor.function([a, b], [x_star, grad_a], mode="JAX")  # scipy's BFGS cannot run there
    x_ref, dx_da, _ = reference("minimize", A, B)
    assert_allclose(fn(A, B), [x_ref, dx_da], rtol=1e-7)


# --- constant folding in the inner graphs -----------------------------------------------------
def constant_only_nodes(outputs, inputs) -> list:
    """Apply nodes between `inputs` and `outputs` whose inputs are all constants."""
    return [
        node
        for node in applys_between(inputs, outputs)
        if node.inputs and all(isinstance(i, Constant) for i in node.inputs)
    ]


def folded_in_every_inner_function(op) -> None:
    for name, fn in op._compiled_functions().items():
        assert not constant_only_nodes(fn.maker.fgraph.outputs, fn.maker.fgraph.inputs), name


@pytest.mark.parametrize("method", ["BFGS", "trust-ncg", "newton"])
def test_parameter_free_subexpressions_are_folded_once_in_the_compiled_inner_graph(method):
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    # parameter-free: computed from literals only, they stay in the inner graph (not hoisted)
    weights = pt.exp(pt.as_tensor(np.array([0.5, 1.0, 2.0]))) + pt.arange(3.0) ** 2
    shift = pt.log(pt.as_tensor(np.full(3, 2.0))).sum()
    f = (weights * (x - a) ** 2).sum() + shift * pt.cosh(x).sum()
    x_star, success = pmo.minimize(f, x, x0=np.zeros(3), method=method)
    op = x_star.owner.op
    assert op.problem.outer_params == [a]
    inner = op.problem
    assert constant_only_nodes(inner.inner_outputs, [*inner.inner_xs, *inner.inner_params])

    fn = pytensor.function([a], [x_star, success])
    a_val = np.array([0.3, -0.2, 1.0])
    x_val, ok = fn(a_val)
    folded_in_every_inner_function(op)

    w_val, s_val = np.exp([0.5, 1.0, 2.0]) + np.arange(3.0) ** 2, 3 * np.log(2.0)
    ref = optimize.minimize(
        lambda z: (w_val * (z - a_val) ** 2).sum() + s_val * np.cosh(z).sum(),
        np.zeros(3),
        jac=lambda z: 2 * w_val * (z - a_val) + s_val * np.sinh(z),
        method="BFGS",
        options={"gtol": 1e-11},
    )
    assert ok
    assert_allclose(x_val, ref.x, rtol=1e-5, atol=1e-7)
