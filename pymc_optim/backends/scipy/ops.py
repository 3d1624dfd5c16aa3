"""The scipy-backed solver Ops: which inner functions each compiles, and how it calls scipy.

Each Op says what scipy needs from the inner graph (`numerical_functions`: values, gradients,
Jacobians, Hessian-vector products) and runs the scipy routine in `solve` through the callbacks of
:mod:`pymc_optim.backends.scipy.callbacks`. Differentiation is the shared implicit rule
(:class:`~pymc_optim.graph.solver_op.SolverOp`); the public functions of
:mod:`pymc_optim.problems` choose and build these Ops. Their constructors (and those of the
graph-native NewtonOp and FixedPointOp) are parallel: each stores its own solver's settings, which
is all they share.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import NullTypeGradError, grad
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.scipy import callbacks as _scipy
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.graph.status import SolverStatus
from pymc_optim.graph.trace import note
from pymc_optim.implicit import OptimalityCondition

__all__ = [
    "DERIVATIVE_FREE",
    "NEEDS_HESS",
    "NEEDS_JAC",
    "USES_HESS",
    "MinimizeOp",
    "MinimizeScalarOp",
    "RootOp",
    "RootScalarOp",
]

#: scipy.optimize.minimize methods that use no derivatives, need the gradient, need the Hessian,
#: or can use a Hessian (or a Hessian-vector product).
DERIVATIVE_FREE = {"Nelder-Mead", "Powell", "COBYLA", "COBYQA"}
NEEDS_JAC = {"Newton-CG", "dogleg", "trust-ncg", "trust-exact", "trust-krylov"}
NEEDS_HESS = {"dogleg", "trust-exact"}
USES_HESS = {"Newton-CG", "dogleg", "trust-ncg", "trust-exact", "trust-krylov", "trust-constr"}

#: scipy's default absolute tolerance on x for minimize_scalar(method="bounded").
_BOUNDED_XATOL = 1e-5
#: scipy's "bounded" keeps its iterates √eps·|x| + xatol/3 inside the interval; a minimum within
#: this many such margins of a bound, with the slope pointing outward, sits on the bound.
_ACTIVE_BOUND_MARGINS = 10
_SQRT_EPS = float(np.sqrt(np.finfo("float64").eps))
#: Curvature check at x*: λ_min(∇²f) > tol·max(1, max|∇²f|). A saddle or a maximum (λ_min < 0)
#: is not a minimum; a Hessian singular to √eps of its scale (a flat direction) leaves x* without
#: an implicit derivative (A = ∇²f cannot be solved with), so its gradient would be NaN: both are
#: failures, as they are for graph-native Newton's Cholesky. A minimum like x⁴'s, which BFGS
#: leaves at |x| ~ 1e-2 (gtol 1e-5), still has curvature ~1e-3 there and passes.
_CURVATURE_TOL = 1.5e-8


# Each Op keeps its options as attributes, one line each, as NewtonOp does.
class MinimizeOp(SolverOp):
    """x* = argminₓ f(x, θ) by :func:`scipy.optimize.minimize`; see :func:`minimize`."""

    __props__ = ("n_extras", "method", "jac", "hess", "options", "no_gradient")

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition | None,
        method: str,
        jac: bool,
        hess: bool,
        options,
        no_gradient: str | None = None,
    ):
        super().__init__(problem, condition=condition)
        _scipy.check_scipy_options("minimize", method, options)
        self.method = method
        self.jac = jac
        self.hess = hess
        self.options = options
        self.no_gradient = no_gradient

    @property
    def condition(self) -> OptimalityCondition:
        if self.no_gradient is not None:
            raise NotImplementedError(
                "The gradient of a `minimize` solution with respect to its parameters needs the "
                "objective's derivatives (the implicit function theorem differentiates "
                "∇ₓf(x*, θ) = 0), but the objective's gradient cannot be built "
                f"({self.no_gradient}). Keep this solution out of gradients (e.g. sample with a "
                "gradient-free step such as `pm.Slice`), or make the objective differentiable."
            )
        return super().condition

    @property
    def _gradients(self) -> list[TensorVariable]:
        return list(self.condition.residual)

    @property
    def value(self) -> TensorVariable:
        return self.problem.inner_outputs[0]

    @property
    def _uses_hessp(self) -> bool:
        return self.jac and not self.hess and self.method in USES_HESS - NEEDS_HESS

    def numerical_functions(self):
        if self.jac:
            fns = {"value_and_grad": ([], [self.value, *self._gradients])}
        else:
            fns = {"value": ([], [self.value])}
        if self.no_gradient is None:
            # ∇²f at x* in the structure's compact form, for the curvature check of `solve`;
            # without second derivatives (pt.prod's gradient has none) there is no check, and
            # the solution's own gradient says why it cannot be built (SolverOp.pullback)
            try:
                fns["curvature"] = ([], [self.condition.jacobian()])
            except NullTypeGradError:
                pass
        if self.hess:
            fns["hess"] = ([], [self.condition.jacobian_matrix()])
        if self._uses_hessp:
            # H(x)·p as the gradient of (∇f)·p: one extra reverse pass, no Hessian formed.
            ps = [x.type(f"p_{i}") for i, x in enumerate(self.problem.inner_xs)]
            gp = sum((g * p).sum() for g, p in zip(self._gradients, ps, strict=True))
            fns["hessp"] = (ps, grad(gp, self.problem.inner_xs, disconnected_inputs="ignore"))
        return fns

    def solve(self, fns, x0s, params, extras, state):
        x_stars, success, n_iterations, n_evaluations, status = _scipy.minimize(
            fns,
            x0s,
            params,
            method=self.method,
            use_jac=self.jac,
            use_hess=self.hess,
            use_hessp=self._uses_hessp,
            options=self.options,
        )
        if success and "curvature" in fns:
            hessian = fns["curvature"](*x_stars, *params)[0]
            if not _is_positive_definite(hessian, self.condition.structure):
                note(
                    "refused: the Hessian at x* is not positive definite (a saddle, a maximum, "
                    "or a flat direction without an implicit derivative)"
                )
                success, status = False, SolverStatus.NOT_POSITIVE_DEFINITE
        return x_stars, success, n_iterations, n_evaluations, status


class RootOp(SolverOp):
    """x* with F(x*, θ) = 0 by :func:`scipy.optimize.root`; see :func:`root`."""

    __props__ = ("n_extras", "method", "jac", "options")

    def __init__(
        self, problem: InnerProblem, *, condition: OptimalityCondition, method: str, jac, options
    ):
        super().__init__(problem, condition=condition)
        _scipy.check_scipy_options("root", method, options)
        self.method = method
        self.jac = jac
        self.options = options

    def numerical_functions(self):
        if self.jac:
            return {
                "equations_and_jac": (
                    [],
                    [*self.problem.inner_outputs, self.condition.jacobian_matrix()],
                )
            }
        return {"equations": ([], list(self.problem.inner_outputs))}

    def solve(self, fns, x0s, params, extras, state):
        return _scipy.root(
            fns, x0s, params, method=self.method, use_jac=self.jac, options=self.options
        )


class MinimizeScalarOp(SolverOp):
    """x* = argminₓ f(x, θ) for scalar x by :func:`scipy.optimize.minimize_scalar`."""

    __props__ = ("n_extras", "method", "options", "xatol")

    def __init__(
        self,
        problem: InnerProblem,
        *,
        method: str,
        n_bracket: int,
        inner_bounds: list[TensorVariable],
        options,
    ):
        super().__init__(problem, n_extras=n_bracket)
        _scipy.check_scipy_options("minimize_scalar", method, options)
        self.method = method
        self.inner_bounds = inner_bounds
        self.options = options
        xatol = options.get("options", {}).get("xatol", _BOUNDED_XATOL)
        self.xatol = xatol
        self._slope = grad(self.value, self.problem.inner_xs[0])
        self._condition = self._kkt_condition()

    @property
    def value(self) -> TensorVariable:
        return self.problem.inner_outputs[0]

    def _kkt_condition(self) -> OptimalityCondition:
        (x,) = self.problem.inner_xs
        residual = self._slope
        if self.inner_bounds:
            lower, upper = self.inner_bounds
            # KKT with the active bound fixed: its row becomes x - b(θ) = 0.
            on_lower = (x - lower <= self._bound_tol(lower)) & (self._slope > 0)
            on_upper = (upper - x <= self._bound_tol(upper)) & (self._slope < 0)
            residual = pt.switch(on_lower, x - lower, pt.switch(on_upper, x - upper, residual))
        return OptimalityCondition(
            self.problem.inner_xs, self.problem.inner_params, [residual], symmetric=True
        )

    def numerical_functions(self):
        return {"value": ([], [self.value]), "slope": ([], [self._slope])}

    def solve(self, fns, x0s, params, extras, state):
        (x0,) = x0s
        bracket = tuple(float(b) for b in extras) or None
        if bracket is None and self.method != "bounded":
            bracket = (float(x0), float(x0) + 1.0)
        bounds = tuple(float(b) for b in params[-2:]) if self.inner_bounds else None
        x_stars, success, nit, nfev, status = _scipy.minimize_scalar(
            fns,
            x0,
            params,
            method=self.method,
            bracket=bracket,
            bounds=bounds,
            options=self.options,
        )
        if bounds is not None and success:
            x_stars = [self._snap_to_bound(fns["slope"], x_stars[0], params, bounds)]
        return x_stars, success, nit, nfev, status

    def _bound_tol(self, bound):
        """How close to `bound` (a number or a variable) a minimum on it may be left by scipy."""
        return _ACTIVE_BOUND_MARGINS * (self.xatol / 3 + _SQRT_EPS * abs(bound))

    def _snap_to_bound(self, slope_fn, x, params, bounds):
        """Return exactly the bound when the minimum sits on it (see `condition`)."""
        lower, upper = bounds
        slope = float(slope_fn(x, *params)[0])
        if x - lower <= self._bound_tol(lower) and slope > 0:
            return np.asarray(lower, dtype=x.dtype)
        if upper - x <= self._bound_tol(upper) and slope < 0:
            return np.asarray(upper, dtype=x.dtype)
        return x


class RootScalarOp(SolverOp):
    """x* with F(x*, θ) = 0 for scalar x by :func:`scipy.optimize.root_scalar`."""

    __props__ = ("n_extras", "method", "options")

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition,
        method: str,
        n_bracket: int,
        options,
    ):
        super().__init__(problem, condition=condition, n_extras=n_bracket)
        _scipy.check_scipy_options("root_scalar", method, options)
        self.method = method
        self.options = options

    @property
    def value(self) -> TensorVariable:
        return abs(self.problem.inner_outputs[0])

    def numerical_functions(self):
        (equation,) = self.problem.inner_outputs
        fns = {"equation": ([], [equation])}
        if self.method == "halley":
            fprime = grad(equation, self.problem.inner_xs[0])
            fns["fprime"] = ([], [fprime])
            fns["fprime2"] = ([], [grad(fprime, self.problem.inner_xs[0])])
        return fns

    def solve(self, fns, x0s, params, extras, state):
        bracket = tuple(float(b) for b in extras) or None
        return _scipy.root_scalar(
            fns, x0s[0], params, method=self.method, bracket=bracket, options=self.options
        )


def _is_positive_definite(hessian: np.ndarray, structure) -> bool:
    """Whether the symmetric `hessian` (compact form of `structure`) is positive definite with
    margin _CURVATURE_TOL: the structure's factorization of H − τI succeeds (one O(n³), O(G b³),
    or sparse, pass)."""
    hessian = np.asarray(hessian, dtype="float64")
    if not np.all(np.isfinite(hessian)):
        return False
    tau = _CURVATURE_TOL * max(1.0, float(np.max(np.abs(hessian), initial=0.0)))
    return bool(np.all(structure.positive_definite_numpy(hessian, margin=tau)))
