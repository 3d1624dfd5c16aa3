"""Minimization of a scalar objective over one scalar variable, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.tensor.variable import TensorVariable

from pymc_optim import _scipy
from pymc_optim._checks import check_method, check_optimizer_kwargs
from pymc_optim._implicit import OptimalityCondition
from pymc_optim._inner_graph import (
    InnerProblem,
    as_expression,
    build_inner_problem,
    cast_initial_guess,
)
from pymc_optim._newton import NewtonOp, newton_options
from pymc_optim._scalar import as_interval, as_scalar_control, as_scalar_expression
from pymc_optim._solver_op import SolverOp, make_solution

__all__ = ["MINIMIZE_SCALAR_METHODS", "MinimizeScalarOp", "minimize_scalar"]

MINIMIZE_SCALAR_METHODS = ("brent", "golden", "bounded", "newton")

#: scipy's default absolute tolerance on x for method="bounded".
_BOUNDED_XATOL = 1e-5
#: scipy's "bounded" keeps its iterates √eps·|x| + xatol/3 inside the interval; a minimum within
#: this many such margins of a bound, with the slope pointing outward, sits on the bound.
_ACTIVE_BOUND_MARGINS = 10
_SQRT_EPS = float(np.sqrt(np.finfo("float64").eps))


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
        ``options``); for ``"newton"``, ``tol`` (on |f'|, default 1e-8) and ``max_iter``.

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
    x = as_scalar_control(x, "minimize_scalar", "minimize")
    objective = as_scalar_expression(as_expression(objective, "objective"), "objective")
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
    problem = build_inner_problem([objective], [x])
    bracket_vars = [] if bracket is None else as_interval(bracket, "bracket", (2, 3))
    bound_vars = []
    if bounds is not None:
        problem, bound_vars = problem.with_parameters(as_interval(bounds, "bounds", (2,)))
    if method == "newton":
        (inner_objective,) = problem.inner_outputs
        slope = grad(inner_objective, problem.inner_xs[0])
        op = NewtonOp(
            problem,
            condition=OptimalityCondition(
                problem.inner_xs, problem.inner_params, [slope], symmetric=True
            ),
            merit=inner_objective,
            value=inner_objective,
            minimization=True,
            **newton_options(options),
        )
    else:
        _scipy.check_scipy_options("minimize_scalar", method, options)
        op = MinimizeScalarOp(
            problem,
            method=method,
            n_bracket=len(bracket_vars),
            inner_bounds=bound_vars,
            options=options,
        )
    if x0 is None and (bracket is not None or bounds is not None):
        x0 = 0.0  # unused when the search interval is given; keeps `x` out of the returned graph
    return make_solution(op, cast_initial_guess(x0, [x], False), bracket_vars, False)


class MinimizeScalarOp(SolverOp):
    """x* = argminₓ f(x, θ) for scalar x by :func:`scipy.optimize.minimize_scalar`."""

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
        self.method = method
        self.inner_bounds = inner_bounds
        self.options = options
        xatol = options.get("options", {}).get("xatol", _BOUNDED_XATOL)
        self.xatol = xatol

    @property
    def value(self) -> TensorVariable:
        return self.problem.inner_outputs[0]

    @cached_property
    def _slope(self) -> TensorVariable:
        return grad(self.value, self.problem.inner_xs[0])

    @cached_property
    def condition(self) -> OptimalityCondition:
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

    def solve(self, fns, x0s, params, extras):
        (x0,) = x0s
        bracket = tuple(float(b) for b in extras) or None
        if bracket is None and self.method != "bounded":
            bracket = (float(x0), float(x0) + 1.0)
        bounds = tuple(float(b) for b in params[-2:]) if self.inner_bounds else None
        x_stars, success, nit, nfev = _scipy.minimize_scalar(
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
        return x_stars, success, nit, nfev

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
