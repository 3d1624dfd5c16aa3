"""scipy.optimize as the numerical backend: callbacks into compiled inner PyTensor functions.

Every function here takes the compiled inner functions of a solver Op, the initial guesses and the
parameter values, and returns ``(x_stars, success, n_iterations, n_evaluations, status)``, the
status ``SOLVER_FAILED`` where scipy gave up (its message noted in the trace) and ``NONFINITE``
where it returned a non-finite point. A solver that
raises (a bracket without a sign change, a singular step, NaN in the objective) is reported as
``success=False`` with NaN solutions, never as an exception inside ``perform`` (`_guarded`).
The functions end alike (failed → NaN, else the result with success and counts) but read a
different scipy result each (``OptimizeResult`` or ``RootResults``, ``x`` or ``root``): the
parallel is kept so that each reads as one call of scipy.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from pymc_optim.backends.packing import Packer
from pymc_optim.graph.solver_op import ProblemUndefined
from pymc_optim.graph.status import SolverStatus
from pymc_optim.graph.trace import note, without_trace

__all__ = [
    "check_scipy_options",
    "minimize",
    "minimize_constrained",
    "minimize_scalar",
    "root",
    "root_scalar",
    "scipy_methods",
]

#: scipy reports these when a solve cannot proceed (a bracket without a sign change, a singular
#: step); raised by scipy's own code, they become ``success=False`` (`_guarded`). Raised through
#: one of our callbacks, they are bugs and propagate: the problem's graph reports its own errors
#: as `ProblemUndefined` (`SolverOp.guarded_functions`).
_SOLVER_ERRORS = (ValueError, TypeError, RuntimeError, ArithmeticError, np.linalg.LinAlgError)
#: Where our callbacks live: a traceback through them is not scipy's own failure.
_PACKAGE = str(Path(__file__).parents[2]) + os.sep

#: `root` succeeds where max|F(x*)| is at most this at the returned point: graph-native Newton's
#: default tolerance, and what the 0-d form (scalar Newton, see _rewrites) checks.
ROOT_RESIDUAL_TOL = 1e-8
#: Methods of scipy.optimize.root whose stopping rule is not a test of the residual.
_STEP_TESTED_ROOT_METHODS = {"hybr", "lm"}

#: scipy's implementation of each method (module of scipy.optimize, function): its keyword
#: parameters are the method's ``options``, as :func:`scipy.optimize.show_options` documents.
_IMPLEMENTATIONS = {
    "minimize": {
        "nelder-mead": ("_optimize", "_minimize_neldermead"),
        "powell": ("_optimize", "_minimize_powell"),
        "cg": ("_optimize", "_minimize_cg"),
        "bfgs": ("_optimize", "_minimize_bfgs"),
        "newton-cg": ("_optimize", "_minimize_newtoncg"),
        "l-bfgs-b": ("_lbfgsb_py", "_minimize_lbfgsb"),
        "tnc": ("_tnc", "_minimize_tnc"),
        "cobyla": ("_cobyla_py", "_minimize_cobyla"),
        "cobyqa": ("_cobyqa_py", "_minimize_cobyqa"),
        "slsqp": ("_slsqp_py", "_minimize_slsqp"),
        "trust-constr": ("_trustregion_constr", "_minimize_trustregion_constr"),
        # the trust-region methods pass their options on to _minimize_trust_region
        "dogleg": ("_trustregion", "_minimize_trust_region"),
        "trust-ncg": ("_trustregion", "_minimize_trust_region"),
        "trust-exact": ("_trustregion", "_minimize_trust_region"),
        "trust-krylov": ("_trustregion", "_minimize_trust_region"),
    },
    "root": {
        "hybr": ("_minpack_py", "_root_hybr"),
        "lm": ("_root", "_root_leastsq"),
        **{
            m: ("_root", "_root_nonlin_solve")
            for m in (
                "broyden1",
                "broyden2",
                "anderson",
                "linearmixing",
                "diagbroyden",
                "excitingmixing",
                "krylov",
            )
        },
        "df-sane": ("_spectral", "_root_df_sane"),
    },
    "minimize_scalar": {
        "brent": ("_optimize", "_minimize_scalar_brent"),
        "golden": ("_optimize", "_minimize_scalar_golden"),
        "bounded": ("_optimize", "_minimize_scalar_bounded"),
    },
}
#: Arguments of scipy's functions (and of their implementations) that the Op sets itself.
_SET_BY_THE_OP = {
    *("fun", "func", "f", "x0", "args", "method", "jac", "grad", "hess", "hessp"),
    *("bounds", "constraints", "bracket", "brack", "fprime", "fprime2"),
}
#: ... and of the implementations only (the rest of their keyword parameters are `options`).
_NOT_OPTIONS = {
    *_SET_BY_THE_OP,
    *("callback", "_callback", "_method", "unknown_options"),
    "subproblem",  # set by each trust-region method itself
}
#: Options that count iterations or evaluations: scipy needs integers (a float fails at run time).
_COUNTS = {"maxiter", "maxfev", "maxfun", "maxls", "maxcor", "nit", "max_iter"}
#: root_scalar's `options` are merged into its keyword arguments.
_ROOT_SCALAR_OPTIONS = ("xtol", "rtol", "maxiter")


def scipy_methods(routine: str) -> tuple[str, ...]:
    """The methods of scipy.optimize's `routine` this backend runs, in scipy's documented order."""
    return tuple(_IMPLEMENTATIONS[routine])


def _guarded(solver: Callable, *args, ignore: type[Warning] | None = None, **kwargs):
    """``solver(*args, **kwargs)``, or None where scipy's own code raised one of
    `_SOLVER_ERRORS` (noted in the trace): the one place where a scipy solver's exception becomes
    ``success=False``. Warnings of the category `ignore` are silenced: they announce a failure
    the result reports anyway."""
    try:
        with warnings.catch_warnings():
            if ignore is not None:
                warnings.simplefilter("ignore", ignore)
            return solver(*args, **kwargs)
    except _SOLVER_ERRORS as err:
        if _through_our_code(err):
            raise
        note(f"{type(err).__name__}: {err}")
        return None


def _through_our_code(err: BaseException) -> bool:
    """Whether `err` was raised in (or below) one of our callbacks rather than by scipy: its
    traceback, past `_guarded`'s own frame, passes through this package."""
    tb = err.__traceback__
    tb = tb.tb_next if tb is not None else None  # (the first frame is `_guarded`'s)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            return True
        tb = tb.tb_next
    return False


