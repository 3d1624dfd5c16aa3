"""The solver Op's mechanics (mirrors pymc_optim/graph/solver_op.py).

`solution_info` against direct scipy calls, failure reported as data, pickling (``pm.sample``
with ``cores>1`` pickles the compiled functions), the connection pattern and shape inference,
and the NUMBA backend (where the scipy-backed Op runs in object mode).
"""

import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.optimize
from pytensor.gradient import DisconnectedInputError
from pytensor.graph.op import HasInnerGraph
from pytensor.graph.replace import vectorize_graph

import pymc_optim as pmo
from pymc_optim.graph.solver_op import SolverOp

#: pytensor says so (a UserWarning) each time a scipy-backed Op is compiled for NUMBA.
NUMBA_OBJECT_MODE = "ignore:Numba will use object mode to run .*perform method:UserWarning"


@pytest.fixture
def x():
    return pt.vector("x", shape=(2,))


@pytest.fixture
def a():
    return pt.vector("a", shape=(2,))


@pytest.fixture
def s():
    return pt.scalar("s")


@pytest.fixture
def b():
    return pt.scalar("b")


A_VAL = np.array([1.0, 2.0])
B_VAL = 5.0


# --- four small problems, each with its numpy twin for direct scipy calls -------------------


def quartic(x, a):
    """f(x) = |x - a|² + 0.1 Σ x⁴ + 1: strictly convex, minimizer not in closed form."""
    return ((x - a) ** 2).sum() + 0.1 * (x**4).sum() + 1.0


def quartic_np(z, a):
    return float(quartic(z, a)), 2 * (z - a) + 0.4 * z**3


def cubic_system(x, a):
    """The scipy.optimize.root documentation's example, shifted by a."""
    return pt.stack(
        [x[0] + 0.5 * (x[0] - x[1]) ** 3 - a[0], 0.5 * (x[1] - x[0]) ** 3 + x[1] - a[1]]
    )


def cubic_system_np(z, a):
    d = z[0] - z[1]
    F = np.array([z[0] + 0.5 * d**3 - a[0], -0.5 * d**3 + z[1] - a[1]])
    J = np.array([[1 + 1.5 * d**2, -1.5 * d**2], [-1.5 * d**2, 1 + 1.5 * d**2]])
    return F, J


def scalar_objective(s, b):
    return (s - b) ** 2 + 0.1 * s**4


def cube_root_equation(s, b):
    return s**3 - b


# --- solution_info --------------------------------------------------------------------------


def test_solution_info_of_minimize_matches_scipy(x, a):
    x_star, success = pmo.minimize(quartic(x, a), x, x0=np.zeros(2), method="BFGS")
    info = pmo.solution_info(x_star)
    assert info.success is success
    out = pytensor.function([a], [x_star, *info])(A_VAL)
    ref = scipy.optimize.minimize(quartic_np, np.zeros(2), args=(A_VAL,), jac=True, method="BFGS")
    x_val, ok, value, nit, nfev = out
    assert ok and ref.success
    np.testing.assert_allclose(x_val, ref.x, rtol=1e-12)
    np.testing.assert_allclose(value, ref.fun, rtol=1e-12)
    assert (int(nit), int(nfev)) == (ref.nit, ref.nfev)
    assert (value.dtype, nit.dtype, nfev.dtype, ok.dtype) == ("float64", "int64", "int64", "bool")


def test_solution_info_of_root_reports_the_residual_norm(x, a):
    x_star, success = pmo.root(cubic_system(x, a), x, x0=np.zeros(2), method="hybr")
    info = pmo.solution_info(x_star)
    x_val, ok, value, nit, nfev = pytensor.function([a], [x_star, *info])(A_VAL)
    ref = scipy.optimize.root(cubic_system_np, np.zeros(2), args=(A_VAL,), jac=True, method="hybr")
    assert ok and ref.success
    np.testing.assert_allclose(x_val, ref.x, rtol=1e-12)
    np.testing.assert_allclose(value, np.linalg.norm(cubic_system_np(x_val, A_VAL)[0]), atol=1e-15)
    assert value < 1e-10
    assert int(nit) == -1  # scipy's hybr does not count iterations
    assert int(nfev) == ref.nfev


