"""Numba backend: the graph-native loops compiled with numba, no object mode.

This module is a line-for-line port of :mod:`pymc_optim.backends.iterations`: numba's nopython
mode needs its own njit functions, closed over the Op's compiled inner graphs, and cannot call
the numpy loops (Python scalars, exceptions, fancy indexing). Change both together;
tests/backends/test_numba.py checks that they agree.

Imported by the package only when numba is installed; registers numba implementations of
`NewtonOp` and `FixedPointOp` (methods ``"iteration"`` and ``"anderson"``) so that
``pytensor.function(..., mode="NUMBA")`` and nutpie, which compiles PyMC models with numba, run
the graph-native solvers natively instead of calling ``perform`` in numba's object mode. The
scipy-backed Ops keep pytensor's object-mode fallback.

The loops are those of :mod:`pymc_optim.backends.iterations` line for line (same constants, stopping
rules, success and counters), on the flat float64 vector z, and they call the Op's inner graphs
compiled by pytensor's numba backend: ``system(z) -> (merit, F, A)`` and ``merit(z)`` for
Newton, ``update(z) -> T(z)`` for fixed points.

* Controls are packed into z and unpacked with the runtime shapes of the initial guesses; the
  parameters are passed through untouched. The adapters are generated as source for the Op's
  numbers of controls, parameters and extras (as pytensor does for Scan and OpFromGraph).
* Newton directions: ``diagonal`` divides element-wise, NaN where a diagonal entry is zero;
  ``dense`` and ``block_diagonal`` run pytensor's numba ``Solve`` (LAPACK getrf + getrs, one
  per block), which returns NaN when getrf reports an exactly zero pivot. That is the criterion
  under which ``numpy.linalg.solve`` raises ``LinAlgError`` (gesv = getrf + getrs), and the
  numpy loop then puts NaN in the singular blocks, so a singular system takes the same branch
  as there: for minimization the step falls back to −F, for root finding the solve stops with
  ``success=False``. ``sparse`` runs the sparse Cholesky solve (natively,
  `pymc_optim.backends.numba_sparse`), NaN where A is not positive definite, as its
  ``solve_numpy`` raising does in the numpy loop. The curvature
  test at a minimum is the structure's own (`LinearStructure.positive_definite`: pytensor's
  numba ``Cholesky`` with ``on_error="nan"`` per block, A > 0 on a diagonal), compiled by
  pytensor's numba backend.
* Batches (``NewtonOp.batch_ndim``): the loop takes ``rows`` (B, n), problem b's elements of z,
  and decides per problem, as the numpy loop does.
* The state `NewtonOp` keeps between solves (the warm start and its canonical step, the chord
  steps of `newton.sequential_solve`) lives in per-thread buffers of
  `pymc_optim.backends.numba_runtime`, keyed by the compiled solver.
* The driver, with the loop inlined, is compiled once per process and solver key (and kept on
  numba's disk cache under it) and called through its address (`numba_outline.outlined`):
  numba would otherwise compile it again inside every function that calls ``solver``.
* Nothing raises out of the loop. An exception from the inner graphs (a raising
  ``CheckAndRaise``, a size known only at run time that disagrees) is caught and reported as
  NaN solutions with ``success=False`` and counters −1, as ``SolverOp.perform`` reports
  `ProblemUndefined`. Numba's nopython mode catches no exception by class (only a bare
  ``except`` or ``except Exception``), so here, unlike in the C backend, an error of the
  loop's own code is reported the same way: the numpy loop, which the tests run against this
  one, is where such a bug surfaces.
"""

from __future__ import annotations

import functools
import inspect
import math
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.aliasing import add_supervisor_to_fgraph, insert_deepcopy
from pytensor.compile.io import In, Out
from pytensor.compile.mode import NUMBA
from pytensor.graph.fg import FunctionGraph
from pytensor.link.numba.cache import compile_numba_function_src
from pytensor.link.numba.dispatch.basic import (
    numba_funcify_and_cache_key,
    numba_njit,
    register_funcify_and_cache_key,
)

from pymc_optim._logging import announce_compilation
from pymc_optim.backends import iterations as _iterations
from pymc_optim.backends import numba_runtime
from pymc_optim.backends.fixed_point import FixedPointOp
from pymc_optim.backends.iterations import (
    ARMIJO,
    CHORD_CONTRACTION,
    MAX_BACKTRACKS,
    ROUNDING,
    STEP_TOL,
)
from pymc_optim.backends.newton import CANONICAL_BITS, NewtonOp, extrapolated_start
from pymc_optim.backends.numba_outline import outlined
from pymc_optim.backends.numba_runtime import (
    BLAS_THREADS_SETTABLE,
    copy_into,
    count_failure,
    failure_key,
    set_blas_threads,
    solver_buffer,
    warn_failure,
)
from pymc_optim.graph.failure_ops import CountFailures, WarnOnFailure
from pymc_optim.graph.solver_op import SolverOp, inner_mode
from pymc_optim.graph.status import SolverStatus
from pymc_optim.linalg.structure import LinearStructure

__all__: list[str] = []

#: The loops compare floats exactly as numpy does: no fast-math reassociation in them.
_njit = functools.partial(numba_njit, fastmath=False)
#: What the solve's driver calls (the loop, the canonical step, the chord steps, the inner graphs'
#: adapters) is inlined into it in numba's IR: one library, which LLVM optimizes and compiles to
#: machine code once (numba compiles a callee's library and then, linked into its caller's,
#: again). The driver and what ``solver`` calls inside its ``try`` block stay functions of their
#: own: numba's ``try`` catches the exceptions of calls, not of code inlined into the block.
_inlined = functools.partial(numba_njit, fastmath=False, inline="always")

