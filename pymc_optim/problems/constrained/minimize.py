"""Minimization under bounds and equality/inequality constraints, differentiated through KKT.

Notes
-----
The problem is

    min_x f(x, θ)   s.t.   c_k(x, θ) = 0 (equalities),   d_k(x, θ) ≥ 0 (inequalities, scipy's
                           sign),   l(θ) ≤ x ≤ u(θ) (element-wise bounds, ±∞ where unbounded),

with the Lagrangian L = f − Σ λ_kᵀ c_k − Σ μ_kᵀ d_k − νᵀx. Its solution is differentiated by the
package's one implicit rule (:func:`pymc_optim.implicit.implicit_pullback`) applied to the KKT
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
from typing import NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.scipy.constrained import ConstrainedMinimizeOp
from pymc_optim.graph.diagnostics import unwrap_solution
from pymc_optim.graph.inner_graph import (
    InnerProblem,
    as_control_variables,
    as_expression,
    check_block_size,
    check_initial_guess,
)
from pymc_optim.linalg.detect import SPARSE, resolve_structure
from pymc_optim.linalg.structure import LinearStructure, as_linear_structure
from pymc_optim.problems._arguments import check_optimizer_kwargs, newton_options, split_problem
from pymc_optim.problems.constrained.kkt import KKT, KKTNewtonOp, KKTStructure

__all__ = [
    "CONSTRAINED_METHODS",
    "LagrangeMultipliers",
    "constrained_minimize",
    "lagrange_multipliers",
]

#: "newton" (graph-native, on the KKT system) handles equality constraints only, L-BFGS-B bounds
#: only; SLSQP and trust-constr handle everything.
CONSTRAINED_METHODS = ("SLSQP", "trust-constr", "L-BFGS-B", "newton")


def constrained_minimize(
    objective: TensorVariable,
    x: TensorVariable,
    *,
    x0=None,
    method: str | None = None,
    bounds=None,
    constraints=None,
    structure: str = "auto",
    block_size: int | None = None,
    optimizer_kwargs: Mapping | None = None,
):
    """Minimize `objective` over `x` under `bounds` and `constraints`: the branch of
    :func:`minimize` that takes them, whose docstring documents the arguments and the result.

    Here `x` is one variable (not a list), `structure` is the layout of the Hessian of the
    Lagrangian (for ``method="newton"``; the scipy methods keep the dense KKT system), and
    `success` also requires the KKT conditions at x* and an active set that is not degenerate
    (see the module Notes).
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

    structure = as_linear_structure(structure, block_size)
    if structure == SPARSE:
        raise ValueError(
            "`structure='sparse'` is not available with `constraints`: the Hessian of the "
            "Lagrangian need not be positive definite. Use 'auto', 'diagonal', "
            "'block_diagonal' or 'dense'."
        )
    if method != "newton" and structure not in ("auto", LinearStructure("dense")):
        raise ValueError(
            f"`structure` is the layout of the Hessian of the Lagrangian in `method='newton'` "
            f"(Newton on the KKT system); got structure={structure!r} with method={method!r}, "
            "whose KKT gradient is dense. Drop `structure`, or use `method='newton'` (equality "
            "constraints only)."
        )
    user_x0 = x0
    problem = split_problem([objective, *funs], [x])
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
    kkt = KKT(problem, kinds, bound_vars)

    if x0 is None:
        x0 = x
    x0 = check_initial_guess(x0, x)
    x0 = pt.specify_shape(pt.broadcast_to(x0, x.shape) if x0.ndim < x.ndim else x0, x.type.shape)
    multiplier_x0s = [pt.zeros_like(graph_replace(f, {x: x0}, strict=False)) for f in funs]
    if bound_vars:
        multiplier_x0s.append(pt.zeros_like(x0))
    if method == "newton":
        condition = kkt.newton_condition(_kkt_structure(structure, kkt, user_x0))
        F = condition.flat_residual()
        op = KKTNewtonOp(
            problem,
            kkt=kkt,
            condition=condition,
            merit=0.5 * (F**2).sum(),
            value=kkt.objective,
            minimization=False,
            **newton_options(options),
        )
    else:
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
    node = getattr(unwrap_solution(x_star), "owner", None)
    op = getattr(node, "op", None)
    kkt = getattr(op, "kkt", None)
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


def _kkt_structure(structure, kkt: KKT, x0) -> LinearStructure:
    """The layout of Newton-KKT's A: a :class:`KKTStructure` when H = ∇²ₓL is (detected or
    given) diagonal or block-diagonal, else dense.

    H is read by the solvers' detection (:func:`~pymc_optim.linalg.detect.resolve_structure`) on
    the Lagrangian as the objective of x alone, the multipliers among its parameters; an explicit
    layout is verified there, once.
    """
    if structure == LinearStructure("dense"):
        return structure
    hessian_problem = InnerProblem(
        [kkt.x], [*kkt.multipliers, *kkt.problem.inner_params], [kkt.lagrangian], []
    )
    if structure != "auto" and x0 is not None and None in kkt.x.type.shape:
        start = pt.as_tensor_variable(x0)
        check_block_size(structure, [start if start.ndim == kkt.x.ndim else kkt.x])
    else:
        check_block_size(structure, [kkt.x])
    hessian = resolve_structure(
        structure,
        hessian_problem,
        residual=[kkt.lagrangian_gradient],
        objective=kkt.lagrangian,
        x0=x0,
        what="the Hessian of the Lagrangian ∇²ₓL",
    )
    if hessian.kind in ("diagonal", "block_diagonal"):
        return KKTStructure(hessian=hessian)
    return LinearStructure("dense")  # dense, or a sparse H (no sparse KKT solve yet)


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
    if isinstance(bounds, list | tuple) and bounds and all(_is_number_pair(b) for b in bounds):
        bounds = _from_scipy_pairs(bounds, x)
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


def _is_number_pair(item) -> bool:
    return (
        isinstance(item, list | tuple)
        and len(item) == 2
        and all(v is None or isinstance(v, int | float | np.integer | np.floating) for v in item)
    )


def _from_scipy_pairs(pairs, x):
    """scipy's one (min, max) pair per element of `x` as (lower, upper) arrays. Two pairs of
    numbers also read as (lower, upper) of a two-element `x`, with another meaning: refused."""
    if len(pairs) == 2:
        raise ValueError(
            f"`bounds` {pairs!r} is ambiguous: scipy's one (min, max) pair per element, or "
            "(lower, upper)? Pass scipy.optimize.Bounds(lb, ub), or `(lower, upper)` with "
            "arrays, e.g. `bounds=(np.array([0.0, 0.0]), np.array([5.0, 5.0]))`."
        )
    size = None if any(d is None for d in x.type.shape) else int(np.prod(x.type.shape))
    if x.ndim != 1 or size not in (None, len(pairs)):
        raise ValueError(
            f"`bounds` as (min, max) pairs needs one pair per element of a vector `x`; got "
            f"{len(pairs)} pairs for an `x` of shape {x.type.shape}. Pass `(lower, upper)` "
            "arrays shaped like `x` instead."
        )
    lower = [-np.inf if lo is None else lo for lo, _ in pairs]
    upper = [np.inf if hi is None else hi for _, hi in pairs]
    return np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)


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