def test_solution_info_of_minimize_scalar_matches_scipy(s, b):
    x_star, _ = pmo.minimize_scalar(scalar_objective(s, b), s, bracket=(0.0, 1.0))
    x_val, ok, value, nit, nfev = pytensor.function([b], [x_star, *pmo.solution_info(x_star)])(
        B_VAL
    )
    ref = scipy.optimize.minimize_scalar(
        lambda z: scalar_objective(z, B_VAL), bracket=(0.0, 1.0), method="brent"
    )
    assert ok and ref.success
    # pytensor's and Python's float pow differ in the last bit, which moves brent's final
    # parabolic steps by ~1e-12 (far inside its 1.5e-8 tolerance)
    np.testing.assert_allclose(x_val, ref.x, rtol=1e-10)
    np.testing.assert_allclose(value, ref.fun, rtol=1e-12)
    assert (int(nit), int(nfev)) == (ref.nit, ref.nfev)


def test_solution_info_of_root_scalar_matches_scipy(s, b):
    x_star, _ = pmo.root_scalar(cube_root_equation(s, b), s, method="brentq", bracket=(0.0, 3.0))
    x_val, ok, value, nit, nfev = pytensor.function([b], [x_star, *pmo.solution_info(x_star)])(
        B_VAL
    )
    ref = scipy.optimize.root_scalar(
        lambda z: cube_root_equation(z, B_VAL), method="brentq", bracket=(0.0, 3.0)
    )
    assert ok and ref.converged
    np.testing.assert_allclose(x_val, ref.root, rtol=1e-12)
    np.testing.assert_allclose(value, abs(x_val**3 - B_VAL), rtol=0, atol=1e-15)
    assert (int(nit), int(nfev)) == (ref.iterations, ref.function_calls)


def test_solution_info_of_a_list_x(a):
    x, y = pt.vector("x", shape=(2,)), pt.scalar("y")
    objective = ((x - a) ** 2).sum() + (y - 1.0) ** 2 + 7.0
    (x_star, y_star), success = pmo.minimize(objective, [x, y], x0=[np.zeros(2), 0.0])
    for solution in ([x_star, y_star], x_star, y_star):
        info = pmo.solution_info(solution)
        assert info.success is success
        np.testing.assert_allclose(info.value.eval({a: A_VAL}), 7.0, rtol=1e-9)


