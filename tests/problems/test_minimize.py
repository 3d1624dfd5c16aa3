"""Values and implicit gradients of `pymc_optim.minimize`.

Every (method, problem) case checks x* against the closed form and against a direct call of
`scipy.optimize.minimize` with the same method and options, and the gradient of the loss
L = Σ w ⊙ x* against the closed-form gradient and against central finite differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from cases import (
    MINIMIZE_PROBLEMS,
    FlatProblem,
    by_name,
    check_gradient_closed_form,
    check_gradient_finite_differences,
    check_value,
    compiled_solve,
    numeric_x0,
)
from numpy.testing import assert_allclose
from pytensor.gradient import DisconnectedInputError, hessian
from scipy import optimize

import pymc_optim as pmo

#: Methods that scipy gives a Hessian-vector product when `hess=False` (documented by `minimize`).
HESSP_METHODS = {"Newton-CG", "trust-ncg", "trust-krylov", "trust-constr"}
DERIVATIVE_FREE = {"Nelder-Mead", "Powell", "COBYLA", "COBYQA"}


@dataclass(frozen=True)
class Case:
    """A solver configuration.

    `x_tol` is the absolute accuracy of x* that its stopping rule delivers on these problems
    (measured, with margin): values are compared to it, and gradients, which the implicit rule
    evaluates at the returned x*, to a few times it.
    """

    method: str
    optimizer_kwargs: dict
    x_tol: float
    hess: bool = False
    structure: str = "dense"
    problems: tuple[str, ...] = ()
    id: str = field(default="")

    @property
    def label(self) -> str:
        return self.id or self.method

    def solve(self, built):
        return pmo.minimize(
            built.output,
            built.x,
            x0=built.x0,
            method=self.method,
            hess=self.hess,
            structure=self.structure,
            optimizer_kwargs=self.optimizer_kwargs,
        )

    @property
    def scipy_case(self) -> Case:
        """The scipy call to compare with: the same one, or exact-Hessian trust-exact for the
        package's graph-native "newton"."""
        if self.method == "newton":
            return Case("trust-exact", {"options": {"gtol": 1e-12}}, self.x_tol, hess=True)
        return self