#: The `SolverStatus` codes as plain ints: numba freezes them into the loops as constants.
_CONVERGED, _MAX_ITER, _NONFINITE, _LINE_SEARCH_FAILED, _NOT_POSITIVE_DEFINITE, _SINGULAR = (
    int(SolverStatus.CONVERGED),
    int(SolverStatus.MAX_ITER),
    int(SolverStatus.NONFINITE),
    int(SolverStatus.LINE_SEARCH_FAILED),
    int(SolverStatus.NOT_POSITIVE_DEFINITE),
    int(SolverStatus.SINGULAR),
)
_INVALID_PARAMETERS = int(SolverStatus.INVALID_PARAMETERS)

#: Anderson's memory, the default of the numpy loop.
_ANDERSON_MEMORY = inspect.signature(_iterations.anderson).parameters["memory"].default

#: Part of every cache key: a change to this module or to the runtime it calls (whose code a
#: cached solver holds) invalidates numba's on-disk cache.
_SOURCE_KEY = sha256(
    Path(__file__).read_bytes() + Path(numba_runtime.__file__).read_bytes()
).hexdigest()


# --- inner graphs ------------------------------------------------------------------------------
def _numba_function(inputs, outputs):
    """A numba function of `inputs` returning the tuple of `outputs`, and its cache key.

    Rewritten and protected exactly as pytensor compiles an OpFromGraph's inner graph.
    """
    fgraph = FunctionGraph(list(inputs), list(outputs), clone=True)
    input_specs = [In(x, borrow=True, mutable=False) for x in fgraph.inputs]
    add_supervisor_to_fgraph(fgraph=fgraph, input_specs=input_specs, accept_inplace=True)
    inner_mode(NUMBA).optimizer(fgraph)
    output_specs = [Out(o, borrow=False) for o in fgraph.outputs]
    insert_deepcopy(fgraph, wrapped_inputs=input_specs, wrapped_outputs=output_specs)
    return numba_funcify_and_cache_key(fgraph, squeeze_output=False, fgraph_name="pymc_optim_inner")


@functools.cache
def _solve_function(structure: LinearStructure):
    """d = A⁻¹ F with A compact in `structure`, NaN where A is singular: the structure's
    `solve_or_nan`, the graph of the numpy loop's `solve_or_nan_numpy`.

    One per structure and process: numba compiles it once for all the Ops that use it.
    """
    A = pt.tensor("A", dtype="float64", shape=(None,) * structure.compact_ndim)
    F = pt.vector("F", dtype="float64")
    solve_fn, key = _numba_function([A, F], [structure.solve_or_nan(A, F)])

    @_njit
    def solve(A, F):
        return solve_fn(A, F)[0]

    return solve, key


# --- numerical helpers (same arithmetic as the numpy loops) ---------------------------------------
@_njit
def _max_abs(v):
    """``np.max(np.abs(v), initial=0.0)``, NaN if v holds a NaN."""
    out = 0.0
    for i in range(v.size):
        a = abs(v[i])
        if np.isnan(a):
            return np.nan
        if a > out:
            out = a
    return out


@_njit
def _where_rows(flags, owner, a, b):
    """``np.where(flags[owner], a, b)``: per element, a where its problem's flag is set."""
    out = np.empty(a.size)
    for i in range(a.size):
        out[i] = a[i] if flags[owner[i]] else b[i]
    return out


@_njit
def _where(flags, a, b):
    """``np.where(flags, a, b)`` on per-problem vectors of one shape."""
    out = np.empty(a.size)
    for i in range(a.size):
        out[i] = a[i] if flags[i] else b[i]
    return out


@_njit
def _step_rows(flags, owner, z, t, d):
    """``np.where(flags[owner], z + t[owner] * d, z)``: the step of length t (per problem)."""
    out = np.empty(z.size)
    for i in range(z.size):
        b = owner[i]
        out[i] = z[i] + t[b] * d[i] if flags[b] else z[i]
    return out


@_njit
def _dot(u, v):
    total = 0.0
    for i in range(u.size):
        total += u[i] * v[i]
    return total


@_njit
def _all_finite(v):
    for i in range(v.size):
        if not np.isfinite(v[i]):
            return False
    return True


@_njit
def _rows_max_abs(v, rows):
    """Per problem: ``np.max(np.abs(v[rows]), axis=1, initial=0.0)``, NaN if a NaN is there."""
    out = np.zeros(rows.shape[0])
    for b in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            a = abs(v[rows[b, j]])
            if np.isnan(a):
                out[b] = a
                break
            if a > out[b]:
                out[b] = a
    return out


@_njit
def _rows_dot(u, v, rows):
    out = np.zeros(rows.shape[0])
    for b in range(rows.shape[0]):
        total = 0.0
        for j in range(rows.shape[1]):
            total += u[rows[b, j]] * v[rows[b, j]]
        out[b] = total
    return out


@_njit
def _rows_finite(v, rows):
    out = np.ones(rows.shape[0], dtype=np.bool_)
    for b in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            if not np.isfinite(v[rows[b, j]]):
                out[b] = False
                break
    return out


@_njit
def _stop(running, success, n_iterations, status, which, ok, curved, iteration, reason):
    """`_iterations._newton`'s ``stop``, in place: successful where `curved` (`ok`, and A
    positive definite for minimization: the caller's test), `reason` where `ok` is False."""
    for b in range(running.size):
        if which[b]:
            success[b] = curved[b]
            n_iterations[b] = iteration
            running[b] = False
            if curved[b]:
                status[b] = _CONVERGED
            elif ok[b]:
                status[b] = _NOT_POSITIVE_DEFINITE
            else:
                status[b] = reason


