"""The scipy-backed constrained Op: scipy's solve, then the active-set polish of the KKT point.

See :mod:`pymc_optim.problems.constrained` for the problem, the KKT rows and the degenerate cases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad, jacobian
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.packing import Packer
from pymc_optim.backends.scipy import callbacks as _scipy
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.graph.status import SolverStatus
from pymc_optim.implicit import OptimalityCondition

if TYPE_CHECKING:
    from pymc_optim.problems.constrained.kkt import KKT

__all__ = ["ConstrainedMinimizeOp"]

_SQRT_EPS = float(np.sqrt(np.finfo("float64").eps))
#: A constraint within this (relative) slack of its bound is a candidate for the active set. The
#: candidates are only the start of the active-set iteration, which releases or adds constraints
#: by the signs of their polished multipliers; 1e-6 is above scipy's default stopping margins
#: (SLSQP ftol 1e-6 acts on f, leaving active constraints satisfied to ~1e-10; trust-constr's
#: barrier leaves slacks ≲ 1e-8 / multiplier).
_CANDIDATE_SLACK = 1e-6
#: Polished multipliers (and slacks of inactive constraints) within √ε of zero, relative to
#: the scale of ∇f (and of x), are "zero": a constraint at its bound with a zero multiplier is
#: degenerate (see the module Notes). After polishing, multipliers are accurate to ~1e-12.
_DEGENERATE_TOL = _SQRT_EPS
#: Newton on a fixed active set converges quadratically from scipy's x̂; 30 steps is generous.
_MAX_POLISH_STEPS = 30
#: A polished KKT residual above this (relative) is not a KKT point: success=False.
_KKT_TOL = 1e-8
#: Releasing/adding one constraint per round, from scipy's nearly right active set.
_MAX_ACTIVE_SET_CHANGES = 50


class ConstrainedMinimizeOp(SolverOp):
    """x* = argmin f(x, θ) under bounds and constraints by :func:`scipy.optimize.minimize`.

    Outputs ``[x*, *multipliers, (ν), success, n_iterations, n_evaluations]``: the multipliers
    are controls of the KKT condition (see the module Notes), so that the shared implicit rule
    differentiates them together with x*.
    """

    __props__ = ("n_extras", "method", "options", "kinds", "n_bounds")

    def __init__(self, problem: InnerProblem, *, kkt: KKT, method: str, options):
        super().__init__(problem)
        self._kkt = kkt
        _scipy.check_scipy_options("minimize", method, options)
        self.method = method
        self.options = options

    @property
    def kkt(self) -> KKT:
        return self._kkt

    @property
    def kinds(self) -> tuple[str, ...]:
        """The constraints' kinds, in order (the KKT's rows)."""
        return tuple(self._kkt.kinds)

    @property
    def n_bounds(self) -> int:
        """2 with bounds on x (lower and upper inner parameters), 0 without."""
        return len(self._kkt.bounds)

    @property
    def condition(self) -> OptimalityCondition:
        return self._kkt.condition

    @property
    def value(self) -> TensorVariable:
        return self._kkt.objective

    def numerical_functions(self):
        kkt = self._kkt
        x = kkt.x
        fns = {"value_and_grad": ([], [kkt.objective, grad(kkt.objective, x)])}
        constraint_outputs = [c.ravel() for c in kkt.funs] + [
            jacobian(c.ravel(), x, vectorize=True, disconnected_inputs="ignore").reshape(
                (c.size, x.size)
            )
            for c in kkt.funs
        ]
        if kkt.funs:
            fns["constraints"] = ([], constraint_outputs)
        if kkt.bounds:
            fns["bounds"] = ([], [pt.broadcast_to(b, x.shape) for b in kkt.bounds])
        if self.method == "trust-constr":
            p = x.type("p")
            hp = grad((grad(kkt.objective, x) * p).sum(), x, disconnected_inputs="ignore")
            fns["hessp"] = ([p], [hp])
            # ∇²(vᵀc_k) with v passed in the multiplier inputs: scipy's constraint Hessians.
            fns["constraint_hessians"] = (
                [],
                [
                    jacobian(
                        grad((m * c).sum(), x).ravel(),
                        x,
                        vectorize=True,
                        disconnected_inputs="ignore",
                    ).reshape((x.size, x.size))
                    for m, c in zip(kkt.multipliers, kkt.funs, strict=True)
                ],
            )
        fns["kkt"] = kkt.fixed_set_system()
        return fns

    def solve(self, fns, x0s, params, extras, state):
        x0, zero_multipliers = x0s[0], list(x0s[1:])
        problem = _NumericalProblem(self._kkt, fns, x0, zero_multipliers, params)
        x_hat, success, nit, nfev, status = _scipy.minimize_constrained(
            problem, x0, method=self.method, options=self.options
        )
        if success:
            z, success = problem.polish(x_hat)
            status = SolverStatus.CONVERGED if success else SolverStatus.SOLVER_FAILED
        else:
            z = [problem.x(x_hat), *zero_multipliers]
        return z, success, nit, nfev, status


class _NumericalProblem:
    """The problem's numbers at given parameters, in flat float64 arrays, for scipy and the
    active-set polish."""

    def __init__(self, kkt: KKT, fns: dict, x0, zero_multipliers, params):
        self.kkt, self.fns, self.params = kkt, fns, params
        self.shape, self.dtype = np.shape(x0), np.asarray(x0).dtype
        self.zeros = zero_multipliers
        self.layout = Packer([np.empty(self.shape, self.dtype), *zero_multipliers])
        self.kinds = kkt.kinds
        self.sizes = [int(np.size(z)) for z in zero_multipliers[: len(kkt.kinds)]]
        self._cache = (None, None)
        if kkt.bounds:
            lo, hi = fns["bounds"](np.zeros(self.shape, self.dtype), *zero_multipliers, *params)
            self.lower, self.upper = np.ravel(lo).astype(float), np.ravel(hi).astype(float)
        else:
            self.lower = self.upper = None

    def x(self, z) -> np.ndarray:
        return np.asarray(z, dtype=self.dtype).reshape(self.shape)

    def value_and_grad(self, z):
        f, g = self.fns["value_and_grad"](self.x(z), *self.zeros, *self.params)
        return float(f), np.ravel(g).astype(float)

    def constraints(self, z):
        """Values and Jacobians of every constraint at z (cached for the last z)."""
        if self._cache[0] is None or not np.array_equal(self._cache[0], z):
            outs = self.fns["constraints"](self.x(z), *self.zeros, *self.params)
            k = len(self.kinds)
            self._cache = (np.array(z), (outs[:k], outs[k:]))
        return self._cache[1]

    def hessp(self, z, p):
        (hp,) = self.fns["hessp"](self.x(z), *self.zeros, self.x(p), *self.params)
        return np.ravel(hp)

    def constraint_hessian(self, k, z, v):
        multipliers = list(self.zeros)
        multipliers[k] = np.asarray(v, dtype=self.dtype).reshape(np.shape(self.zeros[k]))
        return self.fns["constraint_hessians"](self.x(z), *multipliers, *self.params)[k]

    # --- the active set and the polish ----------------------------------------------------------
    def polish(self, x_hat):
        """Identify the active set at scipy's x̂ and polish (x, multipliers) by Newton on the KKT
        rows; return ``(z, success)`` with z the Op's control outputs (module Notes)."""
        x = np.ravel(x_hat).astype(float)
        n = x.size
        values, jacs = self.constraints(x) if self.kinds else ([], [])
        ineq = [k for k, kind in enumerate(self.kinds) if kind == "ineq"]
        scale_x = 1.0 + np.max(np.abs(x), initial=0.0)
        active = {k: values[k] <= _CANDIDATE_SLACK * scale_x for k in ineq}
        at_lower = at_upper = np.zeros(n, dtype=bool)
        if self.lower is not None:
            at_lower = _near(x, self.lower, _CANDIDATE_SLACK)
            at_upper = _near(x, self.upper, _CANDIDATE_SLACK) & ~at_lower
        multipliers = self._least_squares_multipliers(x, jacs, active, at_lower, at_upper)
        for _ in range(_MAX_ACTIVE_SET_CHANGES):
            result = self._newton(x, multipliers, active, at_lower, at_upper)
            if result is None:
                return self._failed(x_hat)
            x, multipliers = result
            change = self._worst_violation(x, multipliers, active, at_lower, at_upper)
            if change is None:
                break
            kind, index = change
            if kind == "ineq":
                k, i = index
                active[k] = active[k].copy()
                active[k].flat[i] = not active[k].flat[i]
            elif kind == "lower":
                at_lower = at_lower.copy()
                at_lower[index] = not at_lower[index]
            else:
                at_upper = at_upper.copy()
                at_upper[index] = not at_upper[index]
        else:
            return self._failed(x_hat)
        return self._finish(x, multipliers, active, at_lower, at_upper)

    def _flags(self, active, at_lower, at_upper):
        flags = [np.asarray(active[k]).reshape(np.shape(self.zeros[k])) for k in sorted(active)]
        if self.lower is not None:
            flags += [at_lower.reshape(self.shape), at_upper.reshape(self.shape)]
        return flags

    def _unflatten(self, z):
        return self.layout.unpack(np.asarray(z, dtype=self.dtype))

    def _newton(self, x, multipliers, active, at_lower, at_upper):
        """Newton on the KKT rows with the active set fixed; None if it fails to converge."""
        flags = self._flags(active, at_lower, at_upper)
        z = np.concatenate([x, *(np.ravel(m) for m in multipliers)])
        best = np.inf
        for _ in range(_MAX_POLISH_STEPS):
            F, A = self.fns["kkt"](*self._unflatten(z), *flags, *self.params)
            size = np.max(np.abs(F), initial=0.0)
            if not np.isfinite(size):
                return None
            if size >= best / 2:  # no more quadratic progress: at rounding error
                break
            best = size
            try:
                z = z - np.linalg.solve(A, F)
            except np.linalg.LinAlgError:
                return None
        F, _ = self.fns["kkt"](*self._unflatten(z), *flags, *self.params)
        _, g = self.value_and_grad(z[: x.size])
        if np.max(np.abs(F), initial=0.0) > _KKT_TOL * (1 + np.max(np.abs(g), initial=0.0)):
            return None
        n = x.size
        return z[:n], [np.ravel(m) for m in self._unflatten(z)[1:]]

    def _least_squares_multipliers(self, x, jacs, active, at_lower, at_upper):
        """Multipliers from the stationarity rows ∇f = Σ Jᵀλ + ν on the candidate active set."""
        _, g = self.value_and_grad(x)
        columns, pieces = [], []
        for k, kind in enumerate(self.kinds):
            J = np.asarray(jacs[k])
            use = np.ones(J.shape[0], dtype=bool) if kind == "eq" else np.ravel(active[k])
            columns.append(J[use].T)
            pieces.append(use)
        if self.lower is not None:
            bound = at_lower | at_upper
            columns.append(np.eye(x.size)[:, bound])
            pieces.append(bound)
        if not pieces:
            return []
        design = np.concatenate(columns, axis=1)
        coef = np.linalg.lstsq(design, g, rcond=None)[0] if design.shape[1] else np.zeros(0)
        out, start = [], 0
        for use in pieces:
            m = np.zeros(use.size)
            m[use] = coef[start : start + use.sum()]
            start += use.sum()
            out.append(m)
        return out

    def _margins(self, x):
        """The tolerances at x that decide signs and feasibility (on the gradient's and x's
        scales), and the constraints' values there."""
        _, g = self.value_and_grad(x)
        dual_tol = _DEGENERATE_TOL * (1 + np.max(np.abs(g), initial=0.0))
        scale_x = 1.0 + np.max(np.abs(x), initial=0.0)
        values = self.constraints(x)[0] if self.kinds else []
        return dual_tol, scale_x, values

    def _worst_violation(self, x, multipliers, active, at_lower, at_upper):
        """The most violated sign or feasibility condition, as ``(kind, index)``, or None."""
        dual_tol, scale_x, values = self._margins(x)
        worst, change = 0.0, None
        for k, kind in enumerate(self.kinds):
            if kind == "eq":
                continue
            m, d, on = multipliers[k], np.ravel(values[k]), np.ravel(active[k])
            wrong_sign = np.where(on, -m / dual_tol, 0.0)  # active with μ < 0
            violated = np.where(on, 0.0, -d / (_DEGENERATE_TOL * scale_x))  # inactive, d < 0
            for score in (wrong_sign, violated):
                i = int(np.argmax(score))
                if score.size and score[i] > max(1.0, worst):
                    worst, change = score[i], ("ineq", (k, i))
        if self.lower is not None:
            nu = multipliers[-1]
            fixed = self.lower == self.upper
            scores = {
                # a fixed variable (lower == upper) takes a multiplier of either sign
                "lower": np.where(at_lower & ~fixed, -nu / dual_tol, _excess(self.lower, x)),
                "upper": np.where(at_upper, nu / dual_tol, _excess(x, self.upper)),
            }
            for kind, score in scores.items():
                i = int(np.argmax(score))
                if score.size and score[i] > max(1.0, worst):
                    worst, change = score[i], (kind, i)
        return change

    def _finish(self, x, multipliers, active, at_lower, at_upper):
        """Encode the active set in exact zeros and signs; flag degenerate constraints."""
        dual_tol, scale_x, values = self._margins(x)
        degenerate = False
        out = []
        for k, kind in enumerate(self.kinds):
            m = np.array(multipliers[k])
            if kind == "ineq":
                on = np.ravel(active[k])
                m[~on] = 0.0
                at_bound = np.abs(np.ravel(values[k])) <= _DEGENERATE_TOL * scale_x
                degenerate |= bool(np.any(on & (m <= dual_tol)))
                degenerate |= bool(np.any(~on & at_bound))
                # an active multiplier must stay > 0 to be read back as active
                m[on] = np.maximum(m[on], np.finfo(float).tiny)
            out.append(m)
        if self.lower is not None:
            nu = np.array(multipliers[-1])
            x = x.copy()
            x[at_lower], x[at_upper] = self.lower[at_lower], self.upper[at_upper]
            inactive = ~(at_lower | at_upper)
            nu[inactive] = 0.0
            near = _near(x, self.lower, _DEGENERATE_TOL) | _near(x, self.upper, _DEGENERATE_TOL)
            degenerate |= bool(np.any(inactive & near))
            fixed = self.lower == self.upper
            degenerate |= bool(np.any(at_lower & ~fixed & (nu <= dual_tol)))
            degenerate |= bool(np.any(at_upper & (nu >= -dual_tol)))
            degenerate |= bool(np.any(fixed & (np.abs(nu) <= dual_tol)))
            # a fixed variable pushed upwards is read back as "on the upper bound" (the same value)
            at_upper = at_upper | (at_lower & fixed & (nu < 0))
            at_lower = at_lower & ~at_upper
            nu[at_lower] = np.maximum(nu[at_lower], np.finfo(float).tiny)
            nu[at_upper] = np.minimum(nu[at_upper], -np.finfo(float).tiny)
            out.append(nu)
        z = np.concatenate([x, *out])
        return self._unflatten(z), not degenerate

    def _failed(self, x_hat):
        return [self.x(x_hat), *self.zeros], False


def _excess(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """How far `low` exceeds `high` (a bound violation), in units of √ε·(1 + |bound|); 0 where
    the bound is infinite."""
    finite = np.isfinite(low) & np.isfinite(high)
    low, high = np.where(finite, low, 0.0), np.where(finite, high, 0.0)
    scale = _DEGENERATE_TOL * (1 + np.maximum(np.abs(low), np.abs(high)))
    return np.where(finite, (low - high) / scale, 0.0)


def _near(x: np.ndarray, bound: np.ndarray, rtol: float) -> np.ndarray:
    """Whether x is within rtol·(1 + |bound|) of a finite bound (never for ±inf)."""
    finite = np.isfinite(bound)
    safe = np.where(finite, bound, 0.0)
    return finite & (np.abs(x - safe) <= rtol * (1 + np.abs(safe)))
