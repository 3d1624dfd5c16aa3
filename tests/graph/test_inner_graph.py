"""Build-time validation and graph plumbing of the solvers (mirrors pymc_optim/_inner_graph.py).

Every bad input is refused when the graph is built, with a message that names the argument;
the x-independent parts of the user's graph become parameter inputs of the solver Op, and the
initial guess decides whether `x` stays an input of the returned graph.
"""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import ancestors, explicit_graph_inputs, graph_inputs
from pytensor.scalar.basic import Exp
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.op import RandomVariable

import pymc_optim as pmo
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.problems.minimize import MINIMIZE_METHODS
from pymc_optim.problems.minimize_scalar import MINIMIZE_SCALAR_METHODS
from pymc_optim.problems.root import ROOT_METHODS
from pymc_optim.problems.root_scalar import ROOT_SCALAR_METHODS


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


def solver_node(x_star):
    node = x_star.owner
    assert isinstance(node.op, SolverOp)
    return node


def parameters(x_star):
    """The Op's parameter inputs that are not computed from constants alone.

    Constant-only ones are filtered out here because of the bug pinned by
    `test_broadcast_constants_stay_inside_the_inner_graph`.
    """
    node = solver_node(x_star)
    params = node.inputs[node.op.n_controls : node.op.n_controls + node.op.n_params]
    return [p for p in params if not all(isinstance(r, Constant) for r in graph_inputs([p]))]


def inner_ops(op):
    return [var.owner.op for var in ancestors(op.problem.inner_outputs) if var.owner is not None]


# --- the objective / equations -------------------------------------------------------------


def test_minimize_refuses_a_non_scalar_objective(x, a):
    with pytest.raises(ValueError, match=r"`objective` must be a scalar; got .* 1 dimensions"):
        pmo.minimize((x - a) ** 2, x)


def test_minimize_scalar_refuses_a_non_scalar_objective(s, a):
    with pytest.raises(ValueError, match=r"`objective` must be a scalar; got .* 1 dimensions"):
        pmo.minimize_scalar((s - a) ** 2, s)


def test_root_scalar_refuses_a_non_scalar_equation(s, a):
    with pytest.raises(ValueError, match=r"`equation` must be a scalar; got .* 1 dimensions"):
        pmo.root_scalar(s - a, s)


def test_root_refuses_a_non_square_system():
    x = pt.vector("x", shape=(3,))
    with pytest.raises(
        ValueError, match=r"`equations` must have as many elements as `x`.*got 2 equations for 3"
    ):
        pmo.root(x[:2] - 1.0, x, x0=np.zeros(3))


def test_root_counts_the_size_of_every_equation_and_unknown():
    x, y = pt.vector("x", shape=(2,)), pt.scalar("y")
    with pytest.raises(ValueError, match=r"got 4 equations for 3 unknowns"):
        pmo.root([x - y, pt.stack([y, x[0]])], [x, y])


@pytest.mark.parametrize(
    "solve",
    [
        lambda eq, x: pmo.minimize(eq**2, x),
        lambda eq, x: pmo.root(eq, x),
        lambda eq, x: pmo.minimize_scalar(eq**2, x),
        lambda eq, x: pmo.root_scalar(eq, x),
    ],
    ids=["minimize", "root", "minimize_scalar", "root_scalar"],
)
def test_every_routine_refuses_an_x_absent_from_the_graph(solve, s, b):
    with pytest.raises(ValueError, match=r"`x` must be an input of the \w+'s graph; `s` does not"):
        solve(b - 1.0, s)


def test_root_refuses_an_equation_that_does_not_depend_on_x(x, a):
    with pytest.raises(ValueError, match=r"does not depend on `x`; there is nothing to solve"):
        pmo.root([x[0] - a[0], a[1] - 1.0], x)


# --- the control variable x ----------------------------------------------------------------


