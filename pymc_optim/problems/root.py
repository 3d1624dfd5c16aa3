"""Root finding of a square system of equations over tensor variables, as a PyTensor Op."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.backends.scipy import callbacks as _scipy
from pymc_optim.backends.scipy.ops import RootOp
from pymc_optim.graph.inner_graph import (
    as_control_variables,
    as_expression,
    cast_initial_guess,
    check_block_size,
    static_size,
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

__all__ = ["ROOT_METHODS", "root"]

#: scipy.optimize.root's methods, then the graph-native Newton iteration.
ROOT_METHODS = (*_scipy.scipy_methods("root"), "newton")
_USES_JAC = {"hybr", "lm"}


def root(
    equations: TensorVariable | Sequence[TensorVariable],
    x: TensorVariable | Sequence[TensorVariable],
    *,
    x0=None,
    method: str = "hybr",
    jac: bool = True,
    structure: str = "auto",
    block_size: int | None = None,
    optimizer_kwargs: Mapping | None = None,
):
    """Solve ``equations(x, θ) = 0`` for `x`; every other input of their graph is a parameter.

    Parameters
    ----------
    equations : TensorVariable or list of TensorVariable
        Expressions of `x` and the parameters, of any shapes, whose total size equals `x`'s.
    x : TensorVariable or list of TensorVariable
        The unknowns: root variables of the equations' graph, of any shape, or a list of them.
    x0 : number, array, TensorVariable or list of them, optional
        Initial guess, cast to `x`'s type. When ``None``, the runtime value of `x` is used.
    method : str, default "hybr"
        Any method of :func:`scipy.optimize.root`, or ``"newton"``: damped Newton with the exact
        Jacobian and an Armijo line search on ½‖F‖², compiled into the graph (no scipy).
    jac : bool, default True
        Give scipy the Jacobian (built symbolically). Only ``"hybr"`` and ``"lm"`` use it.
    structure : {"auto", "dense", "diagonal", "block_diagonal", "sparse"}, default "auto"
        Layout of the Jacobian ∂F/∂x, used by Newton steps and the implicit gradient's solve
        (see :func:`minimize`); ``"auto"`` reads it off the equations' graph (diagonal when
        each equation reads its own element of x only, block-diagonal when each row of a
        matrix-shaped x's equations reads that row only, else dense). ``"sparse"`` reads the
        Jacobian's pattern off the graph and solves by a sparse LU
        (:class:`~pymc_optim.linalg.sparse_lu.SparseJacobianStructure`: equations coupling
        neighbours on a chain, grid or network, at 10³–10⁵ unknowns); C and numba backends.
    block_size : int, optional
        The block size for ``structure="block_diagonal"``.
    optimizer_kwargs : dict, optional
        Further keyword arguments of :func:`scipy.optimize.root` (``tol``, ``options``); for
        ``"newton"``, ``tol`` (on max|F|, default 1e-8; at least 2.3e-4 for float32 controls)
        and ``max_iter`` (default 100).

    Returns
    -------
    x_star : TensorVariable or list of TensorVariable
        The root, shaped like `x`. NaN where the solver raised.
    success : TensorVariable
        Boolean scalar: whether the returned point solves the equations, max|F(x*)| ≤ 1e-8
        (``ROOT_RESIDUAL_TOL``, Newton's default tolerance). scipy's status is only a hint:
        "hybr" may report no progress at a residual of 1e-16 (success here) and "lm" success at
        a local minimum of ‖F‖² that is no root (failure here). The methods whose own stopping
        rule is a residual test (the nonlinear solvers' ``fatol``, df-sane) keep their reported
        success as well.

    Raises
    ------
    ValueError
        If the equations' total size differs from `x`'s, if `x` is not a root input of their
        graph, or if `method` is unknown.
    TypeError
        If `x` is not a float tensor variable.

    Notes
    -----
    Differentiated by the implicit function theorem on F(x*, θ) = 0: one solve with ∂F/∂xᵀ and
    one reverse pass (:mod:`pymc_optim.implicit`). ``solution_info(x_star).value`` is the
    residual norm ‖F(x*, θ)‖₂.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> import pymc_optim as pmo
    >>> x, a = pt.scalar("x"), pt.scalar("a")
    >>> x_star, success = pmo.root(x**3 - a, x, x0=1.0)
    >>> float(x_star.eval({a: 8.0}))
    2.0
    >>> round(float(pt.grad(x_star, a).eval({a: 8.0})), 8)  # d(a^(1/3))/da = 1/12
    0.08333333
    """
    xs, is_list = as_control_variables(x)
    equations = [
        as_expression(e, "equations")
        for e in (equations if isinstance(equations, list | tuple) else [equations])
    ]
    n_equations = static_size(*equations)
    x0s = cast_initial_guess(x0, xs, is_list)
    n_unknowns = static_size(*x0s)  # x* takes x0's type: its static shape counts too
    if n_equations is not None and n_unknowns is not None and n_equations != n_unknowns:
        raise ValueError(
            f"`equations` must have as many elements as `x` (a square system); got "
            f"{n_equations} equations for {n_unknowns} unknowns. For a least-squares problem use "
            "`minimize` on the sum of squares."
        )
    method = check_method(method, ROOT_METHODS, "root")
    options = check_optimizer_kwargs(
        optimizer_kwargs,
        reserved={
            "jac": "use the `jac` argument.",
            "method": "use the `method` argument.",
            "x0": "use the `x0` argument.",
        },
    )
    structure = as_linear_structure(structure, block_size)
    check_block_size(structure, x0s)
    problem = split_problem(equations, xs, argument="equations")
    structure = resolve_structure(structure, problem, residual=problem.inner_outputs, x0=x0)
    condition = OptimalityCondition(
        problem.inner_xs,
        problem.inner_params,
        problem.inner_outputs,
        symmetric=False,
        structure=structure,
    )
    if method == "newton":
        op = NewtonOp.solving(problem, condition, **newton_options(options))
    else:
        op = RootOp(
            problem,
            condition=condition,
            method=method,
            jac=jac and method in _USES_JAC,
            options=options,
        )
    return make_solution(op, x0s, [], is_list)
