"""Fixed points x = T(x, θ) of a tensor-valued update, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Sequence

from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.newton import DEFAULT_TOL, NewtonOp
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
    check_iteration_limit,
    check_method,
    check_tolerance,
    split_problem,
)

__all__ = ["FIXED_POINT_METHODS", "fixed_point"]

FIXED_POINT_METHODS = ("iteration", "anderson", "newton")

#: Plain iteration of a contraction with modulus β needs about log(tol)/log(β) sweeps:
#: 1e4 covers β = 0.998 at tol = 1e-8; closer to 1, use "anderson" or "newton".
DEFAULT_MAX_ITER = 10_000


def fixed_point(
    update: TensorVariable | Sequence[TensorVariable],
    x: TensorVariable | Sequence[TensorVariable],
    *,
    x0=None,
    method: str = "iteration",
    tol: float = DEFAULT_TOL,
    max_iter: int = DEFAULT_MAX_ITER,
    structure: str = "auto",
    block_size: int | None = None,
):
    """Find x* = update(x*, θ); every input of `update`'s graph other than `x` is a parameter.

    Parameters
    ----------
    update : TensorVariable or list of TensorVariable
        T(x, θ), shaped like `x` (one expression per variable when `x` is a list).
    x : TensorVariable or list of TensorVariable
        Root variable(s) of `update`'s graph.
    x0 : number, array, TensorVariable or list of them, optional
        Initial guess, cast to `x`'s type; when ``None``, the runtime value of `x`.
    method : {"iteration", "anderson", "newton"}, default "iteration"
        ``"iteration"``: x ← T(x), for contractions (Bellman operators with discount < 1);
        ``"anderson"``: Anderson acceleration (memory 5); ``"newton"``: damped Newton on
        x − T(x) = 0 with the exact Jacobian, fastest when T is smooth and n moderate.
    tol : float, default 1e-8
        Stop when max|T(x) − x| ≤ tol (at least 2.3e-4 for float32 controls, whose rounding
        noise lies above 1e-8).
    max_iter : int, default 10000
        Iteration limit (for ``"newton"``, Newton steps).
    structure : {"auto", "dense", "diagonal", "block_diagonal", "sparse"}, default "auto"
        Layout of I − ∂T/∂x for Newton steps and the implicit gradient (see :func:`minimize`);
        ``"auto"`` reads it off the update's graph (diagonal when T_i reads x_i only);
        ``"sparse"`` reads its pattern off the graph and solves by a sparse LU (see
        :func:`root`).
    block_size : int, optional
        The block size for ``structure="block_diagonal"``.

    Returns
    -------
    x_star : TensorVariable or list of TensorVariable
        The fixed point, shaped like `x`; the last iterate when the iteration did not converge.
    success : TensorVariable
        Boolean scalar: whether max|T(x*) − x*| ≤ tol was reached within `max_iter`.

    Raises
    ------
    ValueError
        If `update` is not shaped like `x`, if `x` is not a root input of its graph, if `method`
        is unknown or `tol`/`max_iter` are not positive.

    Notes
    -----
    The implicit rule runs on F = x − T(x, θ), A = I − ∂T/∂x: one solve with Aᵀ, then one reverse
    pass (:mod:`pymc_optim.implicit`), never through the iterations.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, _ = pmo.fixed_point(pt.cos(a * x), x, x0=0.0)  # x = cos(a x)
    >>> round(float(x_star.eval({a: 1.0})), 6)
    0.739085
    """
    xs, is_list = as_control_variables(x)
    updates = list(update) if isinstance(update, list | tuple) else [update]
    if len(updates) != len(xs):
        raise ValueError(
            f"`update` must give one expression per variable in `x`; got {len(updates)} for "
            f"{len(xs)}."
        )
    updates = [as_expression(u, "update") for u in updates]
    x0s = cast_initial_guess(x0, xs, is_list)
    for xi, x0i, ui in zip(xs, x0s, updates, strict=True):
        if ui.type.ndim != xi.type.ndim:
            raise ValueError(
                f"`update` must be shaped like `x`; got {ui.type.ndim} dimensions for `{xi}` with "
                f"{xi.type.ndim}."
            )
        if any(
            u is not None and s is not None and u != s
            for u, s in zip(ui.type.shape, x0i.type.shape, strict=True)
        ):
            raise ValueError(
                f"`update` must be shaped like `x`; got shape {ui.type.shape} for `{xi}` of shape "
                f"{x0i.type.shape}. T(x) maps x to a value of the same shape."
            )
    method = check_method(method, FIXED_POINT_METHODS, "fixed_point")
    tol = check_tolerance(tol, "tol")
    max_iter = check_iteration_limit(max_iter, "max_iter")
    structure = as_linear_structure(structure, block_size)
    check_block_size(structure, x0s)
    problem = split_problem(updates, xs, argument="update")
    residual = [xi - ti for xi, ti in zip(problem.inner_xs, problem.inner_outputs, strict=True)]
    structure = resolve_structure(structure, problem, residual=residual, x0=x0)
    condition = OptimalityCondition(
        problem.inner_xs, problem.inner_params, residual, symmetric=False, structure=structure
    )
    if method == "newton":
        op = NewtonOp.solving(problem, condition, tol=tol, max_iter=max_iter)
    else:
        op = FixedPointOp(problem, condition=condition, method=method, tol=tol, max_iter=max_iter)
    return make_solution(op, x0s, [], is_list)
