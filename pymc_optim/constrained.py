"""Minimization under bounds and equality/inequality constraints, differentiated through KKT.

Notes
-----
The problem is

    min_x f(x, θ)   s.t.   c_k(x, θ) = 0 (equalities),   d_k(x, θ) ≥ 0 (inequalities, scipy's
                           sign),   l(θ) ≤ x ≤ u(θ) (element-wise bounds, ±∞ where unbounded),

with the Lagrangian L = f − Σ λ_kᵀ c_k − Σ μ_kᵀ d_k − νᵀx. Its solution is differentiated by the
package's one implicit rule (:func:`pymc_optim._implicit.implicit_pullback`) applied to the KKT
conditions over the unknowns z = (x, λ, μ, ν), one Op output each:

    ∇ₓf − Σ J_c_kᵀ λ_k − Σ J_d_kᵀ μ_k − ν = 0          (stationarity; n rows)
    c_k(x, θ) = 0                                       (every equality)
    d_k(x, θ) = 0   where μ_k > 0,    μ_k = 0 elsewhere (active / inactive inequalities)
    x − l(θ) = 0    where ν > 0,      x − u(θ) = 0 where ν < 0,    ν = 0 elsewhere (bounds)

A row "μ = 0" pins an inactive multiplier and decouples it: the inactive constraint is dropped.
A row "x_i − l_i(θ) = 0" fixes an active bound, so dx_i/dθ = dl_i/dθ: zero for a constant
bound. The active set is discrete, so it is carried by the *signs of the multipliers the Op
outputs*: the Op sets inactive multipliers to exactly 0 and active ones nonzero, and the
symbolic condition reads the same signs back with a ``switch`` (as
:func:`~pymc_optim.minimize_scalar` does for its bounds). The square Jacobian A = ∂F/∂z is the
KKT matrix with the active set fixed; it is invertible under the usual regularity conditions
(linearly independent active constraint gradients, strict complementarity, second-order
sufficiency), and the gradient is one solve with Aᵀ plus one reverse pass, as for every solver.

After scipy returns x̂ the Op identifies the active set and polishes the solution:

1. candidates: inequalities with d ≤ `_CANDIDATE_SLACK` · scale and bounds within that of x̂;
2. Newton's method on the KKT rows above with that active set fixed (multipliers started from
   least squares on the stationarity rows), to rounding error: x* and the multipliers are then
   accurate to ~1e-12 rather than to scipy's stopping tolerance;
3. a candidate whose multiplier has the wrong sign is released, a released constraint that the
   polished x violates is added, and step 2 is repeated (a primal-dual active-set iteration,
   at most `_MAX_ACTIVE_SET_CHANGES` times).

Degenerate cases. A constraint at its bound with a multiplier within `_DEGENERATE_TOL` (√ε,
relative) of zero — weakly active, no strict complementarity — is in general a kink of x*(θ):
the one-sided derivatives differ and the derivative does not exist. x* is still returned (it is
the minimizer) but ``success`` is False, so that a model's failure policy sees it; the gradient
is then one of the two one-sided derivatives (whichever side the active-set iteration ended on).
For a generic parameter value this is a set of measure zero, but a problem whose unconstrained
minimum lies on a bound for *every* θ (e.g. min x² with x ≤ 0) is degenerate everywhere: write
such a bound out of the problem. Infeasible constraints, a singular KKT matrix (dependent active
constraints) and a failed scipy solve also give ``success=False``; x* is then scipy's last
iterate (NaN where scipy raised) and the multipliers are 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad, jacobian
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim import _scipy
from pymc_optim._checks import check_optimizer_kwargs
from pymc_optim._implicit import OptimalityCondition
from pymc_optim._inner_graph import (
    InnerProblem,
    as_control_variables,
    as_expression,
    build_inner_problem,
    check_initial_guess,
)
from pymc_optim._newton import NewtonOp, newton_options
from pymc_optim._solver_op import SolverOp

__all__ = [
    "CONSTRAINED_METHODS",
    "ConstrainedMinimizeOp",
    "LagrangeMultipliers",
    "constrained_minimize",
    "lagrange_multipliers",
]

#: "newton" (graph-native, on the KKT system) handles equality constraints only, L-BFGS-B bounds
#: only; SLSQP and trust-constr handle everything.
CONSTRAINED_METHODS = ("SLSQP", "trust-constr", "L-BFGS-B", "newton")

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


def constrained_minimize(
    objective: TensorVariable,
    x: TensorVariable,
    *,
    x0=None,
    method: str | None = None,
    bounds=None,
    constraints=None,
    optimizer_kwargs: Mapping | None = None,
):
    """Minimize `objective` over `x` under `bounds` and `constraints`; see :func:`minimize`.

    Parameters
    ----------
    objective : TensorVariable
        A scalar expression of `x` and of the parameters θ.
    x : TensorVariable
        The control, one root variable of any shape (not a list).
    x0 : number, array or TensorVariable, optional
        Initial guess (need not be feasible); ``None`` uses the runtime value of `x`.
    method : {"SLSQP", "trust-constr", "L-BFGS-B", "newton"}, optional
        Default: "L-BFGS-B" with bounds only, "SLSQP" otherwise (scipy's choice). "L-BFGS-B"
        takes bounds only; "newton" (graph-native Newton on the KKT system, no scipy) takes
        equality constraints only.
    bounds : (lower, upper) or scipy.optimize.Bounds, optional
        Element-wise bounds on `x`: each side ``None`` (unbounded), a number, an array or an
        expression of the parameters, broadcast to `x`'s shape (±inf for unbounded entries).
    constraints : dict or sequence of dict, optional
        scipy-style ``{"type": "eq" | "ineq", "fun": expr}``, where `expr` is an expression of
        `x` and of the parameters, of any shape; "eq" means expr = 0, "ineq" means expr ≥ 0.
    optimizer_kwargs : dict, optional
        Further keyword arguments of :func:`scipy.optimize.minimize` (``tol``, ``options``);
        for "newton", ``tol`` and ``max_iter``.

    Returns
    -------
    x_star : TensorVariable
        The constrained minimizer, shaped like `x`, with active bounds hit exactly.
    success : TensorVariable
        Boolean scalar: scipy converged, the KKT conditions hold at x* and the active set is not
        degenerate (see the module Notes). Use :func:`lagrange_multipliers` for λ, μ and ν.
    """
    xs, is_list = as_control_variables(x)
    if is_list:
        raise NotImplementedError(
            "`bounds` and `constraints` take a single control variable `x`; got a list. "
            "Concatenate the pieces into one vector."
        )
    (x,) = xs
    objective = as_expression(objective, "objective")
    if objective.ndim != 0:
        raise ValueError(
            f"`objective` must be a scalar; got `{objective}` with {objective.ndim} dimensions."
        )
    funs, kinds = _as_constraints(constraints, x)
    lower, upper = _as_bounds(bounds, x)
    method = _choose_method(method, has_bounds=lower is not None, kinds=kinds)
    options = check_optimizer_kwargs(
        optimizer_kwargs,
        reserved={
            key: f"use the `{key}` argument of `minimize` (or leave it to the Op)."
            for key in ("bounds", "constraints", "jac", "hess", "hessp", "method", "x0")
        },
    )

    problem = build_inner_problem([objective, *funs], [x])
    bound_vars = []
    if lower is not None:
        problem, bound_vars = problem.with_parameters([lower, upper])
    x_in = problem.inner_xs[0]
    inner_funs = problem.inner_outputs[1:]
    multipliers = [
        pt.tensor(dtype=x_in.type.dtype, shape=c.type.shape, name=f"{kind}_multiplier_{k}")
        for k, (c, kind) in enumerate(zip(inner_funs, kinds, strict=True))
    ]
    if bound_vars:
        multipliers.append(x_in.type(name="bound_multiplier"))
    problem = InnerProblem(
        [x_in, *multipliers], problem.inner_params, problem.inner_outputs, problem.outer_params
    )
    kkt = _KKT(problem, kinds, bound_vars)

    if x0 is None:
        x0 = x
    x0 = check_initial_guess(x0, x)
    x0 = pt.specify_shape(pt.broadcast_to(x0, x.shape) if x0.ndim < x.ndim else x0, x.type.shape)
    multiplier_x0s = [pt.zeros_like(graph_replace(f, {x: x0}, strict=False)) for f in funs]
    if bound_vars:
        multiplier_x0s.append(pt.zeros_like(x0))
    if method == "newton":
        F = kkt.condition.flat_residual()
        op = NewtonOp(
            problem,
            condition=kkt.condition,
            merit=0.5 * (F**2).sum(),
            value=kkt.objective,
            minimization=False,
            **newton_options(options),
        )
        op._kkt = kkt  # read by `lagrange_multipliers`
    else:
        _scipy.check_scipy_options("minimize", method, options)
        op = ConstrainedMinimizeOp(problem, kkt=kkt, method=method, options=options)
    outs = op(x0, *multiplier_x0s, *problem.outer_params)
    x_star, success = outs[0], outs[op.n_controls]
    if x.name:
        x_star.name = f"{x.name}_star"
    return x_star, success


class LagrangeMultipliers(NamedTuple):
    """Multipliers of a constrained solution, from :func:`lagrange_multipliers`.

    Attributes
    ----------
    equality : list of TensorVariable, λ_k for each "eq" constraint, in the order given.
    inequality : list of TensorVariable, μ_k ≥ 0 for each "ineq" constraint (0 where inactive).
    bounds : TensorVariable or None, ν shaped like x: ν_i > 0 on an active lower bound, < 0 on an
        active upper bound, 0 elsewhere (None without bounds).
    """

    equality: list
    inequality: list
    bounds: TensorVariable | None


def lagrange_multipliers(x_star: TensorVariable) -> LagrangeMultipliers:
    """The Lagrange multipliers of a solution of :func:`minimize` with `bounds`/`constraints`.

    They are outputs of the same Op, differentiated by the same implicit rule (dλ/dθ is
    available, e.g. for shadow prices). Sign convention: L = f − λᵀc − μᵀd − νᵀx, so
    ∇f = Σ J_cᵀλ + Σ J_dᵀμ + ν at the solution.

    Raises
    ------
    TypeError
        If `x_star` was not returned by a constrained :func:`minimize`.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.vector("x", shape=(2,)), pt.scalar("a")
    >>> x_star, _ = pmo.minimize(
    ...     (x**2).sum(), x, x0=[0.0, 0.0], constraints={"type": "eq", "fun": x.sum() - a}
    ... )
    >>> float(pmo.lagrange_multipliers(x_star).equality[0].eval({a: 2.0}).round(8))
    2.0
    """
    node = getattr(x_star, "owner", None)
    op = getattr(node, "op", None)
    kkt = getattr(op, "kkt", None) or getattr(op, "_kkt", None)
    if kkt is None:
        raise TypeError(
            "`x_star` must be returned by `minimize` with `bounds` or `constraints`; "
            f"got `{x_star}`, computed by {op}."
        )
    mults = node.outputs[1 : 1 + len(kkt.kinds) + bool(kkt.bounds)]
    return LagrangeMultipliers(
        [m for m, k in zip(mults, kkt.kinds, strict=False) if k == "eq"],
        [m for m, k in zip(mults, kkt.kinds, strict=False) if k == "ineq"],
        mults[-1] if kkt.bounds else None,
    )


class _KKT:
    """The KKT rows of the problem on the Op's inner variables (see the module Notes)."""

    def __init__(self, problem: InnerProblem, kinds: Sequence[str], bounds: Sequence):
        self.problem = problem
        self.kinds = list(kinds)
        self.bounds = list(bounds)  # [lower, upper] inner parameters, or []
        self.x = problem.inner_xs[0]
        self.objective = problem.inner_outputs[0]
        self.funs = list(problem.inner_outputs[1:])
        self.multipliers = list(problem.inner_xs[1 : 1 + len(self.funs)])
        self.bound_multiplier = problem.inner_xs[-1] if self.bounds else None

    @cached_property
    def lagrangian_gradient(self) -> TensorVariable:
        """∇ₓ(f − Σ λ_kᵀc_k − Σ μ_kᵀd_k) − ν."""
        lagrangian = self.objective - sum(
            (m * c).sum() for m, c in zip(self.multipliers, self.funs, strict=True)
        )
        g = grad(lagrangian, self.x)
        return g - self.bound_multiplier if self.bounds else g

    def residual(self, active_ineq, at_lower, at_upper) -> list[TensorVariable]:
        """The KKT rows with the active set given by boolean tensors (None: equality only)."""
        rows = [self.lagrangian_gradient]
        activity = iter(active_ineq)
        for c, m, kind in zip(self.funs, self.multipliers, self.kinds, strict=True):
            rows.append(c if kind == "eq" else pt.switch(next(activity), c, m))
        if self.bounds:
            lower, upper = (pt.broadcast_to(b, self.x.shape) for b in self.bounds)
            nu = self.bound_multiplier
            rows.append(
                pt.switch(at_lower, self.x - lower, pt.switch(at_upper, self.x - upper, nu))
            )
        return rows

    @cached_property
    def condition(self) -> OptimalityCondition:
        """F = 0 with the active set read from the multipliers' signs (the Op's outputs)."""
        ineq = [m > 0 for m, k in zip(self.multipliers, self.kinds, strict=True) if k == "ineq"]
        nu = self.bound_multiplier
        rows = self.residual(ineq, nu > 0 if self.bounds else None, nu < 0 if self.bounds else None)
        return OptimalityCondition(
            self.problem.inner_xs, self.problem.inner_params, rows, symmetric=False
        )

    @cached_property
    def flags(self) -> list[TensorVariable]:
        """Boolean inputs that fix the active set, for the numerical polish."""
        flags = [
            pt.tensor(dtype="bool", shape=c.type.shape, name=f"active_{k}")
            for k, (c, kind) in enumerate(zip(self.funs, self.kinds, strict=True))
            if kind == "ineq"
        ]
        if self.bounds:
            flags += [pt.tensor(dtype="bool", shape=self.x.type.shape, name=s) for s in "lu"]
        return flags

    def fixed_set_system(self) -> tuple[list, list[TensorVariable]]:
        """``(flags, [F, A])``: the KKT residual and its dense Jacobian with the active set as
        inputs."""
        n_ineq = self.kinds.count("ineq")
        ineq = self.flags[:n_ineq]
        at_lower, at_upper = self.flags[n_ineq:] if self.bounds else (None, None)
        rows = self.residual(ineq, at_lower, at_upper)
        condition = OptimalityCondition(
            self.problem.inner_xs, self.problem.inner_params, rows, symmetric=False
        )
        return self.flags, [condition.flat_residual(), condition.jacobian_matrix()]


class ConstrainedMinimizeOp(SolverOp):
    """x* = argmin f(x, θ) under bounds and constraints by :func:`scipy.optimize.minimize`.

    Outputs ``[x*, *multipliers, (ν), success, n_iterations, n_evaluations]``: the multipliers
    are controls of the KKT condition (see the module Notes), so that the shared implicit rule
    differentiates them together with x*.
    """

    def __init__(self, problem: InnerProblem, *, kkt: _KKT, method: str, options):
        super().__init__(problem)
        self._kkt = kkt
        self.method = method
        self.options = options

    @property
    def kkt(self) -> _KKT:
        return self._kkt

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
            jacobian(c.ravel(), x, disconnected_inputs="ignore").reshape((c.size, x.size))
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
                        grad((m * c).sum(), x).ravel(), x, disconnected_inputs="ignore"
                    ).reshape((x.size, x.size))
                    for m, c in zip(kkt.multipliers, kkt.funs, strict=True)
                ],
            )
        fns["kkt"] = kkt.fixed_set_system()
        return fns

    def solve(self, fns, x0s, params, extras):
        x0, zero_multipliers = x0s[0], list(x0s[1:])
        problem = _NumericalProblem(self._kkt, fns, x0, zero_multipliers, params)
        x_hat, success, nit, nfev = _scipy.minimize_constrained(
            problem, x0, method=self.method, options=self.options
        )
        if success:
            z, success = problem.polish(x_hat)
        else:
            z = [problem.x(x_hat), *zero_multipliers]
        return z, success, nit, nfev