@pytest.mark.parametrize(
    "solve",
    [
        lambda x, xs: pmo.minimize(((x - 1.0) ** 2).sum(), xs),
        lambda x, xs: pmo.root(x - 1.0, xs),
        lambda x, xs: pmo.minimize_scalar((x - 1.0) ** 2, xs),
        lambda x, xs: pmo.root_scalar(x - 1.0, xs),
    ],
    ids=["minimize", "root", "minimize_scalar", "root_scalar"],
)
def test_every_routine_refuses_a_computed_x(solve, s):
    with pytest.raises(ValueError, match=r"got `.*`, which is computed from other variables"):
        solve(s, s + 1.0)


@pytest.mark.parametrize(
    "solve",
    [
        lambda x: pmo.minimize(((x - 1.5) ** 2).sum(), x),
        lambda x: pmo.root(x - 1.5, x),
        lambda x: pmo.minimize_scalar((x - 1.5) ** 2, x),
        lambda x: pmo.root_scalar(x - 1.5, x),
    ],
    ids=["minimize", "root", "minimize_scalar", "root_scalar"],
)
def test_every_routine_refuses_an_integer_x(solve):
    x = pt.scalar("k", dtype="int64")
    with pytest.raises(TypeError, match=r"`x` must have a floating-point dtype; got `k` of dtype"):
        solve(x)


def test_minimize_refuses_a_list_x_with_duplicates(x, a):
    with pytest.raises(ValueError, match=r"`x` lists the same variable twice"):
        pmo.minimize(((x - a) ** 2).sum(), [x, x])


def test_root_refuses_a_list_x_with_duplicates(x, a):
    with pytest.raises(ValueError, match=r"`x` lists the same variable twice"):
        pmo.root([x - a, x - a], [x, x])


def test_minimize_refuses_an_empty_list_x(x, a):
    with pytest.raises(ValueError, match=r"`x` must hold at least one variable; got an empty"):
        pmo.minimize(((x - a) ** 2).sum(), [])


@pytest.mark.parametrize(
    "x_arg, match",
    [
        (np.zeros(2), r"`x` must be a PyTensor tensor variable .*got ndarray"),
        (pt.constant(np.zeros(2)), r"`x` must be a free input variable, not a constant"),
    ],
    ids=["numpy", "constant"],
)
def test_minimize_refuses_an_x_that_is_not_a_variable(x, a, x_arg, match):
    with pytest.raises(TypeError, match=match):
        pmo.minimize(((x - a) ** 2).sum(), x_arg)


@pytest.mark.parametrize(
    "solve, vector_routine",
    [(pmo.minimize_scalar, "minimize"), (pmo.root_scalar, "root")],
    ids=["minimize_scalar", "root_scalar"],
)
def test_scalar_routines_refuse_tensor_or_list_x(x, s, solve, vector_routine):
    with pytest.raises(
        ValueError, match=rf"must be 0-d; got `x` with 1 dim.*Use `{vector_routine}`"
    ):
        solve(x.sum() ** 2, x)
    with pytest.raises(TypeError, match=rf"not a list; use `{vector_routine}` for several"):
        solve(s**2, [s])


# --- methods -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "routine, valid, call",
    [
        ("minimize", MINIMIZE_METHODS, lambda s, m: pmo.minimize(s**2, s, method=m)),
        ("root", ROOT_METHODS, lambda s, m: pmo.root(s, s, method=m)),
        (
            "minimize_scalar",
            MINIMIZE_SCALAR_METHODS,
            lambda s, m: pmo.minimize_scalar(s**2, s, method=m),
        ),
        ("root_scalar", ROOT_SCALAR_METHODS, lambda s, m: pmo.root_scalar(s, s, method=m)),
    ],
)
def test_unknown_method_lists_the_valid_ones(s, routine, valid, call):
    listing = ", ".join(repr(m) for m in valid)
    match = rf"`method` 'newtonish' is not a method of `{routine}`\. Valid methods: "
    with pytest.raises(ValueError, match=match) as excinfo:
        call(s, "newtonish")
    assert listing in str(excinfo.value)


