"""Minimization of a scalar objective over one scalar variable, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytensor.gradient import grad
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy.ops import MinimizeScalarOp
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.problems._arguments import (
    as_interval,
    as_scalar_problem,
    check_method,
    check_optimizer_kwargs,
    newton_options,
    scalar_solution,
    split_problem,
)

__all__ = ["MINIMIZE_SCALAR_METHODS", "minimize_scalar"]

MINIMIZE_SCALAR_METHODS = ("brent", "golden", "bounded", "newton")


def minimize_scalar(
    objective: TensorVariable,
    x: TensorVariable,
    *,
    x0=None,
    method: str = "brent",
    bracket: Sequence | None = None,
    bounds: Sequence | None = None,
    optimizer_kwargs: Mapping | None = None,
):
    """Minimize a scalar `objective` over the scalar `x`; other inputs of its graph are parameters.

    Parameters
    ----------
    objective : TensorVariable
        A scalar expression of `x` and of the parameters.
    x : TensorVariable
        A 0-d root variable of `objective`'s graph.
    x0 : number or TensorVariable, optional
        Start of the bracket search for ``"brent"``/``"golden"`` when no `bracket` is given (the
        search starts from ``(x0, x0 + 1)``). Ignored by ``"bounded"``. When ``None`` and no
        `bracket` or `bounds` is given, the runtime value of `x` is used.
    method : {"brent", "golden", "bounded", "newton"}, default "brent"
        scipy's methods, or ``"newton"``: graph-native damped Newton on f'(x) = 0 from `x0`
        with exact derivatives and an Armijo line search on f (no scipy).
    bracket : tuple of 2 or 3 numbers or scalar expressions, optional
        Bracketing interval for ``"brent"`` and ``"golden"``, as in scipy.
    bounds : tuple of 2 numbers or scalar expressions, optional
        ``(lower, upper)`` for ``"bounded"`` (required there, refused elsewhere). May depend on
        the parameters; the gradient flows to them when the minimum sits on a bound.
    optimizer_kwargs : dict, optional
        Further keyword arguments of :func:`scipy.optimize.minimize_scalar` (``tol``,
        ``options``); for ``"newton"``, ``tol`` (on ``|f'|``, default 1e-8) and ``max_iter``.

    Returns
    -------
    x_star : TensorVariable
        The minimizer. NaN where the solver raised.
    success : TensorVariable
        Boolean scalar: whether scipy reported convergence.

    Raises
    ------
    ValueError
        If `x` or `objective` is not 0-d, if `method` is unknown, or if `bounds` are missing for
        ``"bounded"`` (or given to another method).

    Notes
    -----
    In the interior the implicit rule runs on F = f'(x*) = 0. A bounded minimum sitting on a bound
    b(θ) (within ``10 * (xatol/3 + √eps·|b|)`` of it, scipy's stopping margin, with the slope
    pointing outward) is returned exactly at the
    bound and differentiated through F = x − b(θ): its derivative is that of the bound — 0 for a
    constant bound — not the interior formula.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, _ = pmo.minimize_scalar((x - a) ** 2, x, method="bounded", bounds=(0.0, 1.0))
    >>> float(x_star.eval({a: 2.0})), float(pt.grad(x_star, a).eval({a: 2.0}))
    (1.0, 0.0)
    """
    objective, x = as_scalar_problem(
        objective, x, argument="objective", routine="minimize_scalar", vector_routine="minimize"
    )
    method = check_method(method, MINIMIZE_SCALAR_METHODS, "minimize_scalar")
    if method == "bounded" and bounds is None:
        raise ValueError("`method` 'bounded' needs `bounds=(lower, upper)`.")
    if method != "bounded" and bounds is not None:
        raise ValueError(
            f"`bounds` are only used by `method='bounded'`; got method {method!r}. "
            "Pass `method='bounded'` or drop `bounds`."
        )
    if method == "newton" and bracket is not None:
        raise ValueError("`bracket` is not used by `method='newton'`; pass `x0` instead.")
    if method == "bounded" and bracket is not None:
        raise ValueError("`bracket` is not used by `method='bounded'`; pass `bounds` only.")
    options = check_optimizer_kwargs(
        optimizer_kwargs,
        reserved={
            "bounds": "use the `bounds` argument.",
            "bracket": "use the `bracket` argument.",
            "method": "use the `method` argument.",
        },
    )
    problem = split_problem([objective], [x])
    bracket_vars = [] if bracket is None else as_interval(bracket, "bracket", (2, 3))
    bound_vars = []
    if bounds is not None:
        problem, bound_vars = problem.with_parameters(as_interval(bounds, "bounds", (2,)))
    if method == "newton":
        (inner_objective,) = problem.inner_outputs
        slope = grad(inner_objective, problem.inner_xs[0])
        condition = OptimalityCondition(
            problem.inner_xs, problem.inner_params, [slope], symmetric=True
        )
        op = NewtonOp.minimizing(problem, condition, inner_objective, **newton_options(options))
    else:
        op = MinimizeScalarOp(
            problem,
            method=method,
            n_bracket=len(bracket_vars),
            inner_bounds=bound_vars,
            options=options,
        )
    return scalar_solution(op, x0, x, bracket_vars, bracket is not None or bounds is not None)