@functools.cache
def _per_problem_function(structure: LinearStructure, test: str):
    """Per problem: the structure's own test of A, `"positive_definite"` or `"finite"` (one flag
    per independent part of A, `_iterations.per_problem`) compiled by pytensor's numba backend;
    a part's flag goes to the problem owning its first element."""
    A = pt.tensor("A", dtype="float64", shape=(None,) * structure.compact_ndim)
    flags_fn, key = _numba_function([A], [getattr(structure, test)(A)])

    @_njit
    def per_problem(A, owner, n_problems):
        good = flags_fn(A)[0]
        width = owner.size // good.size
        out = np.ones(n_problems, dtype=np.bool_)
        for j in range(good.size):
            if not good[j]:
                out[owner[j * width]] = False
        return out

    return per_problem, key


# --- the loops of `_iterations`, closed over the problem's compiled functions ---------------------
def _newton_loop(
    system,
    merit,
    solve,
    positive_definite,
    finite_jacobian,
    *,
    minimization: bool,
    tol: float,
    max_iter: int,
    final_step: bool = True,
    chord: bool = False,
):
    """`_iterations._newton`, decision for decision, on B stacked problems (``rows``).

    ``newton(z, args, rows, reference)`` returns ``(z, success, n_iterations, n_evaluations,
    status, A)``, A the Jacobian of the last evaluated iterate. With `chord`, one problem starts
    with chord steps on `reference` (a compact Jacobian flattened; none if its size is not A's);
    ``final_step=False`` returns the last evaluated iterate instead of taking the final step.
    """
    chord_steps = _chord_steps_function(
        system, solve, finite_jacobian, minimization=minimization, tol=tol, enabled=chord
    )

    @_inlined
    def newton(z, args, rows, reference):
        n_problems = rows.shape[0]
        owner = np.empty(z.size, dtype=np.int64)
        for b in range(n_problems):
            for j in range(rows.shape[1]):
                owner[rows[b, j]] = b
        m, F, A = system(z, args)
        z, m, F, A, chord_evaluations = chord_steps(z, m, F, A, reference, args, owner)
        n_evaluations = np.full(n_problems, 1 + chord_evaluations, dtype=np.int64)
        n_iterations = np.full(n_problems, max_iter, dtype=np.int64)
        status = np.full(n_problems, _MAX_ITER, dtype=np.int64)
        running = np.ones(n_problems, dtype=np.bool_)
        success = np.zeros(n_problems, dtype=np.bool_)
        everything = np.ones(n_problems, dtype=np.bool_)
        nothing = np.zeros(n_problems, dtype=np.bool_)
        # per problem: a full Newton step led to z, from max|F| `F_max_previous`, A there
        stepped, F_max_previous, A_previous = nothing.copy(), np.zeros(n_problems), A
        for iteration in range(max_iter + 1):
            ok = np.isfinite(m) & _rows_finite(F, rows)
            _stop(
                running, success, n_iterations, status, running & ~ok, ok, ok, iteration, _NONFINITE
            )
            F_max = _rows_max_abs(F, rows)
            converged = running & (F_max <= tol)
            chord = np.any(converged)
            for b in range(n_problems):
                if running[b] and not (
                    converged[b]
                    and stepped[b]
                    and _chord_final_step(F_max[b], F_max_previous[b], tol)
                ):
                    chord = False
            A_step = A_previous if chord else A
            # NaN where A is singular (not solved once every problem stopped on a NaN)
            d = -solve(A_step, F) if np.any(running) else np.zeros(z.size)
            curved = ok
            if minimization and np.any(converged):
                curved = ok & positive_definite(A_step, owner, n_problems)
            _stop(
                running, success, n_iterations, status, converged, ok, curved, iteration, _NONFINITE
            )
            if final_step:  # the final Newton step: no evaluation, the error squared
                final = converged & success & _rows_finite(d, rows)
                z = _where_rows(final, owner, z + d, z)
            if iteration == max_iter or not np.any(running):
                break
            if minimization:
                slope = _rows_dot(F, d, rows)
                is_newton_step = np.isfinite(slope) & (slope < 0)
                d = _where_rows(is_newton_step, owner, d, -F)
                slope = _where(is_newton_step, slope, -_rows_dot(F, F, rows))
            else:
                is_newton_step = _rows_finite(d, rows)
                singular = running & ~is_newton_step
                _stop(
                    running,
                    success,
                    n_iterations,
                    status,
                    singular,
                    nothing,
                    nothing,
                    iteration,
                    _SINGULAR,
                )
                slope = -2.0 * m
            tiny = _rows_max_abs(d, rows) <= STEP_TOL * (1.0 + _rows_max_abs(z, rows))
            tiny = running & is_newton_step & tiny
            if np.any(tiny):
                z = _where_rows(tiny, owner, z + d, z)
                tiny_ok = tiny.copy()
                if minimization:
                    tiny_ok = tiny_ok & positive_definite(A, owner, n_problems)
                _stop(
                    running,
                    success,
                    n_iterations,
                    status,
                    tiny,
                    tiny,
                    tiny_ok,
                    iteration + 1,
                    _NONFINITE,
                )
            if not np.any(running):
                break
            z_full = _where_rows(running, owner, z + d, z)
            m_full, F_full, A_full = system(z_full, args)
            n_evaluations += running
            finite_full = np.isfinite(m_full) & _rows_finite(F_full, rows)
            finite_full = finite_full & finite_jacobian(A_full, owner, n_problems)
            accepted = running & finite_full & (m_full <= m + ARMIJO * slope)
            if minimization:
                unseen = running & is_newton_step & (-slope <= ROUNDING * (1.0 + np.abs(m)))
                smaller = finite_full & (_rows_max_abs(F_full, rows) < F_max)
                accepted = accepted | (unseen & smaller)
                stalled = unseen & ~accepted
                if np.any(stalled):
                    stalled_ok = everything & positive_definite(A, owner, n_problems)
                    _stop(
                        running,
                        success,
                        n_iterations,
                        status,
                        stalled,
                        everything,
                        stalled_ok,
                        iteration + 1,
                        _NONFINITE,
                    )
            backtrack = running & ~accepted
            if not np.any(backtrack):
                z = _where_rows(accepted, owner, z_full, z)
                stepped, F_max_previous, A_previous = accepted & is_newton_step, F_max, A
                m, F, A = m_full, F_full, A_full
                continue
            stepped = nothing.copy()
            t = accepted.astype(np.float64)
            t_try = np.ones(n_problems)
            searching = backtrack.copy()
            fresh = backtrack & running
            settled = False
            z_new, m_new, F_new, A_new = z, m, F, A
            for _ in range(MAX_BACKTRACKS - 1):
                t_try = _where(searching, 0.5 * t_try, t_try)
                trial = merit(_step_rows(searching, owner, z, t_try, d), args)
                n_evaluations += searching
                found = searching & (trial <= m + ARMIJO * t_try * slope)  # False for NaN
                t = _where(found, t_try, t)
                searching = searching & ~found
                if np.any(searching):
                    continue
                z_new = _step_rows(running, owner, z, t, d)
                m_new, F_new, A_new = system(z_new, args)
                n_evaluations += fresh
                finite_new = np.isfinite(m_new) & _rows_finite(F_new, rows)
                finite_new = finite_new & finite_jacobian(A_new, owner, n_problems)
                searching = fresh & ~finite_new
                fresh = searching
                if not np.any(searching):
                    settled = True
                    break
            if not settled:
                _stop(
                    running,
                    success,
                    n_iterations,
                    status,
                    searching,
                    nothing,
                    nothing,
                    iteration,
                    _LINE_SEARCH_FAILED,
                )
                z_new = _step_rows(running, owner, z, t, d)
                m_new, F_new, A_new = system(z_new, args)
                n_evaluations += fresh & running
                # (the system at the point of a search ended early is checked at the next
                # iteration's start, which fails it there)
            z, m, F, A = z_new, m_new, F_new, A_new
        return z, success, n_iterations, n_evaluations, status, A

    return newton


