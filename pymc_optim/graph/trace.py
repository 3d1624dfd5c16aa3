"""Opt-in traces of the scipy-backed solves: every point evaluated, its value and gradient norm.

Pass ``optimizer_kwargs={"trace": True}`` (or ``"trace": n`` to keep the latest n solves) to
`minimize`, `root`, `minimize_scalar` or `root_scalar`; after calling a compiled function,
``pmo.solver_trace(x_star)`` returns one :class:`SolveTrace` per solve, oldest first. Without the
option nothing is wrapped or recorded: the default path is unchanged.

How it works: for a traced Op, `SolverOp.perform` hands the solver wrapped copies of its compiled
inner functions, which log each call's x and outputs; the scipy callbacks in
:mod:`pymc_optim.backends.scipy.callbacks` report scipy's message (or the exception that ended
the solve) through :func:`note`. Traces are a log kept by this module for each traced Op (by
identity, released with the Op), in the process that ran it: with ``pm.sample(cores>1)`` the
chains' processes keep their own (use ``cores=1`` to look at them), and a pickled Op starts
without any.

The graph-native solvers (``method="newton"``, `fixed_point`) run compiled loops under the
numba and JAX backends, where no Python code sees the iterations; for them (and for every solver)
``pmo.solution_info(x_star)`` gives the iteration count, evaluation count and final objective or
residual norm as ordinary graph outputs, in every backend.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = [
    "DEFAULT_SOLVES",
    "Recorder",
    "SolveTrace",
    "note",
    "recorded",
    "trace_limit",
    "trace_store",
    "without_trace",
]

#: ``trace=True`` keeps the latest 100 solves: enough to catch a failing one among a sampler's
#: calls, with bounded memory (a solve's trace holds every evaluated x).
DEFAULT_SOLVES = 100


class SolveTrace(NamedTuple):
    """What one solve did, from :func:`solver_trace`.

    Attributes
    ----------
    params : the parameter values of this solve (the Op's parameter inputs, in order).
    x0 : the initial guess(es), one array per control.
    x_star : the returned solution(s), one array per control (NaN where the solve raised).
    success, n_iterations, n_evaluations : as in :func:`solution_info`.
    x : (k, n) array, every point the solver evaluated, flattened (line-search trials included),
        in order.
    value : (k,) array, the objective there (minimization) or the residual norm ‖F‖ (roots).
    gradient_norm : (k,) array, ‖∇ₓf‖₂ where the solver evaluated the gradient, NaN elsewhere.
    message : scipy's message, or the exception that ended the solve.
    status : why the solve ended, a `SolverStatus` code as in :func:`solution_info`
        (``SOLVER_FAILED`` where scipy gave up: `message` says why).
    """

    params: list
    x0: list
    x_star: list
    success: bool
    n_iterations: int
    n_evaluations: int
    x: np.ndarray
    value: np.ndarray
    gradient_norm: np.ndarray
    message: str
    status: int = 0


def _norm(arrays) -> float:
    return float(np.sqrt(sum(np.sum(np.square(a, dtype="float64")) for a in arrays)))


#: How an evaluation of each named inner function reads as (value, gradient norm); functions not
#: listed (Hessians, Hessian-vector products, derivatives for Halley) are not logged.
_SUMMARIES: dict[str, Callable] = {
    "value_and_grad": lambda outs: (float(outs[0]), _norm(outs[1:])),
    "value": lambda outs: (float(outs[0]), np.nan),
    "equations_and_jac": lambda outs: (_norm(outs[:-1]), np.nan),
    "equations": lambda outs: (_norm(outs), np.nan),
    "equation": lambda outs: (_norm(outs), np.nan),
}


def trace_limit(options: dict | None) -> int:
    """How many solves to keep, from ``options["trace"]`` (0: no tracing)."""
    trace = (options or {}).get("trace", False)
    if trace is True:
        return DEFAULT_SOLVES
    if trace is False or trace is None:
        return 0
    if not isinstance(trace, int) or trace < 1:
        raise ValueError(
            f"`optimizer_kwargs['trace']` must be True, False or a positive number of solves to "
            f"keep; got {trace!r}."
        )
    return trace


def without_trace(options: dict) -> dict:
    """`options` for scipy: without our "trace" key (the same dict when there is none)."""
    if "trace" not in options:
        return options
    return {k: v for k, v in options.items() if k != "trace"}


_CURRENT = threading.local()


def note(message) -> None:
    """Record scipy's message for the solve being traced in this thread (no-op otherwise)."""
    recorder = getattr(_CURRENT, "recorder", None)
    if recorder is not None:
        recorder.message = str(message)


class Recorder:
    """Logs the calls of one solve's inner functions; `finish` turns them into a SolveTrace."""

    def __init__(self, fns: dict, n_controls: int):
        self.n_controls = n_controls
        self.points: list[np.ndarray] = []
        self.values: list[float] = []
        self.gradient_norms: list[float] = []
        self.message = ""
        self.fns = {name: self._wrap(name, fn) for name, fn in fns.items()}
        _CURRENT.recorder = self

    def _wrap(self, name: str, fn):
        summary = _SUMMARIES.get(name)
        if summary is None:
            return fn

        def logged(*args):
            outs = fn(*args)
            xs = args[: self.n_controls]
            self.points.append(np.concatenate([np.ravel(x).astype("float64") for x in xs]))
            value, gradient_norm = summary(outs)
            self.values.append(value)
            self.gradient_norms.append(gradient_norm)
            return outs

        return logged

    def finish(
        self, params, x0s, x_stars, success, n_iterations, n_evaluations, status=0
    ) -> SolveTrace:
        _CURRENT.recorder = None
        n = sum(int(np.size(x)) for x in x0s)
        return SolveTrace(
            params=[np.array(p, copy=True) for p in params],
            x0=[np.array(x, copy=True) for x in x0s],
            x_star=[np.array(x, copy=True) for x in x_stars],
            success=bool(success),
            n_iterations=int(n_iterations),
            n_evaluations=int(n_evaluations),
            x=np.array(self.points).reshape(len(self.points), n),
            value=np.array(self.values, dtype="float64"),
            gradient_norm=np.array(self.gradient_norms, dtype="float64"),
            message=self.message,
            status=int(status),
        )


#: id(op) → its latest solves; an entry is removed when its Op is garbage-collected.
_STORES: dict[int, deque] = {}


def trace_store(op, limit: int) -> deque:
    """Where `op`'s solves are recorded: the latest `limit` of them."""
    key = id(op)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = deque(maxlen=limit)
        weakref.finalize(op, _STORES.pop, key, None)
    return store


def recorded(op) -> list[SolveTrace]:
    """`op`'s recorded solves, oldest first (empty if it recorded none)."""
    return list(_STORES.get(id(op), ()))