def test_the_value_is_differentiable_by_the_envelope_theorem(x, a):
    # d f(x*(a), a)/da = ∂f/∂a at x*, because ∇ₓf(x*) = 0. A Newton method converges to
    # ‖∇ₓf‖ ≈ 1e-12 here, so the two sides agree far beyond finite-difference accuracy.
    x_star, _ = pmo.minimize(
        quartic(x, a),
        x,
        x0=np.zeros(2),
        method="trust-exact",
        hess=True,
        optimizer_kwargs={"options": {"gtol": 1e-12}},
    )
    value = pmo.solution_info(x_star).value
    fn = pytensor.function([a], [value, pt.grad(value, a), -2 * (x_star - a), x_star])
    val, grad_value, partial_a, x_val = fn(A_VAL)
    np.testing.assert_allclose(grad_value, partial_a, rtol=1e-10)
    np.testing.assert_allclose(grad_value, -2 * (x_val - A_VAL), rtol=1e-10)
    # and against central differences of the value itself: eps = 1e-6 balances the O(eps²)
    # truncation against the O(1e-16 / eps) rounding of a value of order 1
    eps = 1e-6
    value_fn = pytensor.function([a], value)
    fd = [(value_fn(A_VAL + eps * e) - value_fn(A_VAL - eps * e)) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(grad_value, fd, rtol=1e-8)


def test_the_value_of_a_scalar_minimum_is_differentiable(s, b):
    x_star, _ = pmo.minimize_scalar(
        scalar_objective(s, b), s, bracket=(0.0, 1.0), optimizer_kwargs={"tol": 1e-12}
    )
    value = pmo.solution_info(x_star).value
    grad_value, x_val = pytensor.function([b], [pt.grad(value, b), x_star])(B_VAL)
    # brent stops within ~1e-8 of x* (its tolerance is floored at sqrt(machine eps) relative)
    np.testing.assert_allclose(grad_value, -2 * (x_val - B_VAL), rtol=1e-6)


@pytest.mark.parametrize(
    "not_a_solution",
    [
        lambda x, a: x + a,
        lambda x, a: x,
        lambda x, a: pmo.minimize(((x - a) ** 2).sum(), x)[0] + 1.0,
    ],
    ids=["expression", "root-variable", "function-of-a-solution"],
)
def test_solution_info_refuses_other_variables(x, a, not_a_solution):
    with pytest.raises(TypeError, match=r"`x_star` must be a solution returned by a pymc_optim"):
        pmo.solution_info(not_a_solution(x, a))


def test_solution_info_of_a_vectorized_solve(x, a):
    x_star, _ = pmo.minimize(((x - a) ** 2).sum() + 1.0, x, x0=np.zeros(2))
    batch = pt.matrix("batch", shape=(3, 2))
    x_batched = vectorize_graph(x_star, {a: batch})
    info = pmo.solution_info(x_batched)
    np.testing.assert_allclose(info.value.eval({batch: np.ones((3, 2))}), np.ones(3), rtol=1e-9)


# --- failure is data ------------------------------------------------------------------------


def test_a_bracket_without_sign_change_gives_nan_not_an_exception(s, b):
    x_star, success = pmo.root_scalar(s**2 - b, s, method="brentq", bracket=(0.0, 3.0))
    info = pmo.solution_info(x_star)
    fn = pytensor.function([b], [x_star, success, info.n_iterations, pt.grad(x_star, b)])
    x_val, ok, nit, grad = fn(16.0)  # the root 4 lies outside the bracket
    assert not ok
    assert np.isnan(x_val) and np.isnan(grad)
    assert int(nit) == -1
    # the same compiled function still solves a good case afterwards
    x_val, ok, _, grad = fn(4.0)
    assert ok
    np.testing.assert_allclose([x_val, grad], [2.0, 0.25], rtol=1e-9)


def test_a_nan_objective_gives_success_false(x, a, b):
    # sqrt(b) is NaN for b < 0, so every objective value is NaN (its x-gradient is not)
    x_star, success = pmo.minimize(((x - a) ** 2).sum() + pt.sqrt(b), x, x0=np.zeros(2))
    fn = pytensor.function([a, b], success)
    assert fn(A_VAL, 1.0)
    assert not fn(A_VAL, -1.0)


def test_a_nan_gradient_gives_success_false(x, a, b):
    x_star, success = pmo.minimize(pt.sqrt(b) * ((x - a) ** 2).sum(), x, x0=np.zeros(2))
    fn = pytensor.function([a, b], success)
    assert fn(A_VAL, 1.0)
    assert not fn(A_VAL, -1.0)


def test_the_gradient_of_a_failed_solve_is_nan_of_the_right_shape(x, a, b):
    # the dense solve at a NaN Hessian (with the detected diagonal structure, PyTensor cancels
    # sqrt(b) out of A⁻¹ ∂F/∂a symbolically and the gradient is the finite 1 of every b > 0)
    x_star, success = pmo.minimize(
        pt.sqrt(b) * ((x - a) ** 2).sum(), x, x0=np.zeros(2), structure="dense"
    )
    fn = pytensor.function([a, b], [success, pt.grad(x_star.sum(), a)])
    ok, grad = fn(A_VAL, -1.0)
    assert not ok
    assert grad.shape == (2,)
    assert np.isnan(grad).all()


# --- Op mechanics ---------------------------------------------------------------------------


def test_make_node_checks_the_number_of_inputs(x, a):
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(2))
    op = x_star.owner.op
    with pytest.raises(TypeError, match=r"MinimizeOp expects \d+ inputs, got 1\."):
        op(np.zeros(2))


