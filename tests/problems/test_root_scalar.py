"""Values and implicit gradients of `pymc_optim.root_scalar`.

Every (method, problem) case checks x* against the closed form and against a direct
`scipy.optimize.root_scalar` call, and dx*/dθ (as the gradient of w·x*) against the closed form
and central finite differences. The bracket, even when it is an expression of a parameter, does
not enter the derivative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from cases import (
    ROOT_SCALAR_PROBLEMS,
    by_name,
    check_gradient_closed_form,
    check_gradient_finite_differences,
    check_value,
    compiled_solve,
    fast_function,
)
from numpy.testing import assert_allclose
from pytensor.gradient import DisconnectedInputError
from scipy import optimize

import pymc_optim as pmo

BRACKETING = ("brentq", "brenth", "bisect", "ridder", "toms748")

#: xtol=1e-14 with scipy's default rtol (4·eps): the bracketing methods stop with the root
#: bracketed within ~1e-14 (bisect takes ~50 halvings of an O(1) bracket for that).
BRACKET_KWARGS = {"xtol": 1e-14}
#: the open scipy methods converge (super)linearly; xtol bounds the last step.
OPEN_KWARGS = {"xtol": 1e-14}
#: "newton" is the package's graph-native Newton: it stops on |F(x̂)| ≤ tol, and with
#: |∂F/∂x| ≳ 0.3 on these problems that leaves |x̂ − x*| ≲ 3e-14 (quadratic convergence makes
#: it far smaller in practice).
NEWTON_KWARGS = {"tol": 1e-14}


@dataclass(frozen=True)
class Case:
    method: str
    optimizer_kwargs: dict
    x_tol: float
    problems: tuple[str, ...] = ()

    def solve(self, problem):
        def build_and_solve(built):
            if self.method in BRACKETING:
                return pmo.root_scalar(
                    built.output,
                    built.x,
                    method=self.method,
                    bracket=problem.bracket,
                    optimizer_kwargs=self.optimizer_kwargs,
                )
            return pmo.root_scalar(
                built.output,
                built.x,
                x0=built.x0,
                method=self.method,
                optimizer_kwargs=self.optimizer_kwargs,
            )

        return build_and_solve


ALL = tuple(p.name for p in ROOT_SCALAR_PROBLEMS)
CASES = [
    Case("brentq", BRACKET_KWARGS, 1e-13, problems=ALL),
    Case("brenth", BRACKET_KWARGS, 1e-13, problems=("arctanh",)),
    Case("bisect", BRACKET_KWARGS, 1e-13, problems=("cube_root",)),
    Case("ridder", BRACKET_KWARGS, 1e-13, problems=("product",)),
    Case("toms748", BRACKET_KWARGS, 1e-13, problems=("log",)),
    Case("newton", NEWTON_KWARGS, 1e-13, problems=("cube_root", "shared_parameter")),
    Case("halley", OPEN_KWARGS, 1e-13, problems=("arctanh",)),
    Case("secant", OPEN_KWARGS, 1e-13, problems=("log", "integer_parameter")),
]

PARAMS = [
    pytest.param(case, by_name(ROOT_SCALAR_PROBLEMS, name), id=f"{case.method}-{name}")
    for case in CASES
    for name in case.problems
]


def solved(case: Case, problem):
    return compiled_solve(("root_scalar", case.method), problem, case.solve(problem))


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_closed_form(case, problem):
    check_value(solved(case, problem), atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_direct_scipy_call(case, problem):
    c = solved(case, problem)
    (x_star,), _, _ = c()
    built = problem.build()
    inputs = [built.x, *built.params.values()]
    values = [problem.values[n] for n in built.params]
    f = fast_function(inputs, built.output)
    fprime = pt.grad(built.output, built.x)
    kwargs = {}
    if case.method in BRACKETING:
        kwargs["bracket"] = problem.bracket
    else:
        kwargs["x0"] = float(built.x0)
    if case.method in ("newton", "halley"):
        fprime_fn = fast_function(inputs, fprime)
        kwargs["fprime"] = lambda z: float(fprime_fn(z, *values))
    if case.method == "halley":
        fprime2_fn = fast_function(inputs, pt.grad(fprime, built.x))
        kwargs["fprime2"] = lambda z: float(fprime2_fn(z, *values))
    # the graph-native "newton" is compared with scipy's Newton from the same start
    options = OPEN_KWARGS if case.method == "newton" else case.optimizer_kwargs
    res = optimize.root_scalar(
        lambda z: float(f(z, *values)), method=case.method, **kwargs, **options
    )
    assert res.converged
    assert_allclose(x_star, res.root, rtol=0, atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_closed_form(case, problem):
    check_gradient_closed_form(solved(case, problem), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_finite_differences(case, problem):
    # Step 1e-4 on O(1) parameters: truncation h²·|x*'''|/6 ≲ 3e-8 (arctanh); the roots are exact to
    # ~1e-14, so the solver's noise is ~1e-10 of the difference quotient.
    check_gradient_finite_differences(solved(case, problem), step=1e-4, atol=2e-8)


# --------------------------------------------------------------------------------------------
# the bracket
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["brentq", "bisect"])
def test_bracket_depending_on_the_parameter_does_not_enter_the_gradient(method):
    # x³ − a over the bracket (0, a): x* = a^(1/3), dx*/da = 1/(3a^(2/3)), nothing from the
    # upper end of the bracket (the root is locally independent of it).
    x, a = pt.scalar("x"), pt.scalar("a")
    x_star, success = pmo.root_scalar(
        x**3 - a, x, method=method, bracket=(0.0, a), optimizer_kwargs=BRACKET_KWARGS
    )
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star, a)])
    for a_value in (3.0, 5.5):
        x_value, ok, grad = fn(a_value)
        assert ok
        assert_allclose(x_value, np.cbrt(a_value), rtol=1e-13)
        assert_allclose(grad, 1 / (3 * np.cbrt(a_value) ** 2), rtol=1e-12)


def test_gradient_with_respect_to_a_constant_bracket_is_disconnected():
    x, a, lo = pt.scalar("x"), pt.scalar("a"), pt.scalar("lo")
    x_star, _ = pmo.root_scalar(x**3 - a, x, method="brentq", bracket=(lo, 3.0))
    with pytest.raises(DisconnectedInputError):
        pt.grad(x_star, lo)


def test_integer_parameter_is_not_differentiable():
    problem = by_name(ROOT_SCALAR_PROBLEMS, "integer_parameter")
    built = problem.build()
    x_star, _ = CASES[0].solve(problem)(built)
    with pytest.raises(DisconnectedInputError):
        pt.grad(x_star, built.params["k"])


@pytest.mark.parametrize("method", ["bisect", "brentq", "ridder", "toms748"])
@pytest.mark.parametrize("where", ["bracket", "equation"])
def test_a_nan_at_a_bracket_end_gives_success_false(method, where):
    # scipy reports NaN iterations here: `perform` must not convert them to an integer
    s, c = pt.scalar("s"), pt.scalar("c")
    if where == "bracket":
        x_star, success = pmo.root_scalar(s - 1.0, s, method=method, bracket=(c, 3.0))
        value = np.nan
    else:  # sqrt is NaN at the lower end
        x_star, success = pmo.root_scalar(pt.sqrt(s) - c, s, method=method, bracket=(-1.0, 3.0))
        value = 1.0
    info = pmo.solution_info(x_star)
    ok, n_iterations = pytensor.function([c], [success, info.n_iterations])(value)
    assert not ok
    assert n_iterations == -1