def test_method_names_are_case_insensitive(s):
    x_star, _ = pmo.minimize((s - 2.0) ** 2, s, x0=0.0, method="bfgs")
    assert x_star.owner.op.method == "BFGS"
    np.testing.assert_allclose(x_star.eval(), 2.0, rtol=1e-6)


def test_method_must_be_a_string(s):
    with pytest.raises(TypeError, match=r"`method` must be a string; got 3"):
        pmo.minimize(s**2, s, method=3)


@pytest.mark.parametrize("method", ["dogleg", "trust-exact"])
def test_minimize_methods_that_need_a_hessian_ask_for_hess(x, a, method):
    with pytest.raises(
        ValueError, match=rf"`method` '{method}' needs the Hessian; pass `hess=True`"
    ):
        pmo.minimize(((x - a) ** 2).sum(), x, method=method)


def test_minimize_methods_that_need_the_gradient_ask_for_jac(x, a):
    with pytest.raises(ValueError, match=r"`method` 'Newton-CG' needs the gradient; pass `jac"):
        pmo.minimize(((x - a) ** 2).sum(), x, method="Newton-CG", jac=False)


def test_minimize_refuses_a_hessian_that_the_method_ignores(x, a):
    with pytest.raises(ValueError, match=r"`hess=True` has no effect with `method` 'BFGS'"):
        pmo.minimize(((x - a) ** 2).sum(), x, hess=True)


@pytest.mark.parametrize("method", ["brentq", "bisect", "toms748"])
def test_root_scalar_bracketing_methods_need_a_bracket(s, b, method):
    with pytest.raises(ValueError, match=rf"`method` '{method}' needs `bracket=\(a, b\)`"):
        pmo.root_scalar(s - b, s, method=method)


def test_root_scalar_open_methods_refuse_a_bracket(s, b):
    with pytest.raises(ValueError, match=r"`bracket` is not used by the open method 'newton'"):
        pmo.root_scalar(s - b, s, method="newton", bracket=(0.0, 1.0))


def test_minimize_scalar_bounded_needs_bounds(s, b):
    with pytest.raises(ValueError, match=r"`method` 'bounded' needs `bounds=\(lower, upper\)`"):
        pmo.minimize_scalar((s - b) ** 2, s, method="bounded")


def test_minimize_scalar_bounds_only_with_bounded(s, b):
    with pytest.raises(ValueError, match=r"`bounds` are only used by `method='bounded'`"):
        pmo.minimize_scalar((s - b) ** 2, s, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"`bracket` is not used by `method='bounded'`"):
        pmo.minimize_scalar((s - b) ** 2, s, method="bounded", bounds=(0, 1), bracket=(0, 1))


@pytest.mark.parametrize(
    "interval, match",
    [
        ((0.0,), r"`bracket` must be a tuple of 2 numbers or scalar expressions; got \(0.0,\)"),
        ((np.zeros(2), 1.0), r"`bracket` must hold scalars; got .* 1 dimensions"),
    ],
)
def test_root_scalar_bracket_must_be_two_scalars(s, b, interval, match):
    with pytest.raises(ValueError, match=match):
        pmo.root_scalar(s - b, s, method="brentq", bracket=interval)


# --- random variables ----------------------------------------------------------------------


def test_a_random_draw_that_depends_on_x_is_refused(x):
    noisy = pt.random.normal(x, 1.0, size=(2,))
    with pytest.raises(
        ValueError, match=r"must be deterministic, but its graph draws from the random variable"
    ):
        pmo.minimize(((x - noisy) ** 2).sum(), x)


def test_a_random_draw_used_as_a_parameter_is_refused(x):
    draw = pt.random.normal(size=(2,))
    with pytest.raises(ValueError, match=r"contains the random draw .* not a variable of the"):
        pmo.minimize(((x - draw) ** 2).sum(), x)