def _chord_steps_function(system, solve, finite_jacobian, *, minimization, tol, enabled):
    """`_iterations._chord_steps` for one problem: ``chord_steps(z, m, F, A, reference, args,
    owner)`` → ``(z, m, F, A, n_evaluations)`` at the last kept iterate (the inputs unchanged
    when not `enabled` or `reference` does not have A's size)."""
    if not enabled:

        @_inlined
        def no_chord_steps(z, m, F, A, reference, args, owner):
            return z, m, F, A, 0

        return no_chord_steps

    @_inlined
    def chord_steps(z, m, F, A, reference, args, owner):
        n_evaluations = 0
        if reference.size == 0 or reference.size != A.size:
            return z, m, F, A, n_evaluations
        reference = reference.reshape(A.shape)
        F_max = _max_abs(F)
        while F_max > tol and np.isfinite(m[0]) and np.isfinite(F_max):
            d = -solve(reference, F)
            slope = _dot(F, d)
            if not (np.isfinite(slope) and (slope < 0 or not minimization)):
                break
            z_new = z + d
            m_new, F_new, A_new = system(z_new, args)
            n_evaluations += 1
            F_max_new = _max_abs(F_new)
            kept = np.isfinite(m_new[0]) and F_max_new <= CHORD_CONTRACTION * F_max
            kept = kept and finite_jacobian(A_new, owner, 1)[0]
            if kept and minimization:
                unseen = -slope <= ROUNDING * (1.0 + abs(m[0]))
                kept = m_new[0] <= m[0] + ARMIJO * slope or unseen
            if not kept:
                break
            z, m, F, A, F_max = z_new, m_new, F_new, A_new, F_max_new
        return z, m, F, A, n_evaluations

    return chord_steps


def _canonical_step_function(system, solve):
    """`newton.canonical_step` on B stacked problems: ``canonical(z, success, args, rows)`` →
    ``(z, n_evaluations)``."""

    @_inlined
    def canonical(z, success, args, rows):
        n_problems = rows.shape[0]
        if not np.any(success):
            return z, np.zeros(n_problems, dtype=np.int64)
        z, r = z.copy(), np.empty(z.size)
        for b in range(n_problems):
            scale = max(1.0, _max_abs(z[rows[b]]))  # (NaN stays NaN: the step fails)
            q = math.ldexp(1.0, math.frexp(scale)[1] - CANONICAL_BITS)
            for j in range(rows.shape[1]):
                i = rows[b, j]
                r[i] = np.rint(z[i] / q) * q  # exact: q is a power of two
        _, F, A = system(r, args)
        step = r - solve(A, F)
        ok = success & _rows_finite(step, rows)
        for b in range(n_problems):
            if ok[b]:
                for j in range(rows.shape[1]):
                    z[rows[b, j]] = step[rows[b, j]]
        return z, success.astype(np.int64)

    return canonical