class _NumericalProblem:
    """The problem's numbers at given parameters, in flat float64 arrays, for scipy and the
    active-set polish."""

    def __init__(self, kkt: _KKT, fns: dict, x0, zero_multipliers, params):
        self.kkt, self.fns, self.params = kkt, fns, params
        self.shape, self.dtype = np.shape(x0), np.asarray(x0).dtype
        self.zeros = zero_multipliers
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
        n = int(np.prod(self.shape, dtype=int))
        out = [self.x(z[:n])]
        start = n
        for zero in self.zeros:
            size = int(np.size(zero))
            out.append(
                np.asarray(z[start : start + size], dtype=self.dtype).reshape(np.shape(zero))
            )
            start += size
        return out

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


def _as_constraints(constraints, x) -> tuple[list[TensorVariable], list[str]]:
    """Validate scipy-style constraint dicts; return their expressions and kinds."""
    if constraints is None:
        return [], []
    if isinstance(constraints, Mapping):
        constraints = [constraints]
    funs, kinds = [], []
    for i, c in enumerate(constraints):
        if not isinstance(c, Mapping) or set(c) != {"type", "fun"}:
            raise TypeError(
                f"`constraints[{i}]` must be a dict with exactly the keys 'type' and 'fun' "
                f"(scipy style, 'fun' a symbolic expression of `x`); got {c!r}."
            )
        if c["type"] not in ("eq", "ineq"):
            raise ValueError(
                f"`constraints[{i}]['type']` must be 'eq' or 'ineq'; got {c['type']!r}."
            )
        fun = as_expression(c["fun"], f"constraints[{i}]['fun']")
        if x not in ancestors([fun]):
            raise ValueError(
                f"`constraints[{i}]['fun']` must be an expression of `x`; `{fun}` does not "
                "depend on it. Write the constraint in terms of `x` (e.g. `x.sum() - 1`)."
            )
        funs.append(fun.astype(x.type.dtype) if fun.type.dtype != x.type.dtype else fun)
        kinds.append(c["type"])
    return funs, kinds


