"""Root finding of one scalar equation in one scalar variable, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy.ops import RootScalarOp
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

__all__ = ["ROOT_SCALAR_METHODS", "root_scalar"]

BRACKETING_METHODS = ("bisect", "brentq", "brenth", "ridder", "toms748")
ROOT_SCALAR_METHODS = (*BRACKETING_METHODS, "newton", "secant", "halley")


def root_scalar(
    equation: TensorVariable,
    x: TensorVariable,
    *,
    x0=None,
    method: str = "secant",
    bracket: Sequence | None = None,
    optimizer_kwargs: Mapping | None = None,
):
    """Solve the scalar ``equation(x, θ) = 0`` for the scalar `x`.

    Parameters
    ----------
    equation : TensorVariable
        A 0-d expression of `x` and of the parameters.
    x : TensorVariable
        A 0-d root variable of `equation`'s graph.
    x0 : number or TensorVariable, optional
        Starting point of the open methods (``"newton"``, ``"secant"``, ``"halley"``); when
        ``None``, the runtime value of `x`. Not used by bracketing methods.
    method : str, default "secant"
        Bracketing: ``"bisect"``, ``"brentq"``, ``"brenth"``, ``"ridder"``, ``"toms748"``;
        open: ``"newton"`` (graph-native damped Newton with the exact derivative, no scipy),
        ``"halley"`` (scipy, given exact first and second derivatives) and ``"secant"``.
    bracket : tuple of 2 numbers or scalar expressions, optional
        ``(a, b)`` with a sign change of the equation; required by the bracketing methods.
    optimizer_kwargs : dict, optional
        Further keyword arguments of :func:`scipy.optimize.root_scalar` (``xtol``, ``rtol``,
        ``maxiter``, ``x1`` for secant); for ``"newton"``, ``tol`` (on ``|F|``, default 1e-8) and
        ``max_iter`` (default 100).

    Returns
    -------
    x_star : TensorVariable
        The root. NaN where the solver raised (e.g. no sign change over the bracket).
    success : TensorVariable
        Boolean scalar: whether scipy reported convergence.

    Raises
    ------
    ValueError
        If `x` or `equation` is not 0-d, if `method` is unknown, if a bracketing method has no
        `bracket`, or an open method is given one.

    Notes
    -----
    dx*/dθ = −(∂F/∂θ)/(∂F/∂x) at the root, by the shared implicit rule; the bracket does not
    enter the derivative.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, _ = pmo.root_scalar(x**2 - a, x, method="brentq", bracket=(0.0, 10.0))
    >>> round(float(x_star.eval({a: 4.0})), 10), round(float(pt.grad(x_star, a).eval({a: 4.0})), 8)
    (2.0, 0.25)
    """
    equation, x = as_scalar_problem(
        equation, x, argument="equation", routine="root_scalar", vector_routine="root"
    )
    method = check_method(method, ROOT_SCALAR_METHODS, "root_scalar")
    if method in BRACKETING_METHODS and bracket is None:
        raise ValueError(
            f"`method` {method!r} needs `bracket=(a, b)` with a sign change of the equation."
        )
    if method not in BRACKETING_METHODS and bracket is not None:
        raise ValueError(
            f"`bracket` is not used by the open method {method!r}; pass `x0`, or choose a "
            f"bracketing method ({', '.join(BRACKETING_METHODS)})."
        )
    options = check_optimizer_kwargs(
        optimizer_kwargs,
        reserved={
            "bracket": "use the `bracket` argument.",
            "method": "use the `method` argument.",
            "x0": "use the `x0` argument.",
            "fprime": "it is built from the equation's graph.",
            "fprime2": "it is built from the equation's graph.",
        },
    )
    problem = split_problem([equation], [x], argument="equation")
    bracket_vars = [] if bracket is None else as_interval(bracket, "bracket", (2,))
    condition = OptimalityCondition(
        problem.inner_xs, problem.inner_params, problem.inner_outputs, symmetric=True
    )
    if method == "newton":
        value = abs(problem.inner_outputs[0])
        op = NewtonOp.solving(problem, condition, value=value, **newton_options(options))
    else:
        op = RootScalarOp(
            problem,
            condition=condition,
            method=method,
            n_bracket=len(bracket_vars),
            options=options,
        )
    return scalar_solution(op, x0, x, bracket_vars, bracket is not None)
