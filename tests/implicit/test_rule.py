"""The shared implicit-function-theorem rule, across solvers.

Second derivatives of x*(θ) (the rule differentiated again), vectorized solves and their
gradients, gradients with respect to parameters of several shapes at once, and a cross-check
against the installed upstream Ops of `pytensor.tensor.optimize`. The reference solutions and
gradients themselves are checked first, against central differences of the closed forms.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from cases import (
    MINIMIZE_PROBLEMS,
    MINIMIZE_SCALAR_PROBLEMS,
    ROOT_PROBLEMS,
    ROOT_SCALAR_PROBLEMS,
    as_list,
    by_name,
    central_difference,
    loss_weights,
    numeric_x0,
    unlist,
    weighted_loss,
)
from numpy.testing import assert_allclose
from pytensor.gradient import hessian
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor import optimize as upstream

import pymc_optim as pmo

#: Tight settings shared by the tests below (accuracy of x* ≲ 1e-11 on these problems).
BFGS_KWARGS = {"options": {"gtol": 1e-10}}
HYBR_KWARGS = {"options": {"xtol": 1e-12}}
BRENT_KWARGS = {"tol": 1e-12}
BRENTQ_KWARGS = {"xtol": 1e-14}

ALL_PROBLEMS = [
    pytest.param(problem, id=f"{routine}-{problem.name}")
    for routine, problems in [
        ("minimize", MINIMIZE_PROBLEMS),
        ("root", ROOT_PROBLEMS),
        ("minimize_scalar", MINIMIZE_SCALAR_PROBLEMS),
        ("root_scalar", ROOT_SCALAR_PROBLEMS),
    ]
    for problem in problems
]


@pytest.mark.parametrize("problem", ALL_PROBLEMS)
def test_reference_gradients_match_differences_of_the_closed_forms(problem):
    # The references the solver tests rely on, checked on their own (numpy only, no solver):
    # the closed-form x*(θ) is smooth, so a step of 1e-6 leaves a truncation error ~1e-12 and a
    # rounding error ~eps/1e-6 ≈ 1e-10.
    values = problem.values
    solution = problem.solution(values)
    weights = loss_weights(solution)

    def loss(v):
        return sum(
            np.sum(w * x) for w, x in zip(weights, as_list(problem.solution(v)), strict=True)
        )

    expected = problem.vjp(values, unlist(weights, solution))
    for name in problem.float_names:
        fd = central_difference(loss, values, name, step=1e-6)
        assert_allclose(expected[name], fd, rtol=1e-7, atol=1e-9, err_msg=name)
    for name in problem.zero_gradient:
        assert np.all(expected[name] == 0)


# --------------------------------------------------------------------------------------------
# second derivatives
# --------------------------------------------------------------------------------------------


def _second_derivative_cases():
    """(id, solve(a) -> x*, a's value, closed-form d²x*/da²) for a scalar parameter a."""

    def minimize_exp(a):  # x* = log a
        x = pt.scalar("x")
        return pmo.minimize(pt.exp(x) - a * x, x, x0=0.0, optimizer_kwargs=BFGS_KWARGS)[0]

    def root_cubic(a):  # x* = a^(1/3)
        x = pt.scalar("x")
        return pmo.root(x**3 - a, x, x0=1.0, optimizer_kwargs=HYBR_KWARGS)[0]

    def minimize_scalar_cubic(a):  # x* = a^(1/3)
        x = pt.scalar("x")
        objective = (x**3 - a) ** 2
        return pmo.minimize_scalar(objective, x, bracket=(0.5, 2.5), optimizer_kwargs=BRENT_KWARGS)[
            0
        ]

    def root_scalar_arctanh(a):  # x* = arctanh a
        x = pt.scalar("x")
        equation = pt.tanh(x) - a
        return pmo.root_scalar(
            equation, x, method="brentq", bracket=(-2.0, 3.0), optimizer_kwargs=BRENTQ_KWARGS
        )[0]

    return [
        ("minimize", minimize_exp, 2.5, lambda a: -1 / a**2),
        ("root", root_cubic, 3.0, lambda a: -2 / 9 * a ** (-5 / 3)),
        ("minimize_scalar", minimize_scalar_cubic, 3.0, lambda a: -2 / 9 * a ** (-5 / 3)),
        ("root_scalar", root_scalar_arctanh, 0.6, lambda a: 2 * a / (1 - a**2) ** 2),
    ]


@pytest.mark.parametrize(
    ("solve", "a_value", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in _second_derivative_cases()],
)
def test_grad_of_grad_of_a_scalar_solution(solve, a_value, expected):
    a = pt.scalar("a")
    x_star = solve(a)
    first = pt.grad(x_star, a)
    second = pt.grad(first, a)
    fn = pytensor.function([a], [first, second])
    _, d2 = fn(a_value)
    assert_allclose(d2, expected(a_value), rtol=1e-7)
    # Central differences of the implicit first derivative, itself smooth in a: step 1e-4 gives a
    # truncation error h²·|x*''''|/6 ≲ 1e-8 and a solver noise ≲ 1e-11/1e-4 = 1e-7 at worst.
    h = 1e-4
    fd = (fn(a_value + h)[0] - fn(a_value - h)[0]) / (2 * h)
    assert_allclose(d2, fd, rtol=1e-6, atol=1e-8)


def test_hessian_of_a_vector_solution_with_respect_to_parameters_of_two_shapes():
    # x* = K⁻¹b with K = MMᵀ + sI, L = wᵀx*. With u = K⁻¹w:
    #   ∂²L/∂s² = 2 wᵀK⁻³b,  ∂²L/∂s∂b = −K⁻²w,  ∂²L/∂b² = 0 (dK/ds = I, K symmetric).
    problem = by_name(MINIMIZE_PROBLEMS, "vector_quadratic")
    built = problem.build()
    # trust-exact lands on x* to ~1e-16 here, so that differences of the first derivatives are
    # limited by truncation only
    x_star, _ = pmo.minimize(
        built.output,
        built.x,
        x0=built.x0,
        method="trust-exact",
        hess=True,
        optimizer_kwargs={"options": {"gtol": 1e-12}},
    )
    (w,) = loss_weights(problem.solution(problem.values))
    loss = weighted_loss(x_star, [w])
    s, b, M = (built.params[n] for n in ("s", "b", "M"))
    g_s, g_b = pt.grad(loss, [s, b])
    outputs = [
        pt.grad(g_s, s),  # grad of grad, 0-d
        pt.grad(g_s, b),  # grad of grad, vector
        hessian(loss, b),  # pytensor.gradient.hessian
        pt.grad(g_b.sum(), M),  # a mixed second derivative with a matrix parameter
    ]
    fn = pytensor.function([s, b, M], [g_s, g_b, *outputs])
    v = problem.values
    g_s_value, g_b_value, d_ss, d_sb, d_bb, d_bM = fn(v["s"], v["b"], v["M"])

    K = v["M"] @ v["M"].T + v["s"] * np.eye(3)
    Kinv = np.linalg.inv(K)
    assert_allclose(d_ss, 2 * w @ Kinv @ Kinv @ Kinv @ v["b"], rtol=1e-7)
    assert_allclose(d_sb, -Kinv @ Kinv @ w, rtol=1e-7, atol=1e-10)
    assert_allclose(d_bb, np.zeros((3, 3)), atol=1e-10)
    # ∂(1ᵀ∂L/∂b)/∂M = ∂(1ᵀK⁻¹w)/∂M = −(u₁(Mᵀu)ᵀ + u(Mᵀu₁)ᵀ), u = K⁻¹w, u₁ = K⁻¹1
    u, u1 = Kinv @ w, Kinv @ np.ones(3)
    expected_bM = -(np.outer(u1, v["M"].T @ u) + np.outer(u, v["M"].T @ u1))
    assert_allclose(d_bM, expected_bM, rtol=1e-7, atol=1e-10)

    # central differences of the first derivatives (each linear or smooth in s and b): step 1e-4
    def first(values):
        return fn(values["s"], values["b"], values["M"])[:2]

    h = 1e-4
    fd_ss = central_difference(lambda vv: float(first(vv)[0]), v, "s", h)
    fd_bb = np.stack(
        [central_difference(lambda vv, i=i: float(first(vv)[1][i]), v, "b", h) for i in range(3)]
    )
    assert_allclose(d_ss, fd_ss, rtol=1e-6, atol=1e-8)
    assert_allclose(d_bb, fd_bb, atol=1e-8)
    assert np.isfinite(g_s_value) and np.all(np.isfinite(g_b_value))


def test_hessian_of_a_root_with_a_nonlinear_diagonal_solution():
    # x* = arcsin(a) elementwise: ∂²(wᵀx*)/∂a² = diag(w·a/(1 − a²)^{3/2}).
    problem = by_name(ROOT_PROBLEMS, "arcsin")
    built = problem.build()
    x_star, _ = pmo.root(built.output, built.x, x0=built.x0, optimizer_kwargs=HYBR_KWARGS)
    (w,) = loss_weights(problem.solution(problem.values))
    a = built.params["a"]
    loss = weighted_loss(x_star, [w])
    fn = pytensor.function([a], [pt.grad(loss, a), hessian(loss, a)])
    a_value = problem.values["a"]
    _, H = fn(a_value)
    assert_allclose(H, np.diag(w * a_value / (1 - a_value**2) ** 1.5), rtol=1e-7, atol=1e-10)
    # step 1e-4: truncation h²·|x*''''|/6 ≲ 1e-8 for |a| ≤ 0.7
    fd = np.stack(
        [
            central_difference(lambda v, i=i: float(fn(v["a"])[0][i]), problem.values, "a", 1e-4)
            for i in range(4)
        ]
    )
    assert_allclose(H, fd, rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------------------------
# parameters of several shapes at once
# --------------------------------------------------------------------------------------------


def test_gradient_with_respect_to_all_parameters_at_once_equals_one_at_a_time():
    # s (0-d), b (vector), M (matrix) in one pt.grad call, and in three separate graphs.
    problem = by_name(MINIMIZE_PROBLEMS, "vector_quadratic")
    names = ["s", "b", "M"]
    values = [problem.values[n] for n in names]
    (w,) = loss_weights(problem.solution(problem.values))

    def build():
        built = problem.build()
        x_star, _ = pmo.minimize(built.output, built.x, x0=built.x0, optimizer_kwargs=BFGS_KWARGS)
        return built, weighted_loss(x_star, [w])

    built, loss = build()
    params = [built.params[n] for n in names]
    together = pytensor.function(params, pt.grad(loss, params))(*values)
    for i in range(len(names)):
        built, loss = build()
        params = [built.params[n] for n in names]
        alone = pytensor.function(params, pt.grad(loss, params[i]), on_unused_input="ignore")
        assert_allclose(together[i], alone(*values), rtol=1e-12, atol=1e-15)
    expected = problem.vjp(problem.values, w)
    for got, name in zip(together, names, strict=True):
        assert got.shape == np.shape(problem.values[name])
        assert_allclose(got, expected[name], rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------------------------
# vectorized (batched) solves
# --------------------------------------------------------------------------------------------

BATCH = 3


def _batch_values(values: dict, names, seed=1):
    """A leading batch of `BATCH` perturbed copies of the named parameters."""
    rng = np.random.default_rng(seed)
    return {
        n: np.stack(
            [values[n] + 0.1 * rng.standard_normal(np.shape(values[n])) for _ in range(BATCH)]
        )
        for n in names
    }


def _vectorized_cases():
    def minimize_case():
        problem = by_name(MINIMIZE_PROBLEMS, "vector_quadratic")
        built = problem.build()
        x_star, success = pmo.minimize(
            built.output,
            built.x,
            x0=built.x0,
            method="trust-exact",
            hess=True,
            optimizer_kwargs={"options": {"gtol": 1e-12}},
        )
        return problem, built, [x_star], success, ["s", "b"]  # M stays unbatched

    def root_case():
        problem = by_name(ROOT_PROBLEMS, "two_variables")
        built = problem.build()
        x_star, success = pmo.root(built.output, built.x, x0=built.x0, optimizer_kwargs=HYBR_KWARGS)
        return problem, built, x_star, success, ["c", "b"]

    def minimize_scalar_case():
        problem = by_name(MINIMIZE_SCALAR_PROBLEMS, "log_ratio")
        built = problem.build()
        x_star, success = pmo.minimize_scalar(
            built.output, built.x, bracket=problem.bracket, optimizer_kwargs=BRENT_KWARGS
        )
        return problem, built, [x_star], success, ["a"]  # b stays unbatched

    def root_scalar_case():
        problem = by_name(ROOT_SCALAR_PROBLEMS, "product")
        built = problem.build()
        x_star, success = pmo.root_scalar(
            built.output,
            built.x,
            method="brentq",
            bracket=problem.bracket,
            optimizer_kwargs=BRENTQ_KWARGS,
        )
        return problem, built, [x_star], success, ["a", "b"]

    return [
        pytest.param(minimize_case, id="minimize"),
        pytest.param(root_case, id="root-list-x"),
        pytest.param(minimize_scalar_case, id="minimize_scalar"),
        pytest.param(root_scalar_case, id="root_scalar"),
    ]


@pytest.mark.parametrize("make_case", _vectorized_cases())
def test_vectorized_solution_and_gradient_equal_solving_each_problem_alone(make_case):
    problem, built, x_stars, success, batched = make_case()
    float_names = problem.float_names
    weights = loss_weights(problem.solution(problem.values))
    loss = weighted_loss(x_stars, weights)
    grads = pt.grad(loss, [built.params[n] for n in float_names])
    outputs = [*x_stars, success, *grads]

    batch_vars = {
        n: pt.tensor(
            f"{n}_batch",
            shape=(BATCH, *built.params[n].type.shape),
            dtype=built.params[n].type.dtype,
        )
        for n in batched
    }
    vectorized = vectorize_graph(outputs, {built.params[n]: batch_vars[n] for n in batched})
    names = list(built.params)
    inputs = [batch_vars.get(n, built.params[n]) for n in names]
    batch_fn = pytensor.function(inputs, vectorized)
    single_fn = pytensor.function([built.params[n] for n in names], outputs)

    batch_values = _batch_values(problem.values, batched)
    got = batch_fn(*[batch_values.get(n, problem.values[n]) for n in names])
    n_x = len(x_stars)
    for out, var in zip(got, vectorized, strict=True):
        assert out.shape[0] == BATCH, var  # x*, success and every gradient get the batch axis
    for i in range(BATCH):
        values_i = {**problem.values, **{n: batch_values[n][i] for n in batched}}
        alone = single_fn(*[values_i[n] for n in names])
        assert bool(got[n_x][i]) and bool(alone[n_x])
        for g, s in zip(got, alone, strict=True):
            assert_allclose(g[i], s, rtol=1e-10, atol=1e-12)
        # and each batch member against the closed forms
        for g, expected in zip(got[:n_x], as_list(problem.solution(values_i)), strict=True):
            assert_allclose(g[i], expected, atol=1e-9)
        expected_grads = problem.vjp(values_i, unlist(weights, problem.solution(values_i)))
        for g, name in zip(got[n_x + 1 :], float_names, strict=True):
            assert_allclose(g[i], expected_grads[name], rtol=1e-7, atol=1e-8)


# --------------------------------------------------------------------------------------------
# the upstream Ops of pytensor.tensor.optimize
# --------------------------------------------------------------------------------------------


def _upstream_cases():
    """(problem, their solve, our solve) on problems where the upstream Ops work.

    The upstream Ops start from the runtime value of x (given the problems' x0 below). Left out:
    upstream `root` with a matrix x (its gradient has the wrong number of dimensions) or a list
    x, and upstream `root_scalar` with a bracketing method (it fails in perform); upstream
    `root_scalar` is run with Newton from x0 instead.
    """
    LM_KWARGS = {"options": {"xtol": 1e-13, "ftol": 1e-13}}

    def minimize_both(built, problem, ours):
        if ours:
            return pmo.minimize(built.output, built.x, x0=built.x0, optimizer_kwargs=BFGS_KWARGS)
        return upstream.minimize(built.output, built.x, optimizer_kwargs=BFGS_KWARGS)

    def root_both(method, kwargs):
        def solve(built, problem, ours):
            if ours:
                return pmo.root(
                    built.output, built.x, x0=built.x0, method=method, optimizer_kwargs=kwargs
                )
            return upstream.root(built.output, built.x, method=method, optimizer_kwargs=kwargs)

        return solve

    def minimize_scalar_both(built, problem, ours):
        if ours:
            return pmo.minimize_scalar(
                built.output, built.x, bracket=problem.bracket, optimizer_kwargs=BRENT_KWARGS
            )
        return upstream.minimize_scalar(
            built.output, built.x, bracket=problem.bracket, optimizer_kwargs=BRENT_KWARGS
        )

    def root_scalar_both(built, problem, ours):
        if ours:
            return pmo.root_scalar(
                built.output,
                built.x,
                method="brentq",
                bracket=problem.bracket,
                optimizer_kwargs=BRENTQ_KWARGS,
            )
        return upstream.root_scalar(
            built.output, built.x, method="newton", jac=True, optimizer_kwargs={"xtol": 1e-14}
        )

    return [
        pytest.param(by_name(MINIMIZE_PROBLEMS, "vector_quadratic"), minimize_both, id="minimize"),
        pytest.param(by_name(MINIMIZE_PROBLEMS, "rosenbrock"), minimize_both, id="minimize-2"),
        pytest.param(by_name(ROOT_PROBLEMS, "arcsin"), root_both("hybr", HYBR_KWARGS), id="root"),
        pytest.param(
            by_name(ROOT_PROBLEMS, "vector_linear"), root_both("lm", LM_KWARGS), id="root-2"
        ),
        pytest.param(
            by_name(MINIMIZE_SCALAR_PROBLEMS, "log_ratio"),
            minimize_scalar_both,
            id="minimize_scalar",
        ),
        pytest.param(by_name(ROOT_SCALAR_PROBLEMS, "product"), root_scalar_both, id="root_scalar"),
    ]


@pytest.mark.parametrize(("problem", "solve"), _upstream_cases())
def test_same_solution_and_gradients_as_the_upstream_ops(problem, solve):
    built = problem.build()
    weights = loss_weights(problem.solution(problem.values))
    names = problem.float_names
    params = [built.params[n] for n in names]
    outputs = []
    for ours in (False, True):
        x_star, success = solve(built, problem, ours)
        outputs += [*as_list(x_star), success, *pt.grad(weighted_loss(x_star, weights), params)]
    xs = as_list(built.x)
    fn = pytensor.function([*xs, *params], outputs, on_unused_input="ignore")
    x0s = numeric_x0(built, problem.values)  # upstream starts from the runtime x
    got = fn(*x0s, *[problem.values[n] for n in names])
    theirs, ours = got[: len(got) // 2], got[len(got) // 2 :]
    n_x = len(xs)
    assert theirs[n_x] and ours[n_x]
    for t, o in zip(theirs[:n_x], ours[:n_x], strict=True):
        assert_allclose(o, t, rtol=0, atol=1e-9)
    for t, o, name in zip(theirs[n_x + 1 :], ours[n_x + 1 :], names, strict=True):
        assert_allclose(o, t, rtol=1e-7, atol=1e-9, err_msg=name)


# --------------------------------------------------------------------------------------------
# the gradient of a failed solve
# --------------------------------------------------------------------------------------------


def _failed_solve_cases():
    # numba compiles the Newton loop (a minute with empty caches): left to the full suite
    slow = {"NUMBA": [pytest.mark.slow]}
    for mode in ("FAST_RUN", "FAST_COMPILE", "NUMBA"):
        yield pytest.param("BFGS", "dense", mode, id=f"BFGS-{mode}", marks=slow.get(mode, ()))
    for mode in ("FAST_RUN", "FAST_COMPILE", "NUMBA", "JAX"):
        yield pytest.param(
            "newton", "dense", mode, id=f"newton-dense-{mode}", marks=slow.get(mode, ())
        )
    yield pytest.param("newton", "block_diagonal", "FAST_RUN", id="newton-block_diagonal-FAST_RUN")


@pytest.mark.parametrize(("method", "structure", "mode"), list(_failed_solve_cases()))
def test_the_gradient_of_a_failed_solve_is_nan_shaped_like_the_parameter(method, structure, mode):
    # sqrt(b) is NaN for b < 0: the solve fails at a NaN iterate, A = ∇²f is NaN, and the
    # implicit solve must give NaN of the parameter's shape (4,), not of A's (4, 4).
    if mode == "JAX":
        pytest.importorskip("jax")
    x, a, b = pt.vector("x"), pt.vector("a"), pt.scalar("b")
    objective = pt.sqrt(b) * ((x - a) ** 2).sum() + (x**4).sum()
    block_size = 2 if structure == "block_diagonal" else None
    x_star, success = pmo.minimize(
        objective, x, x0=np.zeros(4), method=method, structure=structure, block_size=block_size
    )
    outputs = [success, *pt.grad(x_star.sum(), [a, b])]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*object mode.*")  # scipy's callbacks
        fn = pytensor.function([a, b], outputs, mode=mode)
        a_value = np.array([1.0, 2.0, -1.0, 0.5])
        ok, grad_a, grad_b = (np.asarray(v) for v in fn(a_value, -1.0))
        assert not ok
        assert grad_a.shape == (4,) and np.isnan(grad_a).all()
        assert grad_b.shape == () and np.isnan(grad_b)
        # the same compiled function still differentiates a good solve
        ok, grad_a, grad_b = (np.asarray(v) for v in fn(a_value, 1.0))
    assert ok
    assert grad_a.shape == (4,) and np.isfinite(grad_a).all() and np.isfinite(grad_b)