def test_the_op_prints_its_method(x, a):
    x_star, _ = pmo.root(x - a, x, x0=np.zeros(2), method="lm")
    assert str(x_star.owner.op) == "RootOp{method=lm}"


def test_the_inner_graph_is_visible_to_pytensor_tools(x, a):
    """SolverOp is a HasInnerGraph: dprint shows the objective inside the solve, the inner inputs
    line up with the node's inputs, and compiling keeps the very same Op (its compiled inner
    functions and traces)."""
    objective = ((x - a) ** 2).sum()
    x_star, _ = pmo.minimize(objective, x, x0=np.zeros(2), method="newton")
    op = x_star.owner.op
    assert isinstance(op, HasInnerGraph)
    assert op.inner_inputs[: op.n_controls + op.n_params] == [
        *op.problem.inner_xs,
        *op.problem.inner_params,
    ]
    assert op.fgraph.outputs == op.inner_outputs
    printed = pytensor.dprint(x_star, file="str")
    assert "Inner graphs:" in printed and "Pow" in printed.split("Inner graphs:")[1]
    fn = pytensor.function([a], x_star)
    assert [node.op for node in fn.maker.fgraph.apply_nodes if isinstance(node.op, SolverOp)] == [
        op
    ]
    np.testing.assert_allclose(fn(np.array([1.0, 2.0])), [1.0, 2.0], rtol=1e-12)


def test_the_solution_does_not_depend_on_x0_or_a_bracket(s, b):
    start = pt.scalar("start")
    x_star, success = pmo.minimize((s - b) ** 2, s, x0=start)
    np.testing.assert_allclose(pt.grad(x_star, b).eval({b: 3.0, start: 0.0}), 1.0, rtol=1e-6)
    with pytest.raises(DisconnectedInputError):
        pt.grad(x_star, start)
    assert pt.grad(x_star, start, disconnected_inputs="ignore").eval({start: 0.0}) == 0.0

    lower = pt.scalar("lower")
    r_star, _ = pmo.root_scalar(s - b, s, method="bisect", bracket=(lower, 10.0))
    with pytest.raises(DisconnectedInputError):
        pt.grad(r_star, lower)


def test_a_factor_whose_gradient_flows_through_k_receives_none(x):
    # covariance_solve(K, L, x) = K⁻¹x from L = chol K, differentiated through K: a solver
    # on it sends L no gradient (zeros would cost a Cholesky pullback), and ∂x*/∂K is whole.
    # (A parameter F does not mention gets exact zeros instead: tests/problems, "disconnected".)
    from pymc_optim.linalg.latent_gaussian import covariance_solve

    K = pt.matrix("K", shape=(2, 2))
    L = pt.linalg.cholesky(K)
    x_star, _ = pmo.root(covariance_solve(K, L, x) - 1.0, x, x0=np.zeros(2))
    node = x_star.owner
    connected = [row[0] for row in node.op.connection_pattern(node)]
    assert not connected[node.inputs.index(L)]
    assert connected[node.inputs.index(K)]
    # x* = K·1, so ∂(1ᵀx*)/∂K = 11ᵀ
    grad_K = pt.grad(x_star.sum(), K).eval({K: np.array([[2.0, 0.5], [0.5, 1.0]])})
    np.testing.assert_allclose(grad_K, np.ones((2, 2)), atol=1e-8)


def test_success_and_counters_are_not_differentiable(x, a):
    x_star, success = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(2))
    info = pmo.solution_info(x_star)
    for output in (success, info.n_iterations, info.n_evaluations):
        with pytest.raises(DisconnectedInputError):
            pt.grad(output.astype("float64"), a)


def test_the_shape_of_the_solution_needs_no_solve():
    x, a = pt.matrix("x"), pt.matrix("a")
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=pt.zeros_like(a))
    fn = pytensor.function([a], x_star.shape)
    assert not any(isinstance(node.op, SolverOp) for node in fn.maker.fgraph.toposort())
    np.testing.assert_array_equal(fn(np.ones((3, 4))), [3, 4])


# --- PyTensor's Op contract: props, equality, clone, no state on the Op ---------------------

