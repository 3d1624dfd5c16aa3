"""scipy.optimize as the numerical backend: callbacks into compiled inner PyTensor functions.

Every function here takes the compiled inner functions of a solver Op, the initial guesses and the
parameter values, and returns ``(x_stars, success, n_iterations, n_evaluations)``. A solver that
raises (a bracket without a sign change, a singular step, NaN in the objective) is reported as
``success=False`` with NaN solutions, never as an exception inside ``perform``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from pymc_optim.backends.packing import Packer
from pymc_optim.graph.trace import note, without_trace

__all__ = [
    "minimize",
    "minimize_constrained",
    "minimize_scalar",
    "root",
    "root_scalar",
]

#: scipy reports these when a solve cannot proceed; they become ``success=False``.
_SOLVER_ERRORS = (ValueError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)


def minimize(
    fns: dict,
    x0s: list[np.ndarray],
    params: list,
    *,
    method: str,
    use_jac: bool,
    use_hess: bool,
    use_hessp: bool,
    options: dict,
):
    from scipy.optimize import minimize as scipy_minimize

    packer = Packer(x0s)
    if use_jac:
        value_and_grad = fns["value_and_grad"]

        def fun(z):
            f, *g = value_and_grad(*packer.unpack(z), *params)
            return float(f), packer.pack(g)
    else:
        value = fns["value"]

        def fun(z):
            return float(value(*packer.unpack(z), *params)[0])

    extra = {}
    if use_hess:
        hess = fns["hess"]
        extra["hess"] = lambda z: hess(*packer.unpack(z), *params)[0]
    if use_hessp:
        hessp = fns["hessp"]
        extra["hessp"] = lambda z, p: packer.pack(
            hessp(*packer.unpack(z), *packer.unpack(p), *params)
        )
    try:
        res = scipy_minimize(
            fun,
            packer.pack(x0s),
            method=method,
            jac=True if use_jac else None,
            **extra,
            **without_trace(options),
        )
    except _SOLVER_ERRORS as err:
        note(f"{type(err).__name__}: {err}")
        return packer.failed(), False, -1, -1
    note(res.message)
    success = bool(res.success) and bool(np.all(np.isfinite(res.x)))
    return packer.unpack(res.x), success, getattr(res, "nit", -1), getattr(res, "nfev", -1)


def minimize_constrained(problem, x0: np.ndarray, *, method: str, options: dict):
    """scipy.optimize.minimize with bounds and constraints, from a constrained problem's
    callbacks (:class:`pymc_optim.problems.constrained._NumericalProblem`): values, gradients,
    constraint Jacobians, and for trust-constr Hessian-vector products and constraint Hessians.
    Returns the flat x (scipy's last iterate), success, and the counts."""
    from scipy.optimize import Bounds, NonlinearConstraint
    from scipy.optimize import minimize as scipy_minimize

    extra = {}
    if problem.lower is not None:
        extra["bounds"] = Bounds(problem.lower, problem.upper)
    constraints = []
    for k, (kind, size) in enumerate(zip(problem.kinds, problem.sizes, strict=True)):
        upper = 0.0 if kind == "eq" else np.inf
        hess = {}
        if method == "trust-constr":
            hess["hess"] = lambda z, v, k=k: problem.constraint_hessian(k, z, v)
        constraints.append(
            NonlinearConstraint(
                lambda z, k=k: problem.constraints(z)[0][k],
                np.zeros(size),
                np.full(size, upper),
                jac=lambda z, k=k: problem.constraints(z)[1][k],
                **hess,
            )
        )
    if constraints:
        extra["constraints"] = constraints
    if method == "trust-constr":
        extra["hessp"] = problem.hessp
    try:
        with warnings.catch_warnings():
            # trust-constr warns that equality constraints are solved "approximately", and
            # about singular Jacobians when started infeasible; both end in the KKT check.
            warnings.simplefilter("ignore", UserWarning)
            res = scipy_minimize(
                problem.value_and_grad,
                np.asarray(x0, dtype="float64").ravel(),
                method=method,
                jac=True,
                **extra,
                **without_trace(options),
            )
    except _SOLVER_ERRORS as err:
        note(f"{type(err).__name__}: {err}")
        return np.full(np.size(x0), np.nan), False, -1, -1
    note(res.message)
    success = bool(res.success) and bool(np.all(np.isfinite(res.x)))
    return res.x, success, getattr(res, "nit", -1), getattr(res, "nfev", -1)


def root(
    fns: dict, x0s: list[np.ndarray], params: list, *, method: str, use_jac: bool, options: dict
):
    from scipy.optimize import root as scipy_root

    packer = Packer(x0s)
    if use_jac:
        equations_and_jac = fns["equations_and_jac"]

        def fun(z):
            *F, J = equations_and_jac(*packer.unpack(z), *params)
            return Packer.pack(F), J
    else:
        equations = fns["equations"]

        def fun(z):
            return Packer.pack(equations(*packer.unpack(z), *params))

    try:
        with warnings.catch_warnings():
            # quasi-Newton methods warn when a step is rejected; that ends in success=False.
            warnings.simplefilter("ignore", RuntimeWarning)
            res = scipy_root(
                fun,
                packer.pack(x0s),
                method=method,
                jac=True if use_jac else None,
                **without_trace(options),
            )
    except _SOLVER_ERRORS as err:
        note(f"{type(err).__name__}: {err}")
        return packer.failed(), False, -1, -1
    note(res.message)
    success = bool(res.success) and bool(np.all(np.isfinite(res.x)))
    return packer.unpack(res.x), success, getattr(res, "nit", -1), getattr(res, "nfev", -1)


def minimize_scalar(
    fns: dict,
    x0: np.ndarray,
    params: list,
    *,
    method: str,
    bracket: tuple | None,
    bounds: tuple | None,
    options: dict,
):
    from scipy.optimize import minimize_scalar as scipy_minimize_scalar

    value = fns["value"]
    dtype = np.asarray(x0).dtype

    def fun(z):
        return float(value(np.asarray(z, dtype=dtype), *params)[0])

    try:
        res = scipy_minimize_scalar(
            fun, bracket=bracket, bounds=bounds, method=method, **without_trace(options)
        )
    except _SOLVER_ERRORS as err:
        note(f"{type(err).__name__}: {err}")
        return [np.asarray(np.nan, dtype=dtype)], False, -1, -1
    note(res.message)
    success = bool(res.success) and bool(np.isfinite(res.x))
    return [np.asarray(res.x, dtype=dtype)], success, res.get("nit", -1), res.get("nfev", -1)


def root_scalar(
    fns: dict,
    x0: np.ndarray,
    params: list,
    *,
    method: str,
    bracket: tuple | None,
    options: dict,
):
    from scipy.optimize import root_scalar as scipy_root_scalar

    dtype = np.asarray(x0).dtype

    def scalar_fn(name: str) -> Callable[[float], float]:
        fn = fns[name]
        return lambda z: float(fn(np.asarray(z, dtype=dtype), *params)[0])

    derivatives = {}
    if "fprime" in fns:
        derivatives["fprime"] = scalar_fn("fprime")
    if "fprime2" in fns:
        derivatives["fprime2"] = scalar_fn("fprime2")
    start = {} if bracket is not None else {"x0": float(x0)}
    try:
        with warnings.catch_warnings():
            # newton/secant warn on a zero derivative or tolerance miss; both give converged=False
            warnings.simplefilter("ignore", RuntimeWarning)
            res = scipy_root_scalar(
                scalar_fn("equation"),
                method=method,
                bracket=bracket,
                **start,
                **derivatives,
                **without_trace(options),
            )
    except _SOLVER_ERRORS as err:
        note(f"{type(err).__name__}: {err}")
        return [np.asarray(np.nan, dtype=dtype)], False, -1, -1
    note(res.flag)
    success = bool(res.converged) and bool(np.isfinite(res.root))
    return [np.asarray(res.root, dtype=dtype)], success, res.iterations, res.function_calls