def test_a_pymc_dist_draw_used_as_a_parameter_is_refused_outside_a_model(s):
    with pytest.raises(ValueError, match=r"contains the random draw .*`pm.logp\(dist, value\)`"):
        pmo.root_scalar(s - pm.Normal.dist(), s, x0=0.0)


def test_a_pymc_dist_draw_is_refused_inside_a_model_too(s):
    with pm.Model(), pytest.raises(ValueError, match=r"not a variable of the current model"):
        pmo.minimize((s - pm.Normal.dist()) ** 2, s)


def test_model_random_variables_are_allowed_as_parameters(x):
    with pm.Model() as model:
        mu = pm.Normal("mu", shape=(2,))
        x_star, success = pmo.minimize(((x - pt.exp(mu)) ** 2).sum(), x, x0=np.zeros(2))
    params = parameters(x_star)
    assert len(params) == 1 and params[0].owner.inputs == [mu]
    # in the model's log-density space the RV is replaced by its value variable
    outs = model.replace_rvs_by_values([x_star, success])
    out, ok = pytensor.function(model.value_vars, outs)(np.array([0.0, np.log(2.0)]))
    assert ok
    np.testing.assert_allclose(out, [1.0, 2.0], rtol=1e-6)


def test_random_draws_of_the_models_variables_are_not_hidden_by_the_model_check(x):
    with pm.Model():
        mu = pm.Normal("mu")
        noisy = pm.Normal.dist(mu, 1.0)  # depends on a model RV, but is not one itself
        with pytest.raises(ValueError, match=r"contains the random draw"):
            pmo.minimize(((x - noisy) ** 2).sum(), x)


def test_the_refusals_find_no_random_variable_in_an_accepted_graph(x):
    with pm.Model():
        mu = pm.Normal("mu")
        x_star, _ = pmo.minimize(((x - mu) ** 2).sum(), x)
    op = solver_node(x_star).op
    assert not any(isinstance(o, RandomVariable) for o in inner_ops(op))


# --- optimizer_kwargs ----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["bounds", "constraints", "jac", "hess", "hessp", "method", "x0"])
def test_minimize_refuses_optimizer_kwargs_it_controls(x, a, key):
    with pytest.raises(ValueError, match=rf"`optimizer_kwargs` must not contain '{key}'"):
        pmo.minimize(((x - a) ** 2).sum(), x, optimizer_kwargs={key: None})


@pytest.mark.parametrize(
    "solve, key",
    [
        (lambda s, b, kw: pmo.root(s - b, s, optimizer_kwargs=kw), "jac"),
        (lambda s, b, kw: pmo.minimize_scalar((s - b) ** 2, s, optimizer_kwargs=kw), "bounds"),
        (lambda s, b, kw: pmo.minimize_scalar((s - b) ** 2, s, optimizer_kwargs=kw), "bracket"),
        (lambda s, b, kw: pmo.root_scalar(s - b, s, optimizer_kwargs=kw), "bracket"),
        (lambda s, b, kw: pmo.root_scalar(s - b, s, optimizer_kwargs=kw), "fprime"),
    ],
)
def test_other_routines_refuse_optimizer_kwargs_they_control(s, b, solve, key):
    with pytest.raises(ValueError, match=rf"`optimizer_kwargs` must not contain '{key}'"):
        solve(s, b, {key: None})


def test_optimizer_kwargs_must_be_a_mapping(x, a):
    with pytest.raises(TypeError, match=r"`optimizer_kwargs` must be a dict .* got list"):
        pmo.minimize(((x - a) ** 2).sum(), x, optimizer_kwargs=[("tol", 1e-3)])


def test_optimizer_kwargs_are_copied_not_kept_by_reference(x, a):
    kwargs = {"tol": 1e-12}
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, optimizer_kwargs=kwargs)
    kwargs["tol"] = "changed later"
    assert solver_node(x_star).op.options == {"tol": 1e-12}


# --- parameters become Op inputs -----------------------------------------------------------