#: One solve of each Op class, built on (x, s, a, b); `options` changes one of its props.
CONTRACT_CASES = {
    "minimize-BFGS": lambda x, s, a, b, **o: pmo.minimize(
        quartic(x, a), x, x0=np.zeros(2), method="BFGS", optimizer_kwargs=o
    ),
    "minimize-newton": lambda x, s, a, b, **o: pmo.minimize(
        quartic(x, a), x, x0=np.zeros(2), method="newton", optimizer_kwargs=o
    ),
    "root-hybr": lambda x, s, a, b, **o: pmo.root(
        cubic_system(x, a), x, x0=np.zeros(2), optimizer_kwargs=o
    ),
    "minimize_scalar": lambda x, s, a, b, **o: pmo.minimize_scalar(
        scalar_objective(s, b), s, x0=0.0, method="brent", optimizer_kwargs=o
    ),
    "root_scalar": lambda x, s, a, b, **o: pmo.root_scalar(
        s**3 - b, s, method="brentq", bracket=(0.0, 3.0), optimizer_kwargs=o
    ),
    "fixed_point-anderson": lambda x, s, a, b, **o: pmo.fixed_point(
        0.5 * pt.cos(x) + 0.1 * a, x, x0=np.zeros(2), method="anderson", **o
    ),
    "constrained-SLSQP": lambda x, s, a, b, **o: _on_the_line(x, a, "SLSQP", o),
    "constrained-newton": lambda x, s, a, b, **o: _on_the_line(x, a, "newton", o),
}


def _on_the_line(x, a, method, options):
    """The quartic minimized on x₁ + x₂ = 1."""
    constraint = {"type": "eq", "fun": x.sum() - 1.0}
    return pmo.minimize(
        quartic(x, a),
        x,
        x0=np.zeros(2),
        method=method,
        constraints=[constraint],
        optimizer_kwargs=options,
    )


@pytest.fixture(params=sorted(CONTRACT_CASES))
def contract_case(request, x, s, a, b):
    name = request.param
    build = CONTRACT_CASES[name]

    def solve(**options):
        x_star, _ = build(x, s, a, b, **options)
        return x_star

    return name, solve, [v for v in (a, b) if v in _graph_inputs(solve())]


def _graph_inputs(var):
    from pytensor.graph.traversal import graph_inputs

    return set(graph_inputs([var]))


def _values(inputs):
    return [A_VAL if var.ndim else np.asarray(B_VAL) for var in inputs]


def test_every_solver_op_declares_its_options_as_props(contract_case):
    _, solve, _ = contract_case
    op = solve().owner.op
    assert "__props__" in type(op).__dict__ or type(op).__mro__[1].__dict__.get("__props__")
    assert set(op._props_dict()) == set(type(op).__props__)
    assert "n_extras" in op.__props__ and op._props_dict()["n_extras"] == op.n_extras


def test_solves_built_alike_are_equal_and_merge(contract_case):
    """Two solves of one graph built separately are equal Ops (same hash) and compile to one
    node; another value of an option makes another Op."""
    name, solve, inputs = contract_case
    first, second = solve(), solve()
    assert first.owner.op == second.owner.op and first.owner.op is not second.owner.op
    assert hash(first.owner.op) == hash(second.owner.op)
    fn = pytensor.function(inputs, [first, second], mode="FAST_RUN")
    solvers = [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, SolverOp)]
    assert len(solvers) == 1
    one, two = fn(*_values(inputs))
    np.testing.assert_array_equal(one, two)
    # (scipy's root_scalar takes its tolerance as `xtol`, the others as `tol`)
    other = solve(**{"xtol" if name == "root_scalar" else "tol": 1e-3})
    assert other.owner.op != first.owner.op


