"""Unconstrained minimization of a scalar objective over tensor variables, as a PyTensor Op."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from pytensor.gradient import NullTypeGradError, grad
from pytensor.tensor.variable import TensorVariable

from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy.ops import (
    DERIVATIVE_FREE,
    NEEDS_HESS,
    NEEDS_JAC,
    USES_HESS,
    MinimizeOp,
)
from pymc_optim.graph.inner_graph import (
    as_control_variables,
    as_expression,
    cast_initial_guess,
    check_block_size,
)
from pymc_optim.graph.solver_op import make_solution
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.detect import resolve_structure
from pymc_optim.linalg.structure import as_linear_structure
from pymc_optim.problems._arguments import (
    check_method,
    check_optimizer_kwargs,
    newton_options,
    split_problem,
)
from pymc_optim.problems.constrained import constrained_minimize

__all__ = ["MINIMIZE_METHODS", "minimize"]

MINIMIZE_METHODS = (
    "Nelder-Mead",
    "Powell",
    "CG",
    "BFGS",
    "Newton-CG",
    "L-BFGS-B",
    "TNC",
    "COBYLA",
    "COBYQA",
    "SLSQP",
    "trust-constr",
    "dogleg",
    "trust-ncg",
    "trust-exact",
    "trust-krylov",
    "newton",
)
#: method="auto" without a gradient: Powell's conjugate directions converge where Nelder-Mead
#: exhausts scipy's default budget of 200·n evaluations (measured at n = 10 on a convex quadratic).
_AUTODERIVATIVE_FREE = "Powell"
#: What building a gradient raises for an Op without one (grad not implemented, or undefined).
_NO_GRADIENT = (NotImplementedError, NullTypeGradError)


def minimize(
    objective: TensorVariable,
    x: TensorVariable | Sequence[TensorVariable],
    *,
    x0=None,
    method: str | None = None,
    bounds=None,
    constraints=None,
    jac: bool = True,
    hess: bool = False,
    structure: str = "auto",
    block_size: int | None = None,
    optimizer_kwargs: Mapping | None = None,
):
    """Minimize a scalar `objective` over `x`; every other input of its graph is a parameter.

    Parameters
    ----------
    objective : TensorVariable
        A scalar expression of `x` and of any other variables (the parameters θ).
    x : TensorVariable or list of TensorVariable
        The control: a root variable of `objective`'s graph, of any shape, or a list of them.
    x0 : number, array, TensorVariable or list of them, optional
        Initial guess, cast to `x`'s type. When ``None``, the runtime value of `x` is the initial
        guess and `x` stays an input of the returned graph. With `bounds` or `constraints` it
        need not be feasible.
    method : str, optional
        Any method of :func:`scipy.optimize.minimize` (default "BFGS"), or ``"newton"``: damped
        Newton with exact Hessians and an Armijo line search, compiled into the graph (no scipy;
        runs under the JAX backend too), or ``"auto"``: BFGS when the objective's gradient can
        be built, otherwise Powell (derivative-free), with a PymcOptimWarning saying so and why.
        With `bounds` or `constraints`: "L-BFGS-B" (bounds only; the default then), "SLSQP"
        (the default with constraints), "trust-constr", or "newton" (equality constraints only,
        Newton on the KKT system).
    bounds : (lower, upper), scipy.optimize.Bounds or a list of (min, max) pairs, optional
        Element-wise bounds on a single `x`: each side ``None`` (unbounded), a number, an array
        or an expression of the parameters, broadcast to `x`'s shape. scipy's list of one
        (min, max) pair per element of a vector `x` is read as such, except two pairs of
        numbers, which could also mean (lower, upper): refused as ambiguous.
    constraints : dict or list of dict, optional
        scipy-style ``{"type": "eq" | "ineq", "fun": expr}`` with `expr` a symbolic expression of
        `x` and of the parameters (any shape): expr = 0, or expr ≥ 0. See
        :mod:`pymc_optim.problems.constrained` for the KKT gradient, the active-set tolerance and
        the degenerate cases, and :func:`lagrange_multipliers` for the multipliers.
    jac : bool, default True
        Give scipy the gradient of `objective` (built symbolically). Ignored by the
        derivative-free methods (Nelder-Mead, Powell, COBYLA, COBYQA).
    hess : bool, default False
        Give scipy the dense Hessian. When False, Hessian-based methods that accept a
        Hessian-vector product (Newton-CG, trust-ncg, trust-krylov, trust-constr) get one.
    structure : {"auto", "dense", "diagonal", "block_diagonal", "sparse"}, default "auto"
        Layout of the Hessian, used by Newton steps and by the implicit gradient's solve:
        ``"diagonal"`` when each element of x enters the objective separately (independent
        random effects), ``"block_diagonal"`` for consecutive blocks of `block_size` elements,
        ``"sparse"`` for a sparse Hessian whose pattern is read off the graph (a GMRF: a sparse
        Cholesky; extra ``sparse``), or a :class:`~pymc_optim.linalg.sparse.SparseStructure`.
        ``"auto"`` reads the layout off the objective's graph (diagonal when it is a sum of
        terms each of one element of x, block-diagonal when a sum of terms each of one group of
        consecutive elements: the rows of a matrix-shaped x, constant slices; else dense;
        :mod:`pymc_optim.linalg.detect`). An
        explicit structure is checked at build time, and one that drops nonzero Hessian entries
        is a ValueError naming them (numerically, when the graph alone cannot prove it fits
        and every input's shape is known). With `constraints` and ``method="newton"``: the
        layout of the Hessian of the Lagrangian, whose KKT system is then solved by the Schur
        complement on the constraints (:func:`constrained_minimize`); the scipy methods keep the
        dense KKT system and accept only "auto" and "dense".
    block_size : int, optional
        The block size for ``structure="block_diagonal"``.
    optimizer_kwargs : dict, optional
        Further keyword arguments of :func:`scipy.optimize.minimize` (``tol``, ``options``);
        for ``"newton"``, ``tol`` (on max|∇f|, default 1e-8; at least 2.3e-4 for float32
        controls, whose rounding noise lies above 1e-8) and ``max_iter`` (default 100).

    Returns
    -------
    x_star : TensorVariable or list of TensorVariable
        The minimizer, shaped like `x`. NaN where the solver raised.
    success : TensorVariable
        Boolean scalar: scipy reported convergence *and* x* is a strict minimum: the Hessian
        there is positive definite, its smallest eigenvalue above 1.5e-8 of its scale (a saddle
        or a maximum, where the gradient vanishes too, is a failure, and so is a flat direction,
        where x* has no implicit derivative). The check costs one Hessian at x* (in the
        compact form of `structure`) and one Cholesky factorization; it is skipped when the
        objective's gradient cannot be built. With `bounds` or `constraints`: the KKT conditions
        hold at x* and the active set is not degenerate (active bounds are hit exactly; see
        :mod:`pymc_optim.problems.constrained`).

    Raises
    ------
    ValueError
        If `objective` is not scalar or does not depend on `x`, if `x` is not a root input of the
        graph, if `method` is unknown or needs derivatives that were turned off or that cannot
        be built (an Op without a gradient in the objective: use ``"Nelder-Mead"``,
        ``"Powell"`` or ``"auto"``), or if `optimizer_kwargs` sets something the Op controls
        (bounds, constraints, jac, hess).
    TypeError
        If `x` is not a float tensor variable.

    Notes
    -----
    The solution is differentiated by the implicit function theorem on F = ∇ₓf(x*, θ) = 0
    (see :mod:`pymc_optim.implicit`): one symmetric solve with the Hessian ∇²ₓf, then one reverse
    pass, whatever the number of parameters. Use :func:`solution_info` for the objective value,
    iteration and evaluation counts. A solution found without the objective's gradient (it could
    not be built) has no implicit gradient: ``pt.grad`` through it raises NotImplementedError.

    A single-element `x` with a gradient-based method is solved, once compiled, by scalar Newton
    (the rewrite ``pymc_optim_scalar``, see :mod:`pymc_optim.rewrites.scalar`).

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.vector("x"), pt.vector("a")
    >>> x_star, success = pmo.minimize(((x - a) ** 2).sum(), x, x0=[0.0, 0.0])
    >>> x_star.eval({a: [1.0, 2.0]}).round(6)
    array([1., 2.])
    >>> pt.grad(x_star.sum(), a).eval({a: [1.0, 2.0]}).round(6)
    array([1., 1.])
    """
    objective = as_expression(objective, "objective")
    if bounds is not None or constraints is not None:
        if not (jac and not hess):
            raise ValueError(
                "With `bounds` or `constraints`, `jac` and `hess` keep their defaults (the KKT "
                "system is built from the graph)."
            )
        return constrained_minimize(
            objective,
            x,
            x0=x0,
            method=method,
            bounds=bounds,
            constraints=constraints,
            structure=structure,
            block_size=block_size,
            optimizer_kwargs=optimizer_kwargs,
        )
    if method is None:
        method = "BFGS"
    auto = isinstance(method, str) and method.lower() == "auto"
    if auto and (hess or not jac):
        raise ValueError("`method='auto'` chooses BFGS or Powell itself; drop `jac`/`hess`.")
    if auto:
        method = "BFGS"  # unless the gradient cannot be built, see below
    xs, is_list = as_control_variables(x)
    if objective.ndim != 0:
        raise ValueError(
            f"`objective` must be a scalar; got `{objective}` with {objective.ndim} dimensions. "
            "Reduce it first, e.g. `objective.sum()`."
        )
    method = check_method(method, MINIMIZE_METHODS, "minimize")
    structure = as_linear_structure(structure, block_size)
    x0s = cast_initial_guess(x0, xs, is_list)
    check_block_size(structure, x0s)
    if method == "newton" and (hess or not jac):
        raise ValueError("`method='newton'` always uses exact derivatives; drop `jac`/`hess`.")
    if method in NEEDS_JAC and not jac:
        raise ValueError(f"`method` {method!r} needs the gradient; pass `jac=True`.")
    if method in NEEDS_HESS and not hess:
        raise ValueError(f"`method` {method!r} needs the Hessian; pass `hess=True`.")
    if hess and method not in USES_HESS:
        raise ValueError(
            f"`hess=True` has no effect with `method` {method!r}, which does not use a Hessian; "
            f"drop it or choose one of {sorted(USES_HESS)}."
        )
    options = check_optimizer_kwargs(
        optimizer_kwargs,
        reserved={
            "bounds": "use the `bounds` argument (its gradient goes through the KKT conditions).",
            "constraints": "use the `constraints` argument (its gradient goes through the KKT "
            "conditions).",
            "jac": "use the `jac` argument.",
            "hess": "use the `hess` argument.",
            "hessp": "it is built from the objective's graph.",
            "method": "use the `method` argument.",
            "x0": "use the `x0` argument.",
        },
    )
    problem = split_problem([objective], xs)
    (inner_objective,) = problem.inner_outputs
    try:
        gradient = grad(inner_objective, problem.inner_xs, disconnected_inputs="ignore")
        no_gradient = None
    except _NO_GRADIENT as err:
        gradient, no_gradient = None, f"{type(err).__name__}: {err}"
    if no_gradient is not None and auto:
        method = _AUTODERIVATIVE_FREE
        warnings.warn(
            f"`method='auto'` chose {method!r} (derivative-free): the objective's gradient cannot "
            f"be built ({no_gradient}). The solution has no gradient with respect to the "
            "parameters.",
            PymcOptimWarning,
            stacklevel=2,
        )
    elif no_gradient is not None and (method == "newton" or method not in DERIVATIVE_FREE and jac):
        raise ValueError(
            f"`method` {method!r} needs the objective's gradient, which cannot be built "
            f"({no_gradient}). Use a derivative-free method ('Nelder-Mead', 'Powell') or "
            "`method='auto'`."
        )
    if gradient is not None and (method == "newton" or method in USES_HESS):
        _check_second_derivatives(method, gradient, problem.inner_xs)
    condition = None
    if gradient is not None:
        structure = resolve_structure(
            structure, problem, residual=gradient, objective=inner_objective, x0=x0
        )
        condition = OptimalityCondition(
            problem.inner_xs, problem.inner_params, gradient, symmetric=True, structure=structure
        )
    if method == "newton":
        op = NewtonOp.minimizing(problem, condition, inner_objective, **newton_options(options))
    else:
        op = MinimizeOp(
            problem,
            condition=condition,
            method=method,
            jac=jac and method not in DERIVATIVE_FREE,
            hess=hess,
            options=options,
            no_gradient=no_gradient,
        )
    return make_solution(op, x0s, [], is_list)


def _check_second_derivatives(method: str, gradient, xs) -> None:
    """A method that uses the Hessian needs the gradient's own derivatives: one reverse pass of
    (∇f)·p tells (pt.prod's gradient has none in PyTensor)."""
    probes = [x.type() for x in xs]
    try:
        grad(
            sum((g * p).sum() for g, p in zip(gradient, probes, strict=True)),
            xs,
            disconnected_inputs="ignore",
        )
    except _NO_GRADIENT as err:
        raise ValueError(
            f"`method` {method!r} uses the objective's second derivatives, which cannot be built "
            f"({type(err).__name__}: {err}). Use a first-order method ('BFGS', 'L-BFGS-B'), or "
            "write the objective with twice-differentiable operations (a product of positive x "
            "as pt.exp(pt.log(x).sum()))."
        ) from err