def _newton_driver(newton, canonical, *, warm_start: bool, sequential: bool, predictor: bool, key):
    """``driver(z0, args, rows, theta, continued)`` → ``(z, success, n_iterations,
    n_evaluations, status)``: the loop as `NewtonOp.solve` runs it, with this thread's state kept in
    `numba_runtime` buffers under `key` (and ``key + 1``).

    * `warm_start`: from the last successful solution of this solver in this thread (moved
      along the secant of the last two with `predictor`), from z0 again if that fails, then
      `canonical`; a successful solve is remembered with θ (`theta`, the float parameters).
      An exception raised along the warm path fails the solve (the numpy loop repeats it
      from z0): the inner graphs' parameter checks are −inf there (`INNER_REWRITES`), and a
      try block here doubled the loop's compile time.
    * `sequential`: chord steps on the last successful solve's Jacobian unless `continued` is
      False (a new sequence); the loop compiled with ``final_step=False``.
    """
    nothing = np.zeros(0)
    if sequential:

        @_njit
        def solve_in_sequence(z0, args, rows, theta, continued):
            header = solver_buffer(key, 2)  # [a Jacobian is stored, its size]
            reference = nothing
            if header.size == 2:
                if not continued:
                    header[0] = 0.0
                elif header[0] == 1.0:
                    reference = solver_buffer(key + 1, np.int64(header[1])).copy()
            z, success, n_iterations, n_evaluations, status, A = newton(z0, args, rows, reference)
            if header.size == 2 and np.all(success):
                data = solver_buffer(key + 1, A.size)
                if data.size == A.size:
                    copy_into(data, 0, np.ascontiguousarray(A).reshape(A.size))
                    header[0], header[1] = 1.0, A.size
            return z, success, n_iterations, n_evaluations, status

        return solve_in_sequence

    if not warm_start:

        @_njit
        def solve_cold(z0, args, rows, theta, continued):
            z, success, n_iterations, n_evaluations, status, _ = newton(z0, args, rows, nothing)
            return z, success, n_iterations, n_evaluations, status

        return solve_cold

    @_njit
    def solve_warm(z0, args, rows, theta, continued):
        n, p = z0.size, theta.size
        state = solver_buffer(key, _WARM_HEADER + 2 * (p + n))
        start = _warm_start_point(state, theta, n, predictor)
        n_problems = rows.shape[0]
        n_iterations = np.zeros(n_problems, dtype=np.int64)
        n_evaluations = np.zeros(n_problems, dtype=np.int64)
        # from the warm start, then (if there is none or it fails) from z0; one call site of
        # the loop, which LLVM would otherwise inline once per call
        warm = start.size == n
        for attempt in range(2):
            begin = start if warm and attempt == 0 else z0
            z, success, iterations, evaluations, status, _ = newton(begin, args, rows, nothing)
            n_iterations += iterations  # the counters include both solves
            n_evaluations += evaluations
            if not warm or attempt == 1 or np.all(success):
                break
        z, more_evaluations = canonical(z, success, args, rows)
        n_evaluations += more_evaluations
        if np.all(success) and state.size:
            _remember(state, theta, z)
        return z, success, n_iterations, n_evaluations, status

    return solve_warm


#: A warm-start buffer: [solutions stored (0–2), len θ, len z], then (θ, z) of the newer
#: solution, then of the older.
_WARM_HEADER = 3

_extrapolated_start = _njit(extrapolated_start)
_chord_final_step = _njit(_iterations.chord_final_step)
#: Compiled into the solvers from other modules: part of their cache key.
_OTHER_SOURCES = inspect.getsource(extrapolated_start) + inspect.getsource(
    _iterations.chord_final_step
)


@_njit
def _warm_start_point(state, theta, n, predictor):
    """`NewtonOp.warm_start_point` on a warm-start buffer; empty for none."""
    p = theta.size
    if state.size == 0 or state[0] < 1 or state[1] != p or state[2] != n:
        return np.zeros(0)
    newer, older = _WARM_HEADER, _WARM_HEADER + p + n
    start = state[newer + p : newer + p + n].copy()
    if not _all_finite(start):
        return np.zeros(0)
    if state[0] >= 2 and predictor:
        theta_1, theta_0 = state[newer : newer + p], state[older : older + p]
        previous = state[older + p : older + p + n]
        return _extrapolated_start(theta, theta_1, theta_0, start, previous)
    return start


@_njit
def _remember(state, theta, z):
    """Store (θ, z) as the newer solution, the newer one before it as the older."""
    p, n = theta.size, z.size
    newer, older = _WARM_HEADER, _WARM_HEADER + p + n
    if state[0] >= 1 and state[1] == p and state[2] == n:
        for i in range(p + n):
            state[older + i] = state[newer + i]
        state[0] = 2.0
    else:
        state[0] = 1.0
    state[1], state[2] = p, n
    copy_into(state, newer, theta)
    copy_into(state, newer + p, z)


def _fixed_point_loop(update, *, tol: float, max_iter: int):
    @_njit
    def fixed_point_iteration(z, args):
        for iteration in range(1, max_iter + 1):
            z_new = update(z, args)
            if not _all_finite(z_new):
                return z, False, iteration, iteration, _NONFINITE
            if _max_abs(z_new - z) <= tol:
                return z_new, True, iteration, iteration, _CONVERGED
            z = z_new
        return z, False, max_iter, max_iter, _MAX_ITER

    return fixed_point_iteration