def test_x_independent_subexpressions_become_parameter_inputs(x, a):
    exp_a = pt.exp(a)
    x_star, _ = pmo.minimize(((x - exp_a) ** 2).sum() + (x**4).sum(), x, x0=np.zeros(2))
    node = solver_node(x_star)
    assert parameters(x_star) == [exp_a]
    # inside the solver the parameter is a plain input: no Exp is recomputed per iteration
    inner_exps = [
        o for o in inner_ops(node.op) if isinstance(o, Elemwise) and isinstance(o.scalar_op, Exp)
    ]
    assert inner_exps == []
    # and the solution is still the minimizer: 2 (x - e^a) + 4 x^3 = 0
    a_val = np.array([0.1, -0.3])
    x_val = x_star.eval({a: a_val})
    np.testing.assert_allclose(2 * (x_val - np.exp(a_val)) + 4 * x_val**3, 0.0, atol=1e-5)


def test_x_dependent_parts_stay_in_the_inner_graph(x, a):
    x_star, _ = pmo.minimize(((pt.exp(x) - a) ** 2).sum(), x, x0=np.zeros(2))
    op = solver_node(x_star).op
    assert any(isinstance(o, Elemwise) and isinstance(o.scalar_op, Exp) for o in inner_ops(op))
    assert parameters(x_star) == [a]


def test_a_parameter_used_twice_is_one_input(x, a):
    x_star, _ = pmo.minimize(((x - a) ** 2).sum() + (a * x).sum(), x, x0=np.zeros(2))
    assert parameters(x_star) == [a]


def test_scalar_constants_stay_inside_the_inner_graph(s, b):
    x_star, _ = pmo.minimize((s - 3.0) ** 2 + b * s, s, x0=0.0)
    node = solver_node(x_star)
    assert node.inputs[1:] == [b]
    assert any(isinstance(v, Constant) for v in ancestors(node.op.problem.inner_outputs))
    np.testing.assert_allclose(x_star.eval({b: 2.0}), 2.0, rtol=1e-6)


def test_broadcast_constants_stay_inside_the_inner_graph(x, a):
    x_star, _ = pmo.minimize(((x - 3.0) ** 2).sum() + (a * x).sum(), x, x0=np.zeros(2))
    assert solver_node(x_star).inputs[1:] == [a]


def test_parameters_may_be_shared_variables(x):
    target = pytensor.shared(np.array([1.0, -2.0]), name="target")
    x_star, _ = pmo.minimize(((x - target) ** 2).sum(), x, x0=np.zeros(2))
    assert target in solver_node(x_star).inputs
    np.testing.assert_allclose(x_star.eval(), [1.0, -2.0], rtol=1e-6)
    target.set_value(np.array([3.0, 4.0]))
    np.testing.assert_allclose(x_star.eval(), [3.0, 4.0], rtol=1e-6)


# --- the initial guess ---------------------------------------------------------------------


@pytest.mark.parametrize("x0", [0.5, [0.5, 0.5], np.array([0.5, 0.5]), np.array([0, 1])], ids=str)
def test_x0_numbers_and_arrays_leave_x_out_of_the_graph(x, a, x0):
    x_star, success = pmo.minimize(((x - a) ** 2).sum(), x, x0=x0)
    assert list(explicit_graph_inputs([x_star, success])) == [a]
    assert solver_node(x_star).inputs[0].type.dtype == x.type.dtype
    fn = pytensor.function([a], [x_star, success])
    out, ok = fn([1.0, 2.0])
    assert ok
    np.testing.assert_allclose(out, [1.0, 2.0], rtol=1e-6)


def test_a_symbolic_x0_leaves_x_out_of_the_graph(x, a):
    start = pt.vector("start", shape=(2,))
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=2.0 * start)
    assert set(explicit_graph_inputs([x_star])) == {a, start}
    fn = pytensor.function([a, start], x_star)  # x is not needed to compile
    np.testing.assert_allclose(fn([1.0, 2.0], [5.0, 5.0]), [1.0, 2.0], rtol=1e-6)


