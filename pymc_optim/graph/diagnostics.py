"""Diagnostics of a solve, read off the graph: `solution_info` (every solver) and `solver_trace`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pytensor.scalar as ps
from pytensor.compile.ops import DeepCopyOp, ViewOp
from pytensor.graph.basic import Apply
from pytensor.graph.replace import vectorize_graph
from pytensor.raise_op import CheckAndRaise
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.variable import TensorVariable

from pymc_optim.graph import trace as _trace
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.graph.status import SolverStatus, status_names
from pymc_optim.graph.trace import SolveTrace

__all__ = ["SolverInfo", "solution_info", "solver_node", "solver_trace"]


class _Diagnostics(NamedTuple):
    success: TensorVariable
    value: TensorVariable
    n_iterations: TensorVariable
    n_evaluations: TensorVariable


class SolverInfo(_Diagnostics):
    """Symbolic diagnostics of one solve, from :func:`pymc_optim.solution_info`.

    Attributes
    ----------
    success : bool scalar, whether the solver reported convergence.
    value : the objective at the solution (minimization) or the Euclidean norm of the
        residual (root finding, fixed points). Differentiable.
    n_iterations : int64 scalar, the solver's iteration count (-1 where scipy does not say).
    n_evaluations : int64 scalar, the number of objective or equation evaluations.
    status : int64 scalar, why the solve ended: a :class:`SolverInfo.Status` code, 0
        (``CONVERGED``) exactly where `success` is True; `SolverInfo.status_names` turns
        evaluated codes into names. An attribute only: unpacking ``*info`` gives the four
        above, as it always has.
    """

    #: The status codes, an IntEnum: ``SolverInfo.Status(code).name``, ``.message``.
    Status = SolverStatus
    #: Evaluated status codes as names: ``SolverInfo.status_names(codes)``.
    status_names = staticmethod(status_names)

    status: TensorVariable

    def __new__(cls, success, value, n_iterations, n_evaluations, status=None):
        info = super().__new__(cls, success, value, n_iterations, n_evaluations)
        info.status = status
        return info


def solution_info(x_star: TensorVariable | Sequence[TensorVariable]) -> SolverInfo:
    """Diagnostics of the solve that produced `x_star`, as symbolic variables.

    Parameters
    ----------
    x_star : TensorVariable or list of TensorVariable
        A solution returned by :func:`minimize`, :func:`root`, :func:`minimize_scalar`,
        :func:`root_scalar` or :func:`fixed_point` (any one of them if `x` was a list).

    Returns
    -------
    info : SolverInfo
        ``success``, ``value`` (objective at x*, or residual norm), ``n_iterations`` and
        ``n_evaluations``; and ``status``, why the solve ended (a `SolverInfo.Status` code).

    Raises
    ------
    TypeError
        If `x_star` was not produced by a pymc_optim solver.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, success = pmo.minimize((x - a) ** 2 + 1.0, x, x0=0.0)
    >>> info = pmo.solution_info(x_star)
    >>> float(info.value.eval({a: 3.0}))
    1.0
    >>> pmo.SolverInfo.status_names(info.status.eval({a: 3.0}))
    'converged'
    """
    node, op = solver_node(x_star)
    outs = node.outputs
    x_stars = outs[: op.n_controls]
    params = node.inputs[op.n_controls : op.n_controls + op.n_params]
    replace = dict(zip(op.problem.inner_xs, x_stars, strict=True))
    replace.update(zip(op.problem.inner_params, params, strict=True))
    # vectorize_graph also covers batched (Blockwise) solves, where x* has batch dimensions
    value = vectorize_graph(op.value, replace)
    success, n_iterations, n_evaluations, status = outs[op.n_controls :]
    return SolverInfo(success, value, n_iterations, n_evaluations, status)


def solver_trace(x_star) -> list[SolveTrace]:
    """The recorded solves of the solver that produced `x_star`, oldest first.

    Parameters
    ----------
    x_star : TensorVariable or list of TensorVariable
        A solution returned by :func:`minimize`, :func:`root`, :func:`minimize_scalar` or
        :func:`root_scalar` built with ``optimizer_kwargs={"trace": True}`` (or ``n``).

    Returns
    -------
    traces : list of SolveTrace
        One per solve run since the graph was built (the latest `n`; 100 for ``True``), by any
        compiled function containing this solve (a vectorized solve records one per problem).
        Empty until a compiled function has run.

    Raises
    ------
    TypeError
        If `x_star` was not produced by a pymc_optim solver.
    ValueError
        If the solver was built without ``optimizer_kwargs={"trace": ...}``.

    Examples
    --------
    >>> import pytensor, pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, _ = pmo.minimize((x - a) ** 2, x, x0=0.0, optimizer_kwargs={"trace": True})
    >>> _ = pytensor.function([a], x_star)(3.0)
    >>> (last,) = pmo.solver_trace(x_star)
    >>> bool(last.success), last.x.shape[1], round(float(last.value[-1]), 8)
    (True, 1, 0.0)
    """
    _, op = solver_node(x_star)
    if not op.trace_limit:
        raise ValueError(
            f"`x_star`'s solver ({op}) records no trace; build it with "
            "`optimizer_kwargs={'trace': True}` (scipy-backed methods). For graph-native "
            "methods use `pmo.solution_info(x_star)` (iterations, evaluations, final value)."
        )
    return _trace.recorded(op)


def solver_node(x_star) -> tuple[Apply, SolverOp]:
    """The node that computed `x_star` and its solver Op (the core Op of a vectorized solve).

    Raises
    ------
    TypeError
        If `x_star` was not produced by a pymc_optim solver.
    """
    var = x_star[0] if isinstance(x_star, list | tuple) else x_star
    var = unwrap_solution(var)
    node = getattr(var, "owner", None)
    op = _solver_op(node)
    if op is None:
        raise TypeError(
            "`x_star` must be a solution returned by a pymc_optim solver; "
            f"got `{var}`, computed by {getattr(node, 'op', None)}."
        )
    return node, op


def _solver_op(node) -> SolverOp | None:
    op = getattr(node, "op", None)
    if not isinstance(op, SolverOp):
        op = getattr(op, "core_op", None)  # vectorized solves wrap the Op in a Blockwise
    return op if isinstance(op, SolverOp) else None


def unwrap_solution(var):
    """The solver's own output under what `Optimum`/`Equilibrium` put around it: the
    Deterministic's view, and the failure policy's switch(success, x*, fill) ("reject"), its
    assertion ("raise") or its warning Op ("warn", ``passes_value_through``)."""
    while getattr(var, "owner", None) is not None:
        op = var.owner.op
        if isinstance(op, ViewOp | DeepCopyOp | CheckAndRaise) or getattr(
            op, "passes_value_through", False
        ):
            var = var.owner.inputs[0]
        elif (
            isinstance(op, Elemwise)
            and isinstance(op.scalar_op, ps.Switch)
            and _solver_op(var.owner.inputs[1].owner) is not None
        ):
            var = var.owner.inputs[1]
        else:
            break
    return var