def _anderson_loop(update, *, tol: float, max_iter: int, memory: int = _ANDERSON_MEMORY):
    eps = np.finfo(np.float64).eps

    @_njit
    def anderson(z, args):
        n = z.size
        g = update(z, args) - z
        # the last `memory` differences as columns, oldest first (the numpy loop's lists)
        dZ = np.empty((n, memory))
        dG = np.empty((n, memory))
        k = 0
        for iteration in range(1, max_iter + 1):
            if not _all_finite(g):
                return z, False, iteration, iteration, _NONFINITE
            if _max_abs(g) <= tol:
                return z + g, True, iteration, iteration, _CONVERGED
            if k > 0:
                G = np.ascontiguousarray(dG[:, :k])
                Z = np.ascontiguousarray(dZ[:, :k])
                rcond = eps * max(n, k)  # numpy's rcond=None
                gamma = np.linalg.lstsq(G, g, rcond)[0]
                z_new = z + g - np.dot(Z + G, gamma)
            else:
                z_new = z + g
            g_new = update(z_new, args) - z_new
            if k == memory:
                dZ[:, :-1] = dZ[:, 1:].copy()
                dG[:, :-1] = dG[:, 1:].copy()
                k -= 1
            dZ[:, k] = z_new - z
            dG[:, k] = g_new - g
            k += 1
            z, g = z_new, g_new
        return z, False, max_iter, max_iter, _MAX_ITER

    return anderson


# --- generated adapters: any number of controls, parameters and extras -------------------------
def _dtype(var) -> str:
    return f"np.{np.dtype(var.type.dtype).name}"


def _as_float64(expr: str, var) -> str:
    return expr if var.type.dtype == "float64" else f"{expr}.astype(np.float64)"


def _adapter_source(op: SolverOp, node, inner_outputs: dict) -> str:
    """Source of ``pack``, the inner-function adapters of ``(z, args)``, and ``solver``.

    ``solver(x0_0, ..., p_0, ..., e_0, ...)`` is the Op's numba function: it packs the initial
    guesses into z, runs ``loop(z, args)`` with ``args = (*x0s, *params)`` (the x0s give the
    controls' shapes back), and unpacks the solution. With two controls and one parameter::

        def system(z, args):
            x0 = args[0]; x1 = args[1]; p0 = args[2]
            u0 = np.empty(x0.shape, dtype=np.float64)
            for i in range(x0.size): u0.flat[i] = z[0 + i]
            u1 = ...  # from z[x0.size + i]
            r = system_fn(u0, u1, p0)
            return float(r[0].item()), r[1], r[2]

    Copies go element by element through ``.flat`` (any layout, 0-d included).
    """
    k, n_args = op.n_controls, op.n_controls + op.n_params
    xs = [f"x{i}" for i in range(k)]
    args = [*xs, *(f"p{i}" for i in range(op.n_params))]
    extras = [f"e{i}" for i in range(op.n_extras)]
    offsets = ["0"] + [" + ".join(f"{x}.size" for x in xs[: i + 1]) for i in range(k)]
    get_args = [f"    {name} = args[{i}]" for i, name in enumerate(args)]

    def unpack(dtypes):
        lines = []
        for i, (x, dtype) in enumerate(zip(xs, dtypes, strict=True)):
            lines += [
                f"    u{i} = np.empty({x}.shape, dtype={dtype})",
                f"    for i in range({x}.size):",
                f"        u{i}.flat[i] = z[{offsets[i]} + i]",
            ]
        return lines

    lines = ["def pack(args):", *get_args[:k], f"    z = np.empty({offsets[k]}, dtype=np.float64)"]
    for i, x in enumerate(xs):
        lines += [f"    for i, v in enumerate({x}.flat):", f"        z[{offsets[i]} + i] = v"]
    lines.append("    return z")

    call = f"({', '.join([*(f'u{i}' for i in range(k)), *args[k:n_args]])})"
    control_dtypes = [_dtype(x) for x in node.inputs[:k]]
    for name, outputs in inner_outputs.items():
        lines += [f"def {name}(z, args):", *get_args, *unpack(control_dtypes)]
        lines.append(f"    r = {name}_fn{call}")
        # the merit: one value per problem (a vector even for one problem)
        merit = "np.ascontiguousarray(r[0]).reshape(r[0].size).astype(np.float64)"
        if name == "system":
            F, A = (_as_float64(f"r[{i}]", out) for i, out in [(1, outputs[1]), (2, outputs[2])])
            lines.append(f"    return {merit}, {F}, {A}")
        elif name == "merit":
            lines.append(f"    return {merit}")
        else:
            lines.append(f"    return {_as_float64('r[0]', outputs[0])}")

    out_dtypes = [_dtype(x) for x in node.outputs[:k]]
    failed = [f"np.full({x}.shape, np.nan, dtype={d})" for x, d in zip(xs, out_dtypes, strict=True)]
    solutions = [f"u{i}" for i in range(k)]
    batch_ndim = getattr(op, "batch_ndim", None)
    invalid = _INVALID_PARAMETERS
    if batch_ndim is None:  # fixed points: one problem, scalars
        call_loop = "loop(pack(args), args)"
        lines += [
            "def as_diagnostics(success, n_iterations, n_evaluations, status, shape_of):",
            "    return (np.asarray(success), np.asarray(np.int64(n_iterations)), "
            "np.asarray(np.int64(n_evaluations)), np.asarray(np.int64(status)))",
        ]
        failure = (
            "np.asarray(False), np.asarray(np.int64(-1)), np.asarray(np.int64(-1)), "
            f"np.asarray(np.int64({invalid}))"
        )
        n_problems = "1"
    else:  # Newton: B stacked problems (`_newton.problem_rows`), diagnostics batch-shaped
        batch_shape = "(" + "".join(f"x0.shape[{i}], " for i in range(batch_ndim)) + ")"
        n_problems = " * ".join(["1", *(f"x0.shape[{i}]" for i in range(batch_ndim))])
        call_loop = "loop(pack(args), args, rows(args), theta(args), continued)"
        floats = [
            f"p{i}" for i, p in enumerate(node.inputs[k:n_args]) if p.type.dtype.startswith("float")
        ]
        lines += ["def theta(args):", *get_args[k:n_args]]
        if op.warm_start and not op.sequential:  # `newton._theta`: the float parameters
            total = " + ".join(["0", *(f"{p}.size" for p in floats)])
            lines.append(f"    out = np.empty({total}, dtype=np.float64)")
            lines.append("    offset = 0")
            for p in floats:
                lines += [
                    f"    for i, v in enumerate({p}.flat):",
                    "        out[offset + i] = v if np.isfinite(v) else 0.0",
                    f"    offset += {p}.size",
                ]
            lines.append("    return out")
        else:
            lines.append("    return np.zeros(0)")
        lines += [
            "def rows(args):",
            *get_args[:k],
            f"    n_problems = np.int64(1) * {n_problems}",
            f"    sizes = np.array([{', '.join(f'{x}.size' for x in xs)}], dtype=np.int64)",
            "    width = np.sum(sizes) // n_problems",
            "    out = np.empty((n_problems, width), dtype=np.int64)",
            "    offset = 0",
            "    column = 0",
            "    for size in sizes:",
            "        per_problem = size // n_problems",
            "        for b in range(n_problems):",
            "            for j in range(per_problem):",
            "                out[b, column + j] = offset + b * per_problem + j",
            "        offset += size",
            "        column += per_problem",
            "    return out",
            "def as_diagnostics(success, n_iterations, n_evaluations, status, x0):",
        ]
        if batch_ndim:
            lines.append(
                f"    return (success.reshape({batch_shape}), n_iterations.reshape({batch_shape}), "
                f"n_evaluations.reshape({batch_shape}), status.reshape({batch_shape}))"
            )
        else:
            lines.append(
                "    return (np.asarray(success[0]), np.asarray(n_iterations[0]), "
                "np.asarray(n_evaluations[0]), np.asarray(status[0]))"
            )
        shape = batch_shape if batch_ndim else "()"
        failure = (
            f"np.zeros({shape}, dtype=np.bool_), np.full({shape}, -1, dtype=np.int64), "
            f"np.full({shape}, -1, dtype=np.int64), np.full({shape}, {invalid}, dtype=np.int64)"
        )
    lines += _failed_checks_source(op, node, get_args, n_problems, batch_ndim or 0)
    # "continued", the last extra input of a sequential solve (`newton.sequential_solve`)
    continued = f"{extras[-1]}.item() != 0" if getattr(op, "sequential", False) else "True"
    lines += [
        f"def solver({', '.join([*args, *extras])}):",
        f"    args = ({', '.join(args)},)",
        f"    continued = {continued}",
        "    blas_threads = set_blas_threads(1)",
        "    try:",
        f"        z, success, n_iterations, n_evaluations, status = {call_loop}",
        "    except Exception:  # (numba catches by no class) as perform: ProblemUndefined",
        "        set_blas_threads(blas_threads)",
        f"        return ({', '.join(failed)}, {failure})",
        "    set_blas_threads(blas_threads)",
        "    failed = failed_checks(args)",
        "    if np.any(failed):  # as SolverOp.perform: a false parameter check fails the solve",
        "        success = success & ~failed"
        if batch_ndim is not None
        else "        success = False",
        f"        status = np.where(failed, {invalid}, status)"
        if batch_ndim is not None
        else f"        status = {invalid}",
        *unpack(out_dtypes),
        f"    return ({', '.join(solutions)}, "
        "*as_diagnostics(success, n_iterations, n_evaluations, status, x0))",
    ]
    return "\n".join(lines) + "\n"