def test_x0_none_keeps_x_as_the_initial_guess(x, a):
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x)
    assert set(explicit_graph_inputs([x_star])) == {a, x}
    assert solver_node(x_star).inputs[0] is x
    with pytest.raises(pytensor.graph.utils.MissingInputError):
        pytensor.function([a], x_star)
    fn = pytensor.function([x, a], x_star)
    np.testing.assert_allclose(fn([0.0, 0.0], [1.0, 2.0]), [1.0, 2.0], rtol=1e-6)


def test_the_initial_guess_is_used(s):
    # two minima, at -1 and 1: the solver goes to the one next to its start
    x_star, _ = pmo.minimize((s**2 - 1.0) ** 2, s)
    fn = pytensor.function([s], x_star)
    np.testing.assert_allclose(fn(-0.7), -1.0, rtol=1e-6)
    np.testing.assert_allclose(fn(0.7), 1.0, rtol=1e-6)


def test_x0_for_a_list_x(a):
    x, y = pt.vector("x", shape=(2,)), pt.scalar("y")
    objective = ((x - a) ** 2).sum() + (y - a.sum()) ** 2
    (x_star, y_star), success = pmo.minimize(objective, [x, y], x0=[[0.0, 0.0], 1.0])
    assert list(explicit_graph_inputs([x_star, y_star])) == [a]
    assert x_star.type.shape == (2,) and y_star.ndim == 0
    assert (x_star.name, y_star.name) == ("x_star", "y_star")
    fn = pytensor.function([a], [x_star, y_star, success])
    xv, yv, ok = fn([1.0, 2.0])
    assert ok
    np.testing.assert_allclose(xv, [1.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(yv, 3.0, rtol=1e-6)


def test_x0_none_for_a_list_x_keeps_every_x(a):
    x, y = pt.vector("x", shape=(2,)), pt.scalar("y")
    (x_star, y_star), _ = pmo.root([x - a, y - 1.0], [x, y])
    assert set(explicit_graph_inputs([x_star, y_star])) == {a, x, y}


def test_x0_must_give_one_guess_per_variable(a):
    x, y = pt.vector("x", shape=(2,)), pt.scalar("y")
    with pytest.raises(ValueError, match=r"`x0` must give one initial guess per variable in `x`"):
        pmo.minimize(((x - a) ** 2).sum() + y**2, [x, y], x0=[0.0])


def test_x0_must_not_have_more_dimensions_than_x(x, a):
    with pytest.raises(ValueError, match=r"`x0` for `x` must have at most 1 dimensions"):
        pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros((2, 2)))


@pytest.mark.parametrize("solve", ["minimize", "root", "fixed_point", "constrained"])
def test_x0_computed_from_x_is_refused_naming_x0(x, a, solve):
    """pt.zeros_like(x) reads x, which has no value before the solve (it failed at compile time
    with PyTensor's MissingInputError)."""
    x0 = pt.zeros_like(x)
    with pytest.raises(ValueError, match=r"`x0` for `x` is computed from `x` itself"):
        if solve == "minimize":
            pmo.minimize(((x - a) ** 2).sum(), x, x0=x0)
        elif solve == "root":
            pmo.root(x - a, x, x0=x0)
        elif solve == "fixed_point":
            pmo.fixed_point(0.5 * x + a, x, x0=x0)
        else:
            pmo.minimize(((x - a) ** 2).sum(), x, x0=x0, bounds=(0.0, None))


def test_a_scalar_x0_needs_a_static_shape(a):
    x = pt.vector("x")
    with pytest.raises(ValueError, match=r"when `x`'s shape is not known statically"):
        pmo.minimize(((x - a) ** 2).sum(), x, x0=0.0)
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(2))
    np.testing.assert_allclose(x_star.eval({a: [1.0, 2.0]}), [1.0, 2.0], rtol=1e-6)


