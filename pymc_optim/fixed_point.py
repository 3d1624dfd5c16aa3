"""Fixed points x = T(x, θ) of a tensor-valued update, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Sequence

from pytensor.tensor.variable import TensorVariable

from pymc_optim import _iterations
from pymc_optim._checks import check_method
from pymc_optim._implicit import OptimalityCondition
from pymc_optim._inner_graph import (
    InnerProblem,
    as_control_variables,
    build_inner_problem,
    cast_initial_guess,
)
from pymc_optim._linear import _concat_flat, as_linear_structure
from pymc_optim._newton import DEFAULT_TOL, NewtonOp
from pymc_optim._scipy import Packer
from pymc_optim._solver_op import SolverOp, make_solution
from pymc_optim.linalg.detect import resolve_structure

__all__ = ["FIXED_POINT_METHODS", "FixedPointOp", "fixed_point"]

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
        Stop when max|T(x) − x| ≤ tol.
    max_iter : int, default 10000
        Iteration limit (for ``"newton"``, Newton steps).
    structure : {"auto", "dense", "diagonal", "block_diagonal"}, default "auto"
        Layout of I − ∂T/∂x for Newton steps and the implicit gradient (see :func:`minimize`);
        ``"auto"`` reads it off the update's graph (diagonal when T_i reads x_i only).
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
    pass (:mod:`pymc_optim._implicit`), never through the iterations.

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
    for xi, ui in zip(xs, updates, strict=True):
        if ui.type.ndim != xi.type.ndim:
            raise ValueError(
                f"`update` must be shaped like `x`; got {ui.type.ndim} dimensions for `{xi}` with "
                f"{xi.type.ndim}."
            )
    method = check_method(method, FIXED_POINT_METHODS, "fixed_point")
    if not tol > 0 or max_iter < 1:
        raise ValueError(
            f"`tol` must be positive and `max_iter` at least 1; got tol={tol}, max_iter={max_iter}."
        )
    structure = as_linear_structure(structure, block_size)
    problem = build_inner_problem(updates, xs, argument="update")
    residual = [xi - ti for xi, ti in zip(problem.inner_xs, problem.inner_outputs, strict=True)]
    structure = resolve_structure(structure, problem, residual=residual, x0=x0)
    condition = OptimalityCondition(
        problem.inner_xs, problem.inner_params, residual, symmetric=False, structure=structure
    )
    if method == "newton":
        F = condition.flat_residual()
        op = NewtonOp(
            problem,
            condition=condition,
            merit=0.5 * (F**2).sum(),
            value=condition.residual_norm(),
            minimization=False,
            tol=tol,
            max_iter=max_iter,
        )
    else:
        op = FixedPointOp(problem, condition=condition, method=method, tol=tol, max_iter=max_iter)
    return make_solution(op, cast_initial_guess(x0, xs, is_list), [], is_list)


class FixedPointOp(SolverOp):
    """x* = T(x*, θ) by plain or Anderson-accelerated iteration; see :func:`fixed_point`."""

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition,
        method: str,
        tol: float,
        max_iter: int,
    ):
        super().__init__(problem, condition=condition)
        self.method = method
        self.tol = tol
        self.max_iter = max_iter

    @property
    def value(self) -> TensorVariable:
        return self.condition.residual_norm()

    @property
    def flat_update(self) -> TensorVariable:
        """T(x, θ) flattened, on the inner variables."""
        return _concat_flat(self.problem.inner_outputs)

    def numerical_functions(self):
        return {"update": ([], [self.flat_update])}

    def solve(self, fns, x0s, params, extras):
        packer = Packer(x0s)
        update_fn = fns["update"]

        def update(z):
            return update_fn(*packer.unpack(z), *params)[0]

        loop = (
            _iterations.anderson if self.method == "anderson" else _iterations.fixed_point_iteration
        )
        z, success, n_iterations, n_evaluations = loop(
            update, packer.pack(x0s), tol=self.tol, max_iter=self.max_iter
        )
        return packer.unpack(z), success, n_iterations, n_evaluations