def _failed_checks_source(op: SolverOp, node, get_args, n_problems: str, batch_ndim: int):
    """Source of ``failed_checks(args)``: per problem (a vector of `n_problems`), whether a
    condition of `SolverOp.parameter_checks` is false, as `SolverOp.failed_checks` decides."""
    k = op.n_controls
    lines = [
        "def failed_checks(args):",
        *get_args,
        f"    n_problems = np.int64(1) * {n_problems}",
        "    out = np.zeros(n_problems, dtype=np.bool_)",
    ]
    for i in op.parameter_checks:
        p, ndim = f"p{i}", node.inputs[k + i].type.ndim
        if batch_ndim and ndim >= batch_ndim:  # one per problem where its batch shape is x's
            same = " and ".join(f"{p}.shape[{d}] == x0.shape[{d}]" for d in range(batch_ndim))
            lines += [
                f"    if {same}:",
                f"        width = {p}.size // n_problems",
                "        for b in range(n_problems):",
                "            for j in range(width):",
                f"                if not {p}.flat[b * width + j]:",
                "                    out[b] = True",
                "    else:",
                f"        if not np.all({p}):",
                "            out[:] = True",
            ]
        else:
            lines += [f"    if not np.all({p}):", "        out[:] = True"]
    lines.append("    return out")
    return lines


def _adapters(op: SolverOp, node, inputs, inner_outputs: dict):
    """Compile the inner graphs of `inputs` and the generated adapters around them.

    Returns the adapters' namespace (``pack`` and one function per inner graph, njitted), their
    source and the inner graphs' cache keys.
    """
    env = {"np": np}
    keys = []
    for name, outputs in inner_outputs.items():
        env[f"{name}_fn"], key = _numba_function(inputs, outputs)
        keys.append(key)
    src = _adapter_source(op, node, inner_outputs)
    helpers = ["pack", "as_diagnostics", "failed_checks"]
    helpers += ["rows", "theta"] if isinstance(op, NewtonOp) else []
    for name in [*helpers, *inner_outputs]:
        # ``solver`` calls pack, rows and theta in its try block
        jit = _njit if name in ("pack", "rows", "theta") else _inlined
        env[name] = jit(compile_numba_function_src(src, name, env))
    return env, src, keys