@pytest.mark.parametrize(
    "solve",
    [
        lambda s, b: pmo.minimize_scalar((s - b) ** 2, s, bracket=(0.0, 1.0)),
        lambda s, b: pmo.minimize_scalar((s - b) ** 2, s, method="bounded", bounds=(0.0, 9.0)),
        lambda s, b: pmo.root_scalar(s - b, s, method="brentq", bracket=(0.0, 9.0)),
    ],
    ids=["brent-bracket", "bounded", "brentq"],
)
def test_scalar_routines_with_an_interval_leave_x_out_of_the_graph(s, b, solve):
    x_star, _ = solve(s, b)
    assert list(explicit_graph_inputs([x_star])) == [b]
    np.testing.assert_allclose(pytensor.function([b], x_star)(2.5), 2.5, rtol=1e-5)


# --- bad input named at build time (issue 17, defects 2 and 12) ------------------------------


def test_a_wrong_length_x0_names_x0_and_both_shapes(x, a):
    with pytest.raises(
        ValueError, match=r"`x0` for `x` must have `x`'s shape \(2,\); got shape \(3,\)"
    ):
        pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(3))


def test_a_complex_x0_is_refused(a):
    x = pt.vector("x")
    with pytest.raises(
        TypeError, match=r"`x0` for `x` must be real.*got dtype complex128.*np.real"
    ):
        pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(2) + 1j)


@pytest.mark.parametrize(
    ("solve", "argument"),
    [
        (lambda f, x: pmo.minimize(f, x), "objective"),
        (lambda f, x: pmo.minimize(f, x, bounds=(0.0, 1.0)), "objective"),
        (lambda f, x: pmo.root(f, x), "equations"),
        (lambda f, x: pmo.fixed_point(f, x), "update"),
    ],
)
def test_a_missing_objective_is_named(x, solve, argument):
    with pytest.raises(TypeError, match=rf"`{argument}` must be a PyTensor expression.*got None"):
        solve(None, x)


@pytest.mark.parametrize(
    ("solve", "argument"),
    [
        (lambda f, s: pmo.minimize_scalar(f, s), "objective"),
        (lambda f, s: pmo.root_scalar(f, s, x0=1.0), "equation"),
    ],
)
def test_a_python_function_as_objective_is_named(s, solve, argument):
    def loss(z):
        return (z - 1.0) ** 2

    with pytest.raises(
        TypeError, match=rf"`{argument}` must be a symbolic.*got `loss`.*`loss\(x\)`"
    ):
        solve(loss, s)


def test_a_top_level_scipy_option_is_refused_with_the_fix(x, a):
    # scipy.optimize.minimize has no `maxiter` argument: it raised TypeError at the first solve
    with pytest.raises(
        ValueError,
        match=r"takes 'tol', 'callback', 'options'.*got 'maxiter'.*"
        r"`optimizer_kwargs=\{'options': \{'maxiter': 5\}\}`",
    ):
        pmo.minimize(((x - a) ** 2).sum(), x, optimizer_kwargs={"maxiter": 5})


@pytest.mark.parametrize(
    ("solve", "routine", "method"),
    [
        (lambda f, x, kw: pmo.minimize(f.sum(), x, optimizer_kwargs=kw), "minimize", "BFGS"),
        (
            lambda f, x, kw: pmo.minimize(
                f.sum(), x, method="trust-exact", hess=True, optimizer_kwargs=kw
            ),
            "minimize",
            "trust-exact",
        ),
        (lambda f, x, kw: pmo.root(f, x, optimizer_kwargs=kw), "root", "hybr"),
        (lambda f, x, kw: pmo.root(f, x, method="krylov", optimizer_kwargs=kw), "root", "krylov"),
        (
            lambda f, x, kw: pmo.minimize(f.sum(), x, bounds=(0.0, 1.0), optimizer_kwargs=kw),
            "minimize",
            "L-BFGS-B",
        ),
    ],
)
def test_an_option_the_method_does_not_take_is_refused(x, a, solve, routine, method):
    # scipy only warns ("Unknown solver options") and ignores it
    with pytest.raises(
        ValueError,
        match=rf"options of method '{method}' of `scipy.optimize.{routine}`.*got 'maxiterr'",
    ):
        solve((x - a) ** 2, x, {"options": {"maxiterr": 5}})