def test_solves_of_an_unshaped_vector_from_a_symbolic_start_merge_too():
    """As users write them: `pt.vector("x")` without a shape, x0 an input, default method."""
    x, a, start = pt.vector("x"), pt.vector("a"), pt.vector("start")

    def solve():
        return pmo.minimize(((x - a) ** 2).sum() + pt.exp(x).sum(), x, x0=start)[0]

    first, second = solve(), solve()
    assert first.owner.op == second.owner.op
    fn = pytensor.function([a, start], [first, second], mode="FAST_RUN")
    assert sum(isinstance(n.op, SolverOp) for n in fn.maker.fgraph.toposort()) == 1
    one, two = fn(A_VAL, np.zeros(2))
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(2 * (one - A_VAL) + np.exp(one), 0.0, atol=1e-5)


def test_a_clone_has_its_own_inner_graph_and_computes_the_same(contract_case):
    _, solve, inputs = contract_case
    x_star = solve()
    op = x_star.owner.op
    twin = op.clone()
    assert twin is not op and twin == op and hash(twin) == hash(op)
    assert not {*twin.inner_inputs, *twin.inner_outputs} & {*op.inner_inputs, *op.inner_outputs}
    cloned = twin.make_node(*x_star.owner.inputs).outputs[0]
    fn = pytensor.function(inputs, [x_star, cloned], mode="FAST_RUN")
    original, copy = fn(*_values(inputs))
    np.testing.assert_array_equal(original, copy)


def test_compiling_and_solving_leave_the_op_as_it_was_built(contract_case):
    """Nothing but the caches of what the inner graph determines (`SolverOp.CACHES`) changes
    on an Op once its node exists: not its options, not its attributes' values."""
    _, solve, inputs = contract_case
    x_star = solve()
    op = x_star.owner.op
    before = {k: v for k, v in op.__dict__.items() if k not in SolverOp.CACHES}
    outputs = [x_star, *pt.grad(x_star.sum(), inputs)]
    for mode in ("FAST_RUN", "NUMBA"):
        fn = pytensor.function(inputs, outputs, mode=mode)
        fn(*_values(inputs))
        fn(*_values(inputs))
    after = {k: v for k, v in op.__dict__.items() if k not in SolverOp.CACHES}
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)


def test_replace_makes_a_new_op_and_checks_its_options(x, a):
    x_star, _ = pmo.minimize(quartic(x, a), x, x0=np.zeros(2), method="newton")
    op = x_star.owner.op
    looser = op.replace(tol=1e-3)
    assert looser.tol == 1e-3 and op.tol != 1e-3 and looser != op
    assert looser._compiled is op._compiled  # (the loop's options: the same inner functions)
    y_star, _ = pmo.minimize(quartic(x, a), x, x0=np.zeros(2), method="BFGS")
    scipy_op = y_star.owner.op
    other = scipy_op.replace(method="L-BFGS-B")
    assert other.method == "L-BFGS-B" and other._compiled is not scipy_op._compiled
    with pytest.raises(ValueError, match=r"`replace` takes options of NewtonOp .*got bogus"):
        op.replace(bogus=1)


def test_warm_start_history_belongs_to_each_compiled_function():
    """Two functions compiled from one warm-starting marginal keep separate histories: the
    second one's first solve at θ starts cold although the first solved there already."""
    from cases import counters, poisson_intercepts

    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    first, second = counters(warm), counters(warm)
    theta = (0.4, np.log(0.6))
    _, cold_iterations, _ = first(*theta)
    assert first(*theta)[1] == 0  # from its own last mode
    assert second(*theta)[1] == cold_iterations > 0


# --- pickling -------------------------------------------------------------------------------