def _solver(op: SolverOp, env: dict, src: str, loop, keys: list, options: tuple):
    """The Op's numba function running `loop`, and its cache key (None if a part has none).

    `loop`, most of the code, is compiled on its own (cached on disk under the solver's key)
    and called through its address (`numba_outline`): the functions around it do not link its
    code, so numba optimizes and compiles it once, not once per enclosing function, and a graph
    compiled later in the process reuses it.
    """
    announce_compilation("numba", f"a graph-native {type(op).__name__} solve")
    key = None if any(key is None for key in keys) else _cache_key(op, src, keys, options)
    env["set_blas_threads"] = set_blas_threads
    env["loop"] = outlined(loop, key and f"{key}_loop")
    return _njit(compile_numba_function_src(src, "solver", env)), key


def _cache_key(op: SolverOp, src: str, keys: list, options: tuple) -> str:
    constants = (ARMIJO, CHORD_CONTRACTION, MAX_BACKTRACKS, ROUNDING, STEP_TOL, _ANDERSON_MEMORY)
    constants = (*constants, CANONICAL_BITS, _OTHER_SOURCES)
    parts = (type(op).__name__, _SOURCE_KEY, src, tuple(keys), constants, options)
    return sha256(str(parts).encode()).hexdigest()


@register_funcify_and_cache_key(NewtonOp)
def _newton_numba(op: NewtonOp, node=None, **kwargs):
    xs, params = op.typed_inner_inputs(node)
    condition = op.condition.on(xs, params)
    (merit,) = op.inner_on(xs, params, [op.merit])
    F, A = condition.flat_residual(), condition.jacobian()
    env, src, keys = _adapters(
        op, node, [*xs, *params], {"system": [merit, F, A], "merit": [merit]}
    )
    structure = condition.structure
    solve, solve_key = _solve_function(structure)
    positive_definite, positive_definite_key = _per_problem_function(structure, "positive_definite")
    finite_jacobian, finite_key = _per_problem_function(structure, "finite")
    sequential = bool(op.sequential)
    warm_start = bool(op.warm_start) and not sequential
    loop = _newton_loop(
        env["system"],
        env["merit"],
        solve,
        positive_definite,
        finite_jacobian,
        minimization=bool(op.minimization),
        tol=float(op.tol),
        max_iter=int(op.max_iter),
        final_step=not sequential,
        chord=sequential,
    )
    options = (op.minimization, op.tol, op.max_iter, structure.kind, structure.block_size)
    options = (*options, BLAS_THREADS_SETTABLE, warm_start, sequential, bool(op.predictor))
    keys = [*keys, solve_key, positive_definite_key, finite_key]
    # the state of solvers compiled alike is shared (in each thread): it only moves the start
    state_key = 2 * (int(_cache_key(op, src, keys, options)[:15], 16) >> 1)
    driver = _newton_driver(
        loop,
        _canonical_step_function(env["system"], solve),
        warm_start=warm_start,
        sequential=sequential,
        predictor=bool(op.predictor),
        key=state_key,
    )
    return _solver(op, env, src, driver, keys, options)


@register_funcify_and_cache_key(FixedPointOp)
def _fixed_point_numba(op: FixedPointOp, node=None, **kwargs):
    xs, params = op.typed_inner_inputs(node)
    (update,) = op.inner_on(xs, params, [op.flat_update])
    env, src, keys = _adapters(op, node, [*xs, *params], {"update": [update]})
    make_loop = _anderson_loop if op.method == "anderson" else _fixed_point_loop
    loop = make_loop(env["update"], tol=float(op.tol), max_iter=int(op.max_iter))
    return _solver(
        op, env, src, loop, keys, (op.method, op.tol, op.max_iter, BLAS_THREADS_SETTABLE)
    )


@register_funcify_and_cache_key(CountFailures)
def _count_failures_numba(op: CountFailures, node=None, **kwargs):
    """`success` passed through; a failure is counted in this process, as in `perform`, through
    `numba_runtime.count_failure` (a call into Python only when a solve failed) with the first
    nonzero code of the optional `status` input (0 without one: reason unknown). No object
    mode: the compiled log density stays cacheable on disk."""
    key = failure_key(op.label)
    with_status = node is not None and len(node.inputs) > 1

    if with_status:

        @_njit
        def count_failures(success, status):
            if not success.item():
                code = 0
                for i in range(status.size):
                    if status.flat[i] != 0:
                        code = status.flat[i]
                        break
                count_failure(key, code)
            return success

    else:

        @_njit
        def count_failures(success):
            if not success.item():
                count_failure(key, 0)
            return success

    cache_key = f"CountFailures {key} {with_status} {_SOURCE_KEY}"
    return count_failures, sha256(cache_key.encode()).hexdigest()


@register_funcify_and_cache_key(WarnOnFailure)
def _warn_on_failure_numba(op: WarnOnFailure, node=None, **kwargs):
    """`value` passed through; `perform`'s warning when `success` is false, through
    `numba_runtime.warn_failure` (a call into Python only then)."""
    key = failure_key(op.message)

    @_njit
    def warn_on_failure(value, success):
        if not success.item():
            warn_failure(key)
        return value

    return warn_on_failure, sha256(f"WarnOnFailure {key} {_SOURCE_KEY}".encode()).hexdigest()


# the linear-algebra Ops' implementations register with pytensor's numba dispatch on import
from pymc_optim.backends import numba_latent_gaussian as _numba_latent_gaussian  # noqa: E402, F401
from pymc_optim.backends import numba_sparse as _numba_sparse  # noqa: E402, F401