# gtol is the solvers' bound on ‖∇f(x̂)‖∞; the Hessians here have eigenvalues ≥ ~0.3, so
# ‖x̂ − x*‖ ≲ 3·gtol. BFGS gets 1e-9: below that its line search reports "precision loss"
# (success=False, in scipy itself) on matrix_x, although x̂ is then within 1e-9 of x*; matrix_x
# is left to the other methods for that reason.
BFGS = Case(
    "BFGS",
    {"options": {"gtol": 1e-9}},
    3e-9,
    problems=tuple(p.name for p in MINIMIZE_PROBLEMS if p.name != "matrix_x"),
)
# Every other method on one or two problems (compilation dominates the run time), chosen so that
# the ways of passing second derivatives meet a list `x` and a matrix `x`.
CASES = [
    BFGS,
    Case("L-BFGS-B", {"options": {"gtol": 1e-11, "ftol": 1e-15}}, 1e-8, problems=("rosenbrock",)),
    Case("CG", {"options": {"gtol": 1e-11}}, 1e-9, problems=("matrix_x",)),
    Case(
        "Newton-CG",
        {"options": {"xtol": 1e-12}},
        1e-10,
        problems=("two_variables",),
        id="Newton-CG-hessp",
    ),
    Case(
        "Newton-CG",
        {"options": {"xtol": 1e-12}},
        1e-10,
        hess=True,
        problems=("vector_quadratic",),
        id="Newton-CG-hess",
    ),
    Case("trust-ncg", {"options": {"gtol": 1e-11}}, 1e-10, problems=("rosenbrock",)),
    Case("trust-krylov", {"options": {"gtol": 1e-11}}, 1e-10, problems=("two_variables",)),
    Case("trust-exact", {"options": {"gtol": 1e-11}}, 1e-10, hess=True, problems=("matrix_x",)),
    # dogleg needs a positive definite Hessian at every iterate: convex problems only.
    Case("dogleg", {"options": {"gtol": 1e-11}}, 1e-10, hess=True, problems=("vector_quadratic",)),
    Case(
        "trust-constr",
        {"options": {"gtol": 1e-11, "xtol": 1e-14}},
        1e-10,
        problems=("rosenbrock",),
        id="trust-constr-hessp",
    ),
    Case(
        "trust-constr",
        {"options": {"gtol": 1e-11, "xtol": 1e-14}},
        1e-10,
        hess=True,
        problems=("two_variables",),
        id="trust-constr-hess",
    ),
    # SLSQP stops on the change in f (ftol); at a quadratic minimum that leaves x̂ ~1e-8 away.
    Case("SLSQP", {"options": {"ftol": 1e-15}}, 1e-7, problems=("vector_quadratic",)),
    Case(
        "TNC",
        {"options": {"gtol": 1e-12, "xtol": 1e-14, "ftol": 0.0}},
        1e-8,
        problems=("two_variables",),
    ),
    # Derivative-free: x̂ is only as good as the simplex / trust radius allows (~1e-8 here);
    # the gradient is still the implicit one, exact up to that error in x̂.
    Case(
        "Nelder-Mead",
        {"options": {"xatol": 1e-10, "fatol": 1e-14, "maxiter": 10_000}},
        1e-7,
        problems=("rosenbrock",),
    ),
    Case("Powell", {"options": {"xtol": 1e-10, "ftol": 1e-14}}, 1e-7, problems=("two_variables",)),
    Case("COBYLA", {"options": {"tol": 1e-10, "maxiter": 10_000}}, 1e-7, problems=("matrix_x",)),
    Case("COBYQA", {"options": {"final_tr_radius": 1e-10}}, 1e-7, problems=("vector_quadratic",)),
    # The package's graph-native Newton: stops on max|∇f| ≤ tol, converging quadratically.
    Case("newton", {"tol": 1e-12}, 1e-11, problems=("two_variables", "rosenbrock")),
    # A diagonal Hessian declared as such: the pullback divides by diag(A) instead of solving.
    # Each element of x enters its own term in both problems.
    Case(
        "BFGS",
        {"options": {"gtol": 1e-9}},
        3e-9,
        structure="diagonal",
        problems=("integer_parameter", "shared_parameter"),
        id="BFGS-diagonal",
    ),
]

PARAMS = [
    pytest.param(case, by_name(MINIMIZE_PROBLEMS, name), id=f"{case.label}-{name}")
    for case in CASES
    for name in case.problems
]
assert all(p.values[1].convex for p in PARAMS if p.values[0].method == "dogleg")
GRADIENT_PARAMS = [p for p in PARAMS if p.values[0].method not in DERIVATIVE_FREE]