def _status(success: bool, x) -> SolverStatus:
    """The status of a scipy solve that returned `x`: scipy's own failure unless x is not
    finite."""
    if success:
        return SolverStatus.CONVERGED
    if not np.all(np.isfinite(x)):
        return SolverStatus.NONFINITE
    return SolverStatus.SOLVER_FAILED


def _counts(res) -> tuple[int, int]:
    """Iterations and evaluations of a scipy OptimizeResult (-1 where the method keeps none)."""
    return getattr(res, "nit", -1), getattr(res, "nfev", -1)


def check_scipy_options(routine: str, method: str, options: Mapping) -> None:
    """Refuse, when the graph is built, `optimizer_kwargs` that scipy would reject (or ignore
    with a warning) at the first solve: a key that is not an argument of
    ``scipy.optimize.<routine>``, an entry of ``options`` that `method` does not take (read off
    the signature of scipy's implementation of `method`), a non-integer iteration count."""
    import scipy.optimize

    accepted = [
        name
        for name in inspect.signature(getattr(scipy.optimize, routine)).parameters
        if name not in _SET_BY_THE_OP
    ]
    method_options = _method_options(routine, method)
    for key, value in options.items():
        if key == "trace":  # pymc_optim's own key, validated by _trace
            continue
        if key not in accepted:
            hint = (
                f" {key!r} is an option of method {method!r}: pass it inside `options`, e.g. "
                f"`optimizer_kwargs={{'options': {{{key!r}: {value!r}}}}}`."
                if method_options is not None and key in method_options
                else ""
            )
            raise ValueError(
                f"`optimizer_kwargs` holds keyword arguments of `scipy.optimize.{routine}`, which "
                f"takes {', '.join(map(repr, accepted))} (and pymc_optim's 'trace'); got "
                f"{key!r}.{hint}"
            )
        _check_count(f"optimizer_kwargs[{key!r}]", key, value)
    nested = options.get("options")
    if nested is None:
        return
    if not isinstance(nested, Mapping):
        raise TypeError(
            f"`optimizer_kwargs['options']` must be a dict of the method's options; got "
            f"{type(nested).__name__}."
        )
    if routine == "root_scalar":
        method_options = _ROOT_SCALAR_OPTIONS
    for key, value in nested.items():
        if method_options is not None and key not in method_options:
            raise ValueError(
                f"`optimizer_kwargs['options']` holds the options of method {method!r} of "
                f"`scipy.optimize.{routine}`, which are {', '.join(map(repr, method_options))}; "
                f"got {key!r}. See `scipy.optimize.show_options({routine!r}, {method!r})`."
            )
        _check_count(f"optimizer_kwargs['options'][{key!r}]", key, value)