def _as_bounds(bounds, x):
    """`(lower, upper)` as expressions (±inf for None), or (None, None) without bounds."""
    if bounds is None:
        return None, None
    from scipy.optimize import Bounds

    if isinstance(bounds, Bounds):
        bounds = (bounds.lb, bounds.ub)
    if not isinstance(bounds, Sequence) or len(bounds) != 2:
        raise ValueError(
            "`bounds` must be `(lower, upper)` (each None, a number, an array or an expression "
            f"broadcastable to `x`'s shape) or a scipy.optimize.Bounds; got {bounds!r}."
        )
    if bounds[0] is None and bounds[1] is None:
        return None, None
    out = []
    for side, b, fill in (("lower", bounds[0], -np.inf), ("upper", bounds[1], np.inf)):
        b = pt.as_tensor_variable(fill if b is None else b).astype(x.type.dtype)
        if b.ndim > x.ndim:
            raise ValueError(
                f"The {side} bound must broadcast to `x`'s shape; got {b.ndim} dimensions for "
                f"an `x` with {x.ndim}."
            )
        if x in ancestors([b]):
            raise ValueError(
                f"The {side} bound `{b}` depends on `x`; write it as an inequality constraint "
                "instead."
            )
        out.append(b)
    return tuple(out)


def _choose_method(method, *, has_bounds: bool, kinds: list[str]) -> str:
    if method is None:
        return "L-BFGS-B" if not kinds else "SLSQP"
    by_lower = {m.lower(): m for m in CONSTRAINED_METHODS}
    if not isinstance(method, str) or method.lower() not in by_lower:
        raise ValueError(
            f"`method` {method!r} does not take bounds or constraints; use one of "
            + ", ".join(repr(m) for m in CONSTRAINED_METHODS)
            + "."
        )
    method = by_lower[method.lower()]
    if method == "L-BFGS-B" and kinds:
        raise ValueError(
            "`method` 'L-BFGS-B' takes bounds only; use 'SLSQP' or 'trust-constr' with "
            "`constraints`."
        )
    if method == "newton" and (has_bounds or "ineq" in kinds):
        raise ValueError(
            "`method` 'newton' solves equality constraints only (Newton on the KKT system); "
            "use 'SLSQP' or 'trust-constr' with bounds or inequality constraints."
        )
    return method