def solved(case: Case, problem):
    return compiled_solve(("minimize", case.label), problem, case.solve)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_closed_form(case, problem):
    check_value(solved(case, problem), atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_value_matches_direct_scipy_call(case, problem):
    # Same method, options, objective and start: the two agree within the solver's accuracy
    # (measured: identical to the last bit for most methods, 8e-9 apart for COBYQA).
    c = solved(case, problem)
    x_star, _, _ = c()
    res = _scipy_minimize(case.scipy_case, problem)
    assert res.success
    for got, expected in zip(x_star, _REFERENCES[problem.name].flat.unpack(res.x), strict=True):
        assert_allclose(got, expected, rtol=0, atol=case.x_tol)


@pytest.mark.parametrize(("case", "problem"), PARAMS)
def test_gradient_matches_closed_form(case, problem):
    # The rule is exact at x*; evaluated at x̂ its error is ≲ (a few)·‖x̂ − x*‖ on these problems.
    check_gradient_closed_form(solved(case, problem), atol=10 * case.x_tol)


@pytest.mark.parametrize(("case", "problem"), GRADIENT_PARAMS)
def test_gradient_matches_finite_differences(case, problem):
    # Step 1e-4 on O(1) parameters: the central-difference truncation h²·|L'''|/6 is ≲ 1e-8
    # (7e-9 measured on matrix_x, where x* is a rational function of S). The solver's error in x̂
    # is smooth in θ along the same iterate path, so it cancels between the ±h solves to far
    # below x_tol/h (measured ≤ 1e-8; 5e-8 for SLSQP, whose x_tol is 1e-7). Derivative-free
    # methods are left out: their x̂ is too coarse for differences (their gradients are checked
    # against the closed form above).
    check_gradient_finite_differences(solved(case, problem), step=1e-4, atol=max(2e-8, case.x_tol))


# --------------------------------------------------------------------------------------------
# graph edge cases
# --------------------------------------------------------------------------------------------


def test_parameter_outside_the_x_dependent_part_has_exactly_zero_gradient():
    problem = by_name(MINIMIZE_PROBLEMS, "disconnected")
    _, _, grads = solved(BFGS, problem)()
    # d enters only through d², added to the objective: ∂(∇ₓf)/∂d is structurally zero.
    assert grads["d"] == 0.0
    # e scales a term whose x-gradient vanishes at x*: zero up to the solver's accuracy.
    assert abs(grads["e"]) < 1e-9


def test_integer_parameters_are_not_differentiable():
    problem = by_name(MINIMIZE_PROBLEMS, "integer_parameter")
    built = problem.build()
    x_star, _ = BFGS.solve(built)
    with pytest.raises(DisconnectedInputError):
        pt.grad(x_star.sum(), built.params["k"])
    g_k, g_perm = pt.grad(
        x_star.sum(), [built.params["k"], built.params["perm"]], disconnected_inputs="ignore"
    )
    values = [problem.values[n] for n in built.params]
    fn = pytensor.function(list(built.params.values()), [g_k, g_perm], on_unused_input="ignore")
    assert [float(np.max(np.abs(g))) for g in fn(*values)] == [0.0, 0.0]


def test_initial_guess_expression_does_not_enter_the_gradient():
    # The shared_parameter problem starts from x0 = a/2; the gradient must be the implicit one only
    # (compared with the closed form in test_gradient_matches_closed_form), and x0 is not an
    # input the solution is differentiated through.
    problem = by_name(MINIMIZE_PROBLEMS, "shared_parameter")
    built = problem.build()
    x_star, _ = BFGS.solve(built)
    x0_input = x_star.owner.inputs[0]
    assert built.params["a"] in pytensor.graph.ancestors([x0_input])
    assert not any(x_star.owner.op.connection_pattern(x_star.owner)[0])


def test_parameter_used_alone_and_inside_a_broadcast_constant_expression():
    x, a = pt.vector("x", shape=(2,)), pt.vector("a", shape=(2,))
    x_star, _ = pmo.minimize(pt.sum((x - 2 * a) ** 2 + a * x), x, x0=[0.0, 0.0])
    # ∇ₓf = 2(x − 2a) + a = 0  ⇒  x* = 1.5a.
    assert_allclose(x_star.eval({a: [1.0, 2.0]}), [1.5, 3.0], atol=1e-6)


def test_newton_reaches_a_tight_tolerance_on_a_nonzero_minimum():
    # Regression: the Armijo test f(x + d) ≤ f(x) + 1e-4·gᵀd cannot see the last step's decrease
    # (~g²/2h ≈ 1e-20) below the rounding of f ≈ 0.2; the solve must still report success (it
    # once halved the step 30 times and failed with |f'(x̂)| ≈ 5e-10 > tol = 1e-10).
    x, a = pt.scalar("x"), pt.scalar("a")
    x_star, success = pmo.minimize(
        pt.exp(x) - a * x, x, x0=0.0, method="newton", optimizer_kwargs={"tol": 1e-10}
    )
    fn = pytensor.function([a], [x_star, success])
    for a_value in np.linspace(2.4, 2.6, 101):  # a quarter of these once failed
        x_value, success_value = fn(a_value)
        assert success_value, a_value
        assert_allclose(x_value, np.log(a_value), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# the direct scipy reference
# --------------------------------------------------------------------------------------------


class _Reference:
    """The problem's objective on one flat vector z, and its derivatives, compiled on first use."""

    def __init__(self, problem):
        self.problem = problem
        self.flat = FlatProblem(problem.build())
        self.f = self.flat.rewrite(self.flat.built.output)
        self.g = pt.grad(self.f, self.flat.z)

    @cached_property
    def value(self):
        return self.flat.compile(self.f)

    @cached_property
    def value_and_grad(self):
        return self.flat.compile([self.f, self.g])

    @cached_property
    def hess(self):
        return self.flat.compile(hessian(self.f, self.flat.z))

    @cached_property
    def hessp(self):
        p = self.flat.z.type("p")
        return self.flat.compile(pt.grad((self.g * p).sum(), self.flat.z), [p])


_REFERENCES: dict[str, _Reference] = {}


def _scipy_minimize(case: Case, problem):
    """scipy.optimize.minimize on the same objective, written on one flat vector."""
    if problem.name not in _REFERENCES:
        _REFERENCES[problem.name] = _Reference(problem)
    ref = _REFERENCES[problem.name]
    values = problem.values
    z0 = ref.flat.pack(numeric_x0(ref.flat.built, values))
    kwargs = {}
    if case.method in DERIVATIVE_FREE:

        def fun(z):
            return float(ref.value(values, z))
    else:
        kwargs["jac"] = True

        def fun(z):
            f, g = ref.value_and_grad(values, z)
            return float(f), g

        if case.hess:
            kwargs["hess"] = lambda z: ref.hess(values, z)
        elif case.method in HESSP_METHODS:
            kwargs["hessp"] = lambda z, p: ref.hessp(values, z, p)
    return optimize.minimize(fun, z0, method=case.method, **kwargs, **case.optimizer_kwargs)


# --- a failed solve inside a sampled model ------------------------------------------------

INVESTOR_MU = np.array([0.08, 0.06, 0.05, 0.03])
INVESTOR_SD = np.array([0.2, 0.15, 0.1, 0.05])


def mean_variance_investor():
    """Written the natural way: unshaped `w`, a penalty for the budget, default BFGS."""
    with pm.Model() as model:
        gamma = pm.LogNormal("gamma", 1.0, 1.0)
        w = pt.vector("w")
        utility_loss = -(w @ INVESTOR_MU) + 0.5 * gamma * ((w * INVESTOR_SD) ** 2).sum()
        w_star, success = pmo.minimize(
            utility_loss + 100.0 * (w.sum() - 1.0) ** 2, w, x0=np.full(4, 0.25)
        )
        pm.Potential("solved", pt.switch(success, 0.0, -np.inf))
        pm.Normal("portfolio_return", (w_star * INVESTOR_MU).sum(), 0.01, observed=0.06)
    return model


def test_a_failed_solve_in_a_model_gives_minus_inf_and_a_gradient_of_the_right_shape():
    # At log γ = -40 the solve fails with a NaN Hessian: logp is -inf and the gradient keeps
    # the value's shape (it crashed with a DimShuffle squeeze error).
    fn = mean_variance_investor().logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    logp, dlogp = fn(np.array([-40.0]))
    assert logp == -np.inf
    assert dlogp.shape == (1,)
    logp, dlogp = fn(np.array([1.0]))
    assert np.isfinite(logp) and np.isfinite(dlogp).all()


@pytest.mark.slow
def test_sampling_the_mean_variance_investor_rejects_failed_solves_and_completes():
    # Early tuning visits extreme risk aversions where BFGS fails: those points are rejected
    # (divergences) instead of stopping the sampler.
    with mean_variance_investor():
        idata = pm.sample(draws=100, tune=100, chains=2, cores=2, random_seed=1, progressbar=False)
    assert idata.posterior["gamma"].shape == (2, 100)
    assert np.isfinite(idata.posterior["gamma"]).all()


@pytest.mark.parametrize("method", ["BFGS", "CG", "L-BFGS-B"])
def test_a_stationary_point_that_is_not_a_minimum_is_not_a_success(method):
    # ((x² − 1)²) has a maximum at 0 in each coordinate: started there, the gradient vanishes
    # and scipy reports success; the Hessian at x*, −4I, says otherwise
    x, c = pt.vector("x"), pt.scalar("c")
    x_star, success = pmo.minimize((c * (x**2 - 1) ** 2).sum(), x, x0=np.zeros(2), method=method)
    fn = pytensor.function([c], [x_star, success])
    x_value, ok = fn(1.0)
    assert_allclose(x_value, 0.0, atol=1e-12)
    assert not ok
    # a genuine minimum from a regular start still succeeds
    x_star, success = pmo.minimize(
        (c * (x**2 - 1) ** 2).sum(), x, x0=np.full(2, 0.5), method=method
    )
    x_value, ok = pytensor.function([c], [x_star, success])(1.0)
    assert ok
    assert_allclose(np.abs(x_value), 1.0, rtol=1e-4)


@pytest.mark.parametrize("method", ["BFGS", "L-BFGS-B"])
def test_a_minimum_with_a_flat_direction_is_not_a_success(method):
    # (x0 − c)² + (x1 − c)² − 2 (x0 − c)(x1 − c) = (x0 − x1)²: every point with x0 = x1 is a
    # minimum, the Hessian [[2, −2], [−2, 2]] is singular and x* has no implicit derivative
    # (its gradient would be NaN): a failure the sampler counts, not a success with a NaN
    # gradient. The same objective with the cross term halved is a strict minimum.
    x, c = pt.vector("x"), pt.scalar("c")
    for cross, strict in ((2.0, False), (1.0, True)):
        d = x - c
        objective = (d**2).sum() - cross * d[0] * d[1]
        x_star, success = pmo.minimize(objective, x, x0=np.array([0.3, -0.2]), method=method)
        x_value, ok = pytensor.function([c], [x_star, success])(0.5)
        assert bool(ok) is strict
        if strict:
            assert_allclose(x_value, 0.5, atol=1e-6)
        else:
            assert_allclose(x_value[0], x_value[1], atol=1e-6)


def test_a_quartic_minimum_still_succeeds():
    # x⁴ has a singular Hessian at its minimum 0, but BFGS stops at |x| ~ 1e-2 (gtol 1e-5), where
    # the curvature 12x² ~ 1e-3 is far above the check's margin: the solve is a success.
    x, c = pt.vector("x"), pt.scalar("c")
    x_star, success = pmo.minimize(((x - c) ** 4).sum(), x, x0=np.array([1.0]))
    x_value, ok = pytensor.function([c], [x_star, success])(0.2)
    assert ok
    assert_allclose(x_value, 0.2, atol=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("n", [200, 300, 3000])
def test_a_scipy_method_on_a_chain_coupled_objective_solves_with_the_default_structure(n):
    """structure="auto" picks a sparse Hessian from n = 256 on; scipy's curvature test at x*
    then takes H on its pattern (it read a matrix and turned the solution into NaN)."""
    x, a = pt.vector("x"), pt.vector("a")
    objective = ((x - a) ** 2).sum() + ((x[1:] - x[:-1]) ** 2).sum()
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(n), method="BFGS")
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star[0], a)])
    a_val = np.sin(np.arange(n))
    got, ok, gradient = fn(a_val)
    # the stationarity condition by hand: (I + L) x = a, L the path graph's Laplacian
    L = np.diag(np.r_[1.0, 2.0 * np.ones(n - 2), 1.0]) - np.eye(n, k=1) - np.eye(n, k=-1)
    H = np.eye(n) + L
    assert ok
    assert_allclose(got, np.linalg.solve(H, a_val), atol=1e-4)  # BFGS's gtol 1e-5 on 2Hx − 2a
    assert_allclose(gradient, np.linalg.solve(H, np.eye(n)[0]), atol=1e-10)  # ∂x₀/∂a = H⁻¹e₀