def _method_options(routine: str, method: str) -> list[str] | None:
    """The options `method` takes, from its implementation's signature (None if unknown)."""
    import importlib

    where = _IMPLEMENTATIONS.get(routine, {}).get(method.lower())
    if where is None:
        return None
    try:
        function = getattr(importlib.import_module(f"scipy.optimize.{where[0]}"), where[1])
    except (ImportError, AttributeError):  # another scipy layout: scipy checks at run time
        return None
    return [
        name
        for name, p in inspect.signature(function).parameters.items()
        if name not in _NOT_OPTIONS and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]


def _check_count(argument: str, key: str, value) -> None:
    if key not in _COUNTS or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(
            f"`{argument}` counts iterations or evaluations: it must be a non-negative integer; "
            f"got {value!r}. Pass e.g. {max(int(value), 1) if _is_real(value) else 100}."
        )


def _is_real(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and np.isfinite(value)


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
    res = _guarded(
        scipy_minimize,
        fun,
        packer.pack(x0s),
        method=method,
        jac=True if use_jac else None,
        **extra,
        **without_trace(options),
    )
    if res is None:
        return packer.failed(), False, -1, -1, SolverStatus.SOLVER_FAILED
    note(res.message)
    success = bool(res.success) and bool(np.all(np.isfinite(res.x)))
    return packer.unpack(res.x), success, *_counts(res), _status(success, res.x)


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
    # trust-constr warns that equality constraints are solved "approximately", and about
    # singular Jacobians when started infeasible; both end in the KKT check.
    res = _guarded(
        scipy_minimize,
        problem.value_and_grad,
        np.asarray(x0, dtype="float64").ravel(),
        method=method,
        jac=True,
        ignore=UserWarning,
        **extra,
        **without_trace(options),
    )
    if res is None:
        return np.full(np.size(x0), np.nan), False, -1, -1, SolverStatus.SOLVER_FAILED
    note(res.message)
    success = bool(res.success) and bool(np.all(np.isfinite(res.x)))
    return res.x, success, *_counts(res), _status(success, res.x)


def root(
    fns: dict, x0s: list[np.ndarray], params: list, *, method: str, use_jac: bool, options: dict
):
    from scipy.optimize import root as scipy_root

    packer = Packer(x0s)
    if use_jac:
        equations_and_jac = fns["equations_and_jac"]

        def fun(z):
            *F, J = equations_and_jac(*packer.unpack(z), *params)
            return _square(Packer.pack(F), z), J
    else:
        equations = fns["equations"]

        def fun(z):
            return _square(Packer.pack(equations(*packer.unpack(z), *params)), z)

    # quasi-Newton methods warn when a step is rejected; that ends in success=False.
    res = _guarded(
        scipy_root,
        fun,
        packer.pack(x0s),
        method=method,
        jac=True if use_jac else None,
        ignore=RuntimeWarning,
        **without_trace(options),
    )
    if res is None:
        return packer.failed(), False, -1, -1, SolverStatus.SOLVER_FAILED
    success = _root_success(method, res, fun, use_jac)
    return packer.unpack(res.x), success, *_counts(res), _status(success, res.x)


def _root_success(method: str, res, fun, use_jac: bool) -> bool:
    """Whether the returned point solves the equations: max|F(x*)| ≤ ROOT_RESIDUAL_TOL there.

    scipy's own status is only a hint. hybr and lm stop on the size of their steps or on the
    decrease of ‖F‖², not on ‖F‖: hybr reports "not making good progress" at residuals of
    1e-16, and lm reports success at a local minimum of ‖F‖² that is not a root (|F| = 1). The
    other methods stop on the residual itself (``fatol``, default 6e-6, for the nonlinear
    solvers; ``fatol + ftol·‖F(x0)‖`` for df-sane): their reported success is kept as well.
    """
    if not np.all(np.isfinite(res.x)):
        return False
    try:
        F = fun(res.x)
    except ProblemUndefined as err:
        note(f"{res.message}; the residual at the returned point raised {err}")
        return False
    residual = float(np.max(np.abs(F[0] if use_jac else F), initial=0.0))
    if residual <= ROOT_RESIDUAL_TOL:
        note(f"{res.message} (accepted: max|F| = {residual:.3g} ≤ {ROOT_RESIDUAL_TOL:g})")
        return True
    if bool(res.success) and method.lower() not in _STEP_TESTED_ROOT_METHODS:
        note(res.message)
        return bool(np.isfinite(residual))
    note(f"{res.message} (refused: max|F| = {residual:.3g} > {ROOT_RESIDUAL_TOL:g})")
    return False


def _square(F: np.ndarray, z: np.ndarray) -> np.ndarray:
    """F, if it has as many elements as the unknowns z (sizes known only at run time)."""
    if F.size != z.size:
        raise ProblemUndefined(
            f"the equations have {F.size} elements at these parameters, for {z.size} unknowns "
            "(a square system is needed)"
        )
    return F


def _scalar_fn(fn: Callable, dtype, params: list) -> Callable[[float], float]:
    """A compiled 0-d function of the unknown as the float-to-float callable scipy's scalar
    solvers take."""
    return lambda z: float(fn(np.asarray(z, dtype=dtype), *params)[0])


def _scalar_result(res, dtype, *, root: str, converged: str, message: str, counts: Callable):
    """A scalar solver's scipy result (None if it raised) as the Op's (x*, success, counts);
    `root`, `converged` and `message` name the result's attributes, which differ between
    scipy's ``minimize_scalar`` and ``root_scalar``."""
    if res is None:
        return [np.asarray(np.nan, dtype=dtype)], False, -1, -1, SolverStatus.SOLVER_FAILED
    note(getattr(res, message))
    z = getattr(res, root)
    success = bool(getattr(res, converged)) and bool(np.isfinite(z))
    return [np.asarray(z, dtype=dtype)], success, *counts(res), _status(success, z)


# minimize_scalar and root_scalar are parallel on purpose: the two scipy routines take different
# arguments and name their results differently; what they share, the float wrapper and the
# result tail, is `_scalar_fn` and `_scalar_result`.
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

    dtype = np.asarray(x0).dtype
    res = _guarded(
        scipy_minimize_scalar,
        _scalar_fn(fns["value"], dtype, params),
        bracket=bracket,
        bounds=bounds,
        method=method,
        **without_trace(options),
    )
    return _scalar_result(
        res, dtype, root="x", converged="success", message="message", counts=_counts
    )


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
    derivatives = {
        name: _scalar_fn(fns[name], dtype, params) for name in ("fprime", "fprime2") if name in fns
    }
    start = {} if bracket is not None else {"x0": float(x0)}
    # newton/secant warn on a zero derivative or tolerance miss; both give converged=False
    res = _guarded(
        scipy_root_scalar,
        _scalar_fn(fns["equation"], dtype, params),
        method=method,
        bracket=bracket,
        ignore=RuntimeWarning,
        **start,
        **derivatives,
        **without_trace(options),
    )
    return _scalar_result(
        res,
        dtype,
        root="root",
        converged="converged",
        message="flag",
        counts=lambda res: (res.iterations, res.function_calls),
    )