def test_the_options_a_method_takes_are_accepted(x, a):
    # every documented option of the method passes the check (the test of the check itself)
    for method, options in [
        ("BFGS", {"gtol": 1e-8, "maxiter": 50, "norm": 2.0}),
        ("trust-ncg", {"gtol": 1e-8, "initial_trust_radius": 0.5}),
        ("Nelder-Mead", {"xatol": 1e-8, "maxfev": 500}),
    ]:
        pmo.minimize(((x - a) ** 2).sum(), x, method=method, optimizer_kwargs={"options": options})
    pmo.root(x - a, x, method="broyden1", optimizer_kwargs={"options": {"fatol": 1e-10}})
    pmo.root(x - a, x, method="lm", optimizer_kwargs={"tol": 1e-10, "options": {"ftol": 1e-10}})


def _root_scalar_with(optimizer_kwargs):
    s = pt.scalar("s")
    return pmo.root_scalar(
        s - 1.0, s, method="brentq", bracket=(0.0, 2.0), optimizer_kwargs=optimizer_kwargs
    )


@pytest.mark.parametrize(
    ("solve", "argument"),
    [
        (
            lambda x, a: pmo.minimize(
                ((x - a) ** 2).sum(), x, optimizer_kwargs={"options": {"maxiter": 5.5}}
            ),
            r"optimizer_kwargs\['options'\]\['maxiter'\]",
        ),
        (
            lambda x, a: _root_scalar_with({"maxiter": 2.5}),
            r"optimizer_kwargs\['maxiter'\]",
        ),
        (lambda x, a: pmo.fixed_point(0.5 * x + a, x, max_iter=2.5), "max_iter"),
        (
            lambda x, a: pmo.minimize(
                ((x - a) ** 2).sum(), x, method="newton", optimizer_kwargs={"max_iter": 2.5}
            ),
            r"optimizer_kwargs\['max_iter'\]",
        ),
    ],
)
def test_a_non_integer_iteration_count_is_refused(x, a, solve, argument):
    with pytest.raises(ValueError, match=rf"`{argument}` .*integer.*got \d\.5"):
        solve(x, a)


@pytest.mark.parametrize(
    "solve",
    [
        lambda x, a: pmo.minimize(
            ((x - a) ** 2).sum(), x, x0=np.zeros(3), structure="block_diagonal", block_size=2
        ),
        lambda x, a: pmo.root(
            x - a, x, x0=np.zeros(3), method="newton", structure="block_diagonal", block_size=2
        ),
        lambda x, a: pmo.fixed_point(
            0.5 * x + a,
            x,
            x0=np.zeros(3),
            method="newton",
            structure="block_diagonal",
            block_size=2,
        ),
    ],
)
def test_a_block_size_that_does_not_divide_the_size_is_refused(solve):
    # x has no static shape: its size, 3, comes from x0
    x, a = pt.vector("x"), pt.vector("a")
    with pytest.raises(
        ValueError, match=r"`block_size` must divide.*block_size=2 for `x` of size 3"
    ):
        solve(x, a)


def test_fixed_point_refuses_an_update_of_another_static_shape():
    x = pt.vector("x")
    with pytest.raises(
        ValueError, match=r"`update` must be shaped like `x`; got shape \(2,\).*\(3,\)"
    ):
        pmo.fixed_point(pt.zeros(2) + 0.5 * x.sum(), x, x0=np.zeros(3))


def test_root_counts_the_unknowns_from_a_static_x0():
    x = pt.vector("x")
    with pytest.raises(ValueError, match="got 2 equations for 3 unknowns"):
        pmo.root(pt.stack([x[0] - 1.0, x[1] - 2.0]), x, x0=np.zeros(3))