def test_a_compiled_function_pickles_before_and_after_it_ran(x, a):
    x_star, success = pmo.minimize(quartic(x, a), x, x0=np.zeros(2))
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star.sum(), a)])
    fresh = pickle.loads(pickle.dumps(fn))
    expected = fn(A_VAL)  # compiles the Op's inner functions, which do not pickle
    used = pickle.loads(pickle.dumps(fn))
    for restored in (fresh, used):
        for got, want in zip(restored(A_VAL), expected, strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "build",
    [
        lambda x, s, a, b: pmo.minimize(quartic(x, a), x, x0=np.zeros(2))[0],
        lambda x, s, a, b: pmo.root(cubic_system(x, a), x, x0=np.zeros(2))[0],
        lambda x, s, a, b: pmo.minimize_scalar(scalar_objective(s, b), s, x0=0.0)[0],
        lambda x, s, a, b: pmo.root_scalar(s**3 - b, s, method="brentq", bracket=(0.0, 3.0))[0],
    ],
    ids=["minimize", "root", "minimize_scalar", "root_scalar"],
)
def test_the_graph_and_its_gradient_pickle(x, s, a, b, build):
    x_star = build(x, s, a, b)
    loss = (x_star**2).sum()
    grads = pt.grad(loss, [a, b], disconnected_inputs="ignore")
    fn = pytensor.function([a, b], [x_star, *grads], on_unused_input="ignore")
    expected = fn(A_VAL, B_VAL)
    x_star2, a2, b2, loss2 = pickle.loads(pickle.dumps((x_star, a, b, loss)))
    grads2 = pt.grad(loss2, [a2, b2], disconnected_inputs="ignore")
    fn2 = pytensor.function([a2, b2], [x_star2, *grads2], on_unused_input="ignore")
    for got, want in zip(fn2(A_VAL, B_VAL), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


# --- the NUMBA backend ----------------------------------------------------------------------


@pytest.mark.filterwarnings(NUMBA_OBJECT_MODE)
@pytest.mark.parametrize(
    "build",
    [
        lambda x, s, a, b: pmo.minimize(quartic(x, a), x, x0=np.zeros(2))[0],
        lambda x, s, a, b: pmo.root(cubic_system(x, a), x, x0=np.zeros(2))[0],
        lambda x, s, a, b: pmo.minimize_scalar(scalar_objective(s, b), s, x0=0.0)[0],
        lambda x, s, a, b: pmo.root_scalar(s**3 - b, s, method="brentq", bracket=(0.0, 3.0))[0],
    ],
    ids=["minimize", "root", "minimize_scalar", "root_scalar"],
)
def test_numba_mode_gives_the_same_values_and_gradients(x, s, a, b, build):
    x_star = build(x, s, a, b)
    info = pmo.solution_info(x_star)
    loss = (x_star**2).sum() + a.sum() * b
    outputs = [x_star, info.success, info.value, *pt.grad(loss, [a, b])]
    default = pytensor.function([a, b], outputs)
    numba = pytensor.function([a, b], outputs, mode="NUMBA")
    for got, want in zip(numba(A_VAL, B_VAL), default(A_VAL, B_VAL), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


# --- pickling a compiled model (issue 17, defect 7) -------------------------------------------


@pytest.mark.parametrize("module", ["pickle", "cloudpickle"])
def test_compiled_model_functions_pickle_when_a_parameter_is_a_model_variable(module):
    import pickle

    import cloudpickle
    import pymc as pm

    dumps, loads = (
        (pickle.dumps, pickle.loads)
        if module == "pickle"
        else (cloudpickle.dumps, cloudpickle.loads)
    )
    with pm.Model() as model:
        gamma = pm.LogNormal("gamma", 0.0, 1.0)
        x = pt.vector("x")
        x_star, _ = pmo.minimize(((x - gamma) ** 2).sum() + gamma * (x**4).sum(), x, x0=np.zeros(2))
        pm.Normal("y", x_star.sum(), 1.0, observed=1.0)
    point = {"gamma_log__": np.array(0.3)}
    logp = model.compile_logp()
    assert loads(dumps(logp))(point) == logp(point)
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    copy = loads(dumps(fn))
    copy.set_extra_values({})
    for got, want in zip(copy(np.array([0.3])), fn(np.array([0.3])), strict=True):
        np.testing.assert_array_equal(got, want)


# --- solution_info of a 0-d fixed point (issue 17, defect 8) ----------------------------------


@pytest.mark.parametrize("method", ["iteration", "anderson", "newton"])
def test_solution_info_value_of_a_0d_fixed_point_is_the_residual(method):
    s, a = pt.scalar("s"), pt.scalar("a")
    x_star, _ = pmo.fixed_point(0.5 * s + a, s, x0=0.2, method=method)
    x_value, value = pytensor.function([a], [x_star, pmo.solution_info(x_star).value])(1.5)
    # it was NaN: a rewrite turns sqrt(F²) into switch(F >= 0, F, nan) for one element
    np.testing.assert_allclose(value, abs(x_value - (0.5 * x_value + 1.5)), rtol=1e-12, atol=1e-300)


# --- what a failed solve is: errors of the problem's graph, not of the solver's code ---------


class _Raising(pytensor.graph.op.Op):
    """x passed through; raises `error` when evaluated."""

    __props__ = ("error",)

    def __init__(self, error):
        self.error = error

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return pytensor.graph.basic.Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        raise self.error("raised by an Op of the graph")

    def pullback(self, inputs, outputs, output_grads):
        return output_grads


class _ProblemError(Exception):
    """A user's own CheckAndRaise class."""


def _checked(value, condition, kind):
    """`value` behind a raising check of `condition`, as a user's graph holds one."""
    from pymc.logprob.utils import CheckParameterValue
    from pytensor.raise_op import Assert, CheckAndRaise

    if kind == "pymc":  # a PyMC check PyMC itself does not turn into −inf
        return CheckParameterValue("s > 0", can_be_replaced_by_ninf=False)(value, condition)
    if kind == "assert":
        return Assert("s > 0")(value, condition)
    return CheckAndRaise(_ProblemError, "s > 0")(value, condition)


@pytest.mark.parametrize("method", ["newton", "BFGS", "Nelder-Mead"])
@pytest.mark.parametrize("kind", ["pymc", "assert", "own"])
def test_a_raising_check_of_the_graph_fails_the_solve(x, a, s, method, kind):
    objective = _checked(((x - a) ** 2).sum(), s > 0, kind) * s**2
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(2), method=method)
    fn = pytensor.function([a, s], [x_star, success, pmo.solution_info(x_star).n_iterations])
    x_value, ok, n_iterations = fn(A_VAL, 1.0)
    assert ok
    np.testing.assert_allclose(x_value, A_VAL, rtol=1e-4)
    x_value, ok, n_iterations = fn(A_VAL, -1.0)
    assert not ok and n_iterations == -1
    assert x_value.shape == (2,) and np.isnan(x_value).all()


@pytest.mark.parametrize("method", ["newton", "BFGS", "hybr"])
@pytest.mark.parametrize("error", [TypeError, IndexError, AttributeError, np.exceptions.AxisError])
def test_other_errors_of_the_graph_propagate(x, a, method, error):
    """A TypeError, IndexError, AttributeError or AxisError raised while evaluating the problem
    says that an Op is broken, not that the problem is undefined: it is not a failed solve."""
    residual = _Raising(error)(x - a)
    if method == "hybr":
        x_star, _ = pmo.root(residual, x, x0=np.zeros(2), method=method)
    else:
        x_star, _ = pmo.minimize((residual**2).sum(), x, x0=np.zeros(2), method=method)
    fn = pytensor.function([a], x_star)
    with pytest.raises(error, match="raised by an Op of the graph"):
        fn(A_VAL)


@pytest.mark.parametrize("method", ["newton", "BFGS", "iteration"])
def test_an_error_of_the_solver_code_propagates(x, a, method, monkeypatch):
    """A bug of the solver (here a TypeError in its unpacking of x, called by scipy for BFGS) is
    raised, not reported as a failed solve."""
    from pymc_optim.backends import packing

    def broken(*args, **kwargs):
        raise TypeError("a bug of the solver")

    if method == "iteration":
        x_star, _ = pmo.fixed_point(0.5 * pt.cos(x) + a, x, x0=np.zeros(2), method=method)
    else:
        x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.ones(2), method=method)
    fn = pytensor.function([a], x_star)
    if method == "newton":  # one flat control needs no packing: break the loop itself
        from pymc_optim.backends import iterations

        monkeypatch.setattr(iterations, "newton", broken)
    else:
        monkeypatch.setattr(packing.Packer, "unpack", broken)
    with pytest.raises(TypeError, match="a bug of the solver"):
        fn(A_VAL)
