"""Values and implicit gradients of `pymc_optim.minimize_scalar`.

Interior minima: x* against the closed form and a direct `scipy.optimize.minimize_scalar` call,
the gradient against the closed form and central finite differences. Bounded minima sitting on a
bound: x* is the bound itself, and its derivative is that of the bound (0 for a constant bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytensor
import pytensor.tensor as pt
import pytest
from cases import (
    MINIMIZE_SCALAR_PROBLEMS,
    by_name,
    check_gradient_closed_form,
    check_gradient_finite_differences,
    check_value,
    compiled_solve,
    fast_function,
)
from numpy.testing import assert_allclose
from scipy import optimize

import pymc_optim as pmo


@dataclass(frozen=True)
class Case:
    """How the search interval is given (`interval`: "bracket", "x0" or "bounds").

    `x_tol` is the accuracy of x* on these problems. Their minimum value is 0, which lets brent
    and golden resolve x* to ~1e-13 with tol=1e-12 (a nonzero minimum value would limit them to
    √eps ≈ 1.5e-8). "bounded" always stops at √eps·|x| + xatol/3 from x*, whatever xatol.
    """

    method: str
    interval: str
    optimizer_kwargs: dict
    x_tol: float
    problems: tuple[str, ...] = ()
    id: str = field(default="")

    @property
    def label(self) -> str:
        return self.id or f"{self.method}-{self.interval}"

    def solve(self, problem):
        def build_and_solve(built):
            kwargs = {"optimizer_kwargs": self.optimizer_kwargs, "method": self.method}
            if self.interval == "bracket":
                kwargs["bracket"] = problem.bracket
            elif self.interval == "bounds":
                kwargs["bounds"] = problem.bracket
            else:
                kwargs["x0"] = built.x0
            return pmo.minimize_scalar(built.output, built.x, **kwargs)

        return build_and_solve

    def scipy_kwargs(self, problem) -> dict:
        """The same call for scipy (`minimize_scalar` documents x0 as the bracket (x0, x0 + 1))."""
        if self.interval == "bracket":
            return {"bracket": problem.bracket}
        if self.interval == "bounds":
            return {"bounds": problem.bracket}
        x0 = float(problem.build().x0)
        return {"bracket": (x0, x0 + 1.0)}


ALL = tuple(p.name for p in MINIMIZE_SCALAR_PROBLEMS)
CASES = [
    Case("brent", "bracket", {"tol": 1e-12}, 3e-11, problems=ALL),
    Case("brent", "x0", {"tol": 1e-12}, 3e-11, problems=("cube_root",)),
    Case("golden", "bracket", {"tol": 1e-12}, 3e-11, problems=("log_ratio", "product")),
    # interior minima of "bounded": x̂ within √eps·|x*| + xatol/3 ≈ 2e-8 of x* (guaranteed)
    Case("bounded", "bounds", {"options": {"xatol": 1e-10}}, 1e-7, problems=("cube_root",)),
    Case("golden", "x0", {"tol": 1e-12}, 3e-11, problems=("shared_parameter",)),
    # the package's graph-native Newton on f'(x) = 0 (|f'(x̂)| ≤ tol; compared with brent)
    Case("newton", "x0", {"tol": 1e-13}, 1e-12, problems=("log_ratio", "integer_parameter")),
]

PARAMS = [
    pytest.param(case, by_name(MINIMIZE_SCALAR_PROBLEMS, name), id=f"{case.label}-{name}")
    for case in CASES
    for name in case.problems
]


def solved(case: Case, problem):
    return compiled_solve(("minimize_scalar", case.label), problem, case.solve(problem))


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_closed_form(case, problem):
    check_value(solved(case, problem), atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_direct_scipy_call(case, problem):
    c = solved(case, problem)
    (x_star,), _, _ = c()
    built = problem.build()
    objective = fast_function([built.x, *built.params.values()], built.output)
    values = [problem.values[n] for n in built.params]
    if case.method == "newton":  # no scipy counterpart: brent from the same start
        method, optimizer_kwargs = "brent", {"tol": 1e-12}
    else:
        method, optimizer_kwargs = case.method, case.optimizer_kwargs
    res = optimize.minimize_scalar(
        lambda z: float(objective(z, *values)),
        method=method,
        **case.scipy_kwargs(problem),
        **optimizer_kwargs,
    )
    assert res.success
    assert_allclose(x_star, res.x, rtol=0, atol=max(case.x_tol, 3e-11))


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_closed_form(case, problem):
    # Exact at x*; at x̂ the error is ≲ (a few)·|x̂ − x*|.
    check_gradient_closed_form(solved(case, problem), atol=10 * case.x_tol, rtol=1e-7)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_finite_differences(case, problem):
    # Step 1e-4 (`Problem.fd_step` says where not): truncation h²·|x*'''|/6 ≲ 1e-8 on these O(1)
    # problems; the solver's noise is ≲ 1e-11/h = 1e-7 at worst and mostly cancels between the
    # ±h solves (measured ≤ 4e-9, also for "bounded", which lands within 3e-11 of x* here
    # because the minimum value is 0).
    check_gradient_finite_differences(solved(case, problem), step=problem.fd_step, atol=2e-8)


def test_parameter_outside_the_x_dependent_part_has_exactly_zero_gradient():
    case = CASES[0]
    _, _, grads = solved(case, by_name(MINIMIZE_SCALAR_PROBLEMS, "disconnected"))()
    # d enters only through d², added to the objective: ∂f'/∂d is structurally zero.
    assert grads["d"] == 0.0
    # e scales a term whose slope vanishes at x*: zero up to the solver's accuracy.
    assert abs(grads["e"]) < 10 * case.x_tol


# --------------------------------------------------------------------------------------------
# bounded minima on a bound
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnBound:
    """(x − a)² over [lower(c), upper(c)] (a symbolic interval), with closed-form x* and slopes."""

    name: str
    bounds: object  # c -> (lower, upper)
    a: float
    c: float
    x_star: float
    dx_da: float
    dx_dc: float


ON_BOUND = [
    # a = 2 beyond the upper bound 1: x* = 1 whatever a (and c is not in the graph)
    OnBound("constant-upper", lambda c: (0.0, 1.0), 2.0, 0.7, 1.0, dx_da=0, dx_dc=0),
    # a = −1 below the lower bound c − 1.5: x* = c − 1.5, dx*/dc = 1
    OnBound("lower-c-minus-1.5", lambda c: (c - 1.5, 5.0), -1.0, 0.7, -0.8, dx_da=0, dx_dc=1),
    # a = 2 beyond the upper bound c²: x* = c², dx*/dc = 2c
    OnBound("upper-c-squared", lambda c: (0.0, c**2), 2.0, 0.7, 0.49, dx_da=0, dx_dc=1.4),
]


def _bounded(bounds, optimizer_kwargs=None):
    x, a, c = pt.scalar("x"), pt.scalar("a"), pt.scalar("c")
    x_star, success = pmo.minimize_scalar(
        (x - a) ** 2, x, method="bounded", bounds=bounds(c), optimizer_kwargs=optimizer_kwargs
    )
    grads = pt.grad(x_star, [a, c], disconnected_inputs="ignore")
    return pytensor.function([a, c], [x_star, success, *grads], on_unused_input="ignore")


def _central_differences(fn, a, c, step):
    return [
        (fn(a + step, c)[0] - fn(a - step, c)[0]) / (2 * step),
        (fn(a, c + step)[0] - fn(a, c - step)[0]) / (2 * step),
    ]


@pytest.mark.parametrize("case", ON_BOUND, ids=lambda case: case.name)
def test_bounded_minimum_on_a_bound_has_the_bounds_derivative(case):
    fn = _bounded(case.bounds)  # default xatol (1e-5)
    x_star, success, dx_da, dx_dc = fn(case.a, case.c)
    assert success
    # returned at the bound itself (scipy stops a few xatol inside it)
    assert_allclose(x_star, case.x_star, rtol=1e-15)
    assert_allclose([dx_da, dx_dc], [case.dx_da, case.dx_dc], rtol=1e-12, atol=1e-15)
    # x*(a, c) is constant in a and linear or quadratic in c near these points, so central
    # differences are exact up to rounding; step 1e-3 keeps the minimum on the same bound.
    fd = _central_differences(fn, case.a, case.c, step=1e-3)
    assert_allclose(fd, [case.dx_da, case.dx_dc], rtol=1e-9, atol=1e-12)


def test_bounded_interior_minimum_ignores_a_symbolic_bound():
    # a = 0.3 inside [0, c²] = [0, 0.49]: dx*/da = 1 by the interior rule, dx*/dc = 0.
    fn = _bounded(lambda c: (0.0, c**2), {"options": {"xatol": 1e-10}})
    x_star, success, dx_da, dx_dc = fn(0.3, 0.7)
    assert success
    assert_allclose(x_star, 0.3, atol=1e-7)  # √eps·|x| + xatol/3 ≈ 5e-9
    # the rule at x̂: F = 2(x − a), so dx*/da = 1 exactly wherever it is evaluated
    assert_allclose([dx_da, dx_dc], [1.0, 0.0], rtol=1e-12, atol=1e-15)
    # x* = a is linear, so a large step (0.1, keeping a inside [0, c²]) costs no truncation
    # error and divides the ~5e-9 stopping noise of the two solves by 0.2.
    assert_allclose(_central_differences(fn, 0.3, 0.7, step=0.1), [1.0, 0.0], atol=1e-7)


def test_bounded_minimum_on_a_bound_with_a_tight_xatol():
    case = ON_BOUND[2]  # upper bound c², minimum beyond it
    fn = _bounded(case.bounds, {"options": {"xatol": 1e-10}})
    x_star, success, dx_da, dx_dc = fn(case.a, case.c)
    assert success
    assert_allclose(x_star, case.x_star, rtol=1e-15)
    assert_allclose([dx_da, dx_dc], [case.dx_da, case.dx_dc], rtol=1e-12, atol=1e-15)
