"""The graph-native solvers' iterations in numpy: damped Newton, fixed-point and Anderson.

:mod:`pymc_optim.backends.numba` is a line-for-line port of these loops: numba's nopython mode
cannot call these functions, which use Python scalars, exceptions and numpy's fancy indexing, so
it has its own. Change both together; the numba tests
compare their iterates and counters with this module's.

These loops call compiled inner graphs (no scipy); the JAX backend runs the same loops with
``jax.lax.while_loop`` (:mod:`pymc_optim.backends.jax`). Each returns
``(z, success, n_iterations, n_evaluations, status)`` on the flat vector z: a singular system,
a NaN or a line search that cannot descend ends the loop with ``success=False``, the last finite
iterate and the reason as a `SolverStatus` code. They raise only `ProblemUndefined`, where F or
T(z) has not z's size (sizes known only at run time), and pass on what the inner functions raise.
"""

from __future__ import annotations

import math

import numpy as np

from pymc_optim.graph.solver_op import ProblemUndefined
from pymc_optim.graph.status import SolverStatus

__all__ = [
    "ANDERSON_MEMORY",
    "ARMIJO",
    "CHORD_CONTRACTION",
    "MAX_BACKTRACKS",
    "ROUNDING",
    "STEP_TOL",
    "anderson",
    "check_size",
    "chord_final_step",
    "fixed_point_iteration",
    "newton",
    "reachable_tolerance",
]

#: Anderson acceleration's history length (the common default of 5, Walker & Ni 2011).
ANDERSON_MEMORY = 5
#: Sufficient-decrease constant of the Armijo line search (the customary 1e-4, Nocedal & Wright).
ARMIJO = 1e-4
#: Step halvings before the line search gives up: 2⁻³⁰ ≈ 1e-9 of the Newton step.
MAX_BACKTRACKS = 30
#: A full Newton step this small relative to x means convergence to machine precision (the next
#: error is ~its square), even when max|F| ≤ tol is out of reach in floating point, as for the
#: gradient of a very sharply curved objective.
STEP_TOL = 1e-10
#: For minimization: when the Newton step's predicted decrease gᵀH⁻¹g is below the objective's
#: rounding error, no line search can see progress any more: the minimum is found to rounding
#: error. An objective summed over N terms carries ~√N ulp of rounding (a Bernoulli Laplace
#: merit over 6,000 trials: ~35 ulp, so 16 ulp made ~2.5 % of its solves fail in backtracking on
#: noise); 4096 ulp covers sums of up to ~10⁷ terms.
ROUNDING = 4096 * np.finfo("float64").eps
#: A chord step (`newton`'s `chord`) is kept only if it shrinks max|F| at least this much: a
#: chord converges linearly, at the rate ‖I − A_ref⁻¹A‖, and one that stalls hands over to Newton.
CHORD_CONTRACTION = 0.25


def newton(*args, **kwargs):
    """`_newton`, with numpy's floating-point warnings off: a NaN or a singular system is data
    here (it ends the problem's solve with ``success=False``), not a warning."""
    with np.errstate(all="ignore"):
        return _newton(*args, **kwargs)


def _newton(system, merit, z0, *, rows=None, **options):
    """Damped Newton on F(z) = 0 with an Armijo backtracking line search on a merit function.

    `z` may stack B independent problems (a native batch): ``rows`` (B, n) holds the indices of
    problem b's elements of z in row b (None: one problem). Every decision — the step length,
    the stopping tests, success — is taken per problem, so that a problem's iterates are those
    of its own unbatched solve whatever the other problems do.

    Stops problem b with success when max|F_b| ≤ tol, or when a full Newton step (a descent
    direction) is negligible (`STEP_TOL`) or, for minimization, when its predicted decrease is
    below the objective's rounding error (`ROUNDING`) *and* the full step no longer reduces
    max|F_b| either (the minimum found to rounding error; a constant added to the objective
    only hides the decrease, and then the full step is accepted on max|F| instead).
    For minimization, success also needs A positive definite at the solution (the structure's
    own Cholesky): a maximum or a saddle is a stationary point, not a minimum.

    A problem stopped by max|F_b| ≤ tol takes one more Newton step z − A⁻¹F with the F and A
    already evaluated there (no evaluation, not counted as an iteration; with the previous
    iterate's A where `chord_final_step` allows, every running problem alike, so that a
    structure's cached factor serves and its curvature test): Newton's error is then
    ~ its square, so the solution is exact to rounding rather than to ~tol/λ_min(A). Without it
    the answer depends at ~1e-9 on where the iterations happened to cross tol, which a warm start
    moves: a Laplace marginal's log-determinant, not stationary in x, carries that error to the
    value, and central differences of it by h = 1e-4 were off by ~1e-5.

    `system(z)` returns ``(merit, F, A)`` with the merit one value per problem (shape (B,)) and
    A compact in `structure`; `merit(z)` the merit alone. For minimization the merit is the
    objective and F its gradient (a non-descent Newton direction falls back to −F); otherwise
    the merit is ½‖F‖², whose slope along the Newton direction is −‖F‖².

    Each iteration evaluates `system` once at the full step z + d (its merit decides the step);
    only when that is rejected does it backtrack with `merit` and evaluate `system` again at
    the accepted point. A point where the system (merit, F or A) is not finite is a rejected
    step: at the full step as in the backtracking, where the merit's graph and the system's
    round apart at the edge of a parameter check, or A alone is NaN (a second derivative that
    rounds to 0 · ∞ where the first does not). With
    several problems that check is made once every problem's search has found its point.

    One problem only (`rows` None), two options for a sequence of nearby solves (latent draws
    along a tour): `chord`, a compact A of a nearby problem (the last solve's), makes the solve
    start with chord steps z − A_ref⁻¹F(z) (`_chord_steps`): each costs an evaluation and a solve
    with A_ref's factor, which the structure caches, instead of a new factorization.
    ``final_step=False`` returns the last evaluated iterate z instead of z − A(z)⁻¹F(z) when
    max|F| ≤ tol, so that the caller can take that step in its own graph from the A the loop
    factorized last (and reuse its factor).

    `options`: ``structure``, ``minimization``, ``tol`` and ``max_iter``, all required, and for
    one problem ``chord`` and ``final_step``; `_newton_one` and `_newton_batch` take them by
    name, so a missing or misspelled one is a TypeError there.

    Returns ``(z, success, n_iterations, n_evaluations, status)``, the last four of shape (B,),
    `status` the `SolverStatus` code of why each problem stopped.
    """
    z = np.array(z0, dtype="float64")
    if rows is None or rows.shape[0] == 1:
        return _newton_one(system, merit, z, **options)
    if options.pop("chord", None) is not None or not options.pop("final_step", True):
        raise ValueError("`chord` and `final_step=False` are for one problem (`rows` None).")
    return _newton_batch(system, merit, z, rows, **options)


def _newton_batch(system, merit, z, rows, *, structure, minimization, tol, max_iter):
    """`_newton` for B > 1 problems stacked in z, problem b's elements at ``rows[b]``."""
    n_problems, width = rows.shape
    if np.array_equal(rows.ravel(), np.arange(z.size)):  # contiguous problems: views, no copies

        def view(v):
            return v.reshape(n_problems, width)
    else:

        def view(v):
            return v[rows]

    owner = np.empty(z.size, dtype=np.int64)
    owner[rows.ravel()] = np.repeat(np.arange(n_problems), width)

    def expand(flags):
        """Per-problem values on z's elements (broadcasting does it for one problem)."""
        return flags if n_problems == 1 else flags[owner]

    def max_abs(v):
        return np.max(np.abs(view(v)), axis=1, initial=0.0)

    def dot(u, v):
        return np.einsum("ij,ij->i", view(u), view(v))

    def finite(m, F):
        return np.isfinite(m) & np.isfinite(view(F)).all(axis=1)

    def finite_system(m, F, A):
        return finite(m, F) & per_problem(structure.finite_numpy(A), owner, n_problems)

    m, F, A = system(z)
    check_size(F, z, "the equations")
    n_evaluations = np.ones(n_problems, dtype=np.int64)
    n_iterations = np.full(n_problems, max_iter, dtype=np.int64)
    status = np.full(n_problems, SolverStatus.MAX_ITER, dtype=np.int64)
    running = np.ones(n_problems, dtype=bool)
    success = np.zeros(n_problems, dtype=bool)
    everything = np.ones(n_problems, dtype=bool)
    # per problem: a full Newton step led to z, from max|F| `F_max_previous`, A there `A_previous`
    stepped, F_max_previous, A_previous = ~everything, np.zeros(n_problems), A

    def stop(which, ok, iteration, A_now=None, reason=SolverStatus.CONVERGED):
        """End the problems in `which`, successful where `ok` (and, for minimization, where
        A is positive definite); `reason` is the status where `ok` is False."""
        curved = ok
        if minimization and (which & ok).any():
            curved = ok & positive_definite(structure, A_now, owner, n_problems)
        code = np.where(ok, SolverStatus.NOT_POSITIVE_DEFINITE, reason)
        status[which] = np.where(curved, SolverStatus.CONVERGED, code)[which]
        success[which] = curved[which]
        n_iterations[which] = iteration
        running[which] = False

    for iteration in range(max_iter + 1):
        ok = finite(m, F)
        if not ok.all():
            stop(running & ~ok, ok, iteration, reason=SolverStatus.NONFINITE)
        F_max = max_abs(F)
        converged = running & (F_max <= tol)
        # every running problem converged, each after a fast enough full Newton step
        chord = converged.any() and bool(
            np.all((converged & stepped & chord_final_step(F_max, F_max_previous, tol))[running])
        )
        A_step = A_previous if chord else A
        d = -solve(structure, A_step, F)
        if converged.any():
            stop(converged, ok, iteration, A_step)
            # the final Newton step: no evaluation, the error squared
            final = converged & success & finite(np.zeros(n_problems), d)
            z = np.where(expand(final), z + d, z)
        if iteration == max_iter or not running.any():
            break
        if minimization:
            slope = dot(F, d)
            is_newton_step = np.isfinite(slope) & (slope < 0)
            if not is_newton_step.all():
                d = np.where(expand(is_newton_step), d, -F)
                slope = np.where(is_newton_step, slope, -dot(F, F))
        else:
            is_newton_step = np.isfinite(view(d)).all(axis=1)
            if not is_newton_step.all():
                stop(
                    running & ~is_newton_step,
                    is_newton_step,
                    iteration,
                    reason=SolverStatus.SINGULAR,
                )
            slope = -2.0 * m
        tiny = running & is_newton_step & tiny_step(max_abs(d), max_abs(z))
        if tiny.any():
            z = np.where(expand(tiny), z + d, z)
            stop(tiny, tiny, iteration + 1, A)
            if not running.any():
                break
        # the full step, all running problems at once: one evaluation of the system
        z_full = z + d if running.all() else np.where(expand(running), z + d, z)
        m_full, F_full, A_full = system(z_full)
        n_evaluations += running
        finite_full = finite_system(m_full, F_full, A_full)
        accepted = running & finite_full & (m_full <= m + ARMIJO * slope)
        if minimization and not accepted.all():
            unseen = running & is_newton_step & unseen_decrease(slope, m)
            accepted |= unseen & finite_full & (max_abs(F_full) < F_max)
            # the minimum to rounding error: neither the objective nor max|F| sees progress
            stalled = unseen & ~accepted
            if stalled.any():
                stop(stalled, everything, iteration + 1, A)
        backtrack = running & ~accepted
        if not backtrack.any():
            # problems stopped above keep their z; the values at z_full are theirs no more
            z = z_full if accepted.all() else np.where(expand(accepted), z_full, z)
            stepped, F_max_previous, A_previous = accepted & is_newton_step, F_max, A
            m, F, A = m_full, F_full, A_full
            continue
        stepped = ~everything
        t = np.where(accepted, 1.0, 0.0)
        t_try = np.ones(n_problems)
        searching = backtrack.copy()
        fresh = backtrack & running  # problems whose point moves since the last system call
        settled = False
        for _ in range(MAX_BACKTRACKS - 1):
            t_try = np.where(searching, 0.5 * t_try, t_try)
            trial = merit(np.where(expand(searching), z + expand(t_try) * d, z))
            n_evaluations += searching
            found = searching & (trial <= m + ARMIJO * t_try * slope)  # False for NaN
            t = np.where(found, t_try, t)
            searching &= ~found
            if searching.any():
                continue
            z_new = np.where(expand(running), z + expand(t) * d, z)
            m_new, F_new, A_new = system(z_new)
            n_evaluations += fresh
            # a point where the merit is finite and the system is not is a rejected step too
            searching = fresh & ~finite_system(m_new, F_new, A_new)
            fresh = searching
            if not searching.any():
                settled = True
                break
        if not settled:
            stop(searching, ~everything, iteration, reason=SolverStatus.LINE_SEARCH_FAILED)
            z_new = np.where(expand(running), z + expand(t) * d, z)
            m_new, F_new, A_new = system(z_new)
            n_evaluations += fresh & running
            # (the system at the point of a search ended early is checked at the next
            # iteration's start, which fails it there)
        z, m, F, A = z_new, m_new, F_new, A_new
    return z, success, n_iterations, n_evaluations, status


def _newton_one(
    system, merit, z, *, structure, minimization, tol, max_iter, chord=None, final_step=True
):
    """`_newton` for one problem, on Python scalars: the same decisions in the same order
    without the per-problem bookkeeping (a Laplace marginal's solve is one problem, and numpy's
    per-call overhead on length-1 arrays would cost as much as an inner function call).

    Each numpy call costs ~1 µs (several under load) against ~15 µs for an inner call at
    G = 300, so the loop makes as few as it can: the trial point z + d is formed once, and
    max|z| (for the tiny-step test) only when an upper bound on it, carried along the steps,
    lets the test pass; the decisions and the arithmetic are those of `_newton`'s.
    """
    m, F, A = system(z)
    check_size(F, z, "the equations")
    m = float(m[0])
    F_max = float(np.abs(F).max(initial=0.0))
    n_evaluations = 1
    if chord is not None:
        z, m, F, A, F_max, more = _chord_steps(
            system, z, m, F, A, F_max, structure, chord, minimization=minimization, tol=tol
        )
        n_evaluations += more
    # an upper bound on max|z| (None: not known), with slack for the rounding of the steps
    z_bound = None
    # the Jacobian whose full Newton step led to z, and max|F| where it was taken
    A_previous, F_max_previous = None, 0.0

    def result(success, iteration, A_now=None, reason=SolverStatus.CONVERGED):
        """The loop's outputs; `reason` is the status of a failure other than the curvature."""
        if success and minimization:
            success = positive_definite_one(structure, A_now)
            reason = SolverStatus.NOT_POSITIVE_DEFINITE
        code = SolverStatus.CONVERGED if success else reason
        return (
            z,
            np.array([success]),
            np.array([iteration]),
            np.array([n_evaluations]),
            np.array([code], dtype=np.int64),
        )

    for iteration in range(max_iter + 1):
        if not (math.isfinite(m) and math.isfinite(F_max)):
            return result(False, iteration, reason=SolverStatus.NONFINITE)
        if F_max <= tol and not final_step:  # (the caller takes the step: no solve here)
            return result(True, iteration, A)
        A_step = A
        if F_max <= tol and A_previous is not None and chord_final_step(F_max, F_max_previous, tol):
            A_step = A_previous
        d = -solve(structure, A_step, F)
        if F_max <= tol:
            converged = not minimization or positive_definite_one(structure, A_step)
            if converged and np.isfinite(d).all():
                z = z + d  # the final Newton step: no evaluation, the error squared
            code = SolverStatus.CONVERGED if converged else SolverStatus.NOT_POSITIVE_DEFINITE
            return (
                z,
                np.array([converged]),
                np.array([iteration]),
                np.array([n_evaluations]),
                np.array([code], dtype=np.int64),
            )
        if iteration == max_iter:
            break
        if minimization:
            slope = float(F @ d)
            is_newton_step = math.isfinite(slope) and slope < 0
            if not is_newton_step:
                d, slope = -F, -float(F @ F)
        else:
            is_newton_step = bool(np.isfinite(d).all())
            if not is_newton_step:
                return result(False, iteration, reason=SolverStatus.SINGULAR)
            slope = -2.0 * m
        d_max = float(np.abs(d).max(initial=0.0))
        if is_newton_step and (z_bound is None or tiny_step(d_max, z_bound)):
            z_max = float(np.abs(z).max(initial=0.0))
            z_bound = z_max * (1.0 + 1e-12)
            if tiny_step(d_max, z_max):
                z = z + d
                return result(True, iteration + 1, A)
        z_full = z + d
        m_full, F_full, A_full = system(z_full)
        m_full = float(m_full[0])
        F_max_full = float(np.abs(F_full).max(initial=0.0))
        n_evaluations += 1
        finite_full = (
            math.isfinite(m_full)
            and math.isfinite(F_max_full)
            and bool(structure.finite_numpy(A_full).all())
        )
        accepted = finite_full and m_full <= m + ARMIJO * slope
        if minimization and not accepted and is_newton_step and unseen_decrease(slope, m):
            if not (finite_full and F_max_full < F_max):
                return result(True, iteration + 1, A)  # the minimum to rounding error
            accepted = True
        if accepted:
            A_previous, F_max_previous = (A, F_max) if is_newton_step else (None, 0.0)
            z, m, F, A, F_max = z_full, m_full, F_full, A_full, F_max_full
            if z_bound is not None:
                z_bound = (z_bound + d_max) * (1.0 + 1e-12)
            continue
        A_previous = None
        t = 1.0
        for _ in range(MAX_BACKTRACKS - 1):
            t *= 0.5
            z_trial = z + t * d
            trial = float(merit(z_trial)[0])
            n_evaluations += 1
            if not trial <= m + ARMIJO * t * slope:  # (True for NaN)
                continue
            m_trial, F_trial, A_trial = system(z_trial)
            m_trial = float(m_trial[0])
            F_max_trial = float(np.abs(F_trial).max(initial=0.0))
            n_evaluations += 1
            # a point where the merit is finite and the system is not is a rejected step too
            if (
                math.isfinite(m_trial)
                and math.isfinite(F_max_trial)
                and structure.finite_numpy(A_trial).all()
            ):
                break
        else:
            return result(False, iteration, reason=SolverStatus.LINE_SEARCH_FAILED)
        z, m, F, A, F_max = z_trial, m_trial, F_trial, A_trial, F_max_trial
        if z_bound is not None:
            z_bound = (z_bound + t * d_max) * (1.0 + 1e-12)
    return result(False, max_iter, reason=SolverStatus.MAX_ITER)


def _chord_steps(system, z, m, F, A, F_max, structure, reference, *, minimization, tol):
    """Chord steps z ← z − A_ref⁻¹F(z) from an evaluated z (merit m, F, A, max|F|) with the
    compact Jacobian `reference` of a nearby problem, while max|F| > tol: one evaluation and one
    solve with A_ref's (cached) factor each, no factorization. They converge linearly, at the
    rate ‖I − A_ref⁻¹A‖ (Anderson acceleration saved 0.2 of 3.2 evaluations per latent draw at
    N = 10⁴: not kept). A step is kept if it is finite, shrinks max|F| by `CHORD_CONTRACTION`
    and, for minimization, descends (Armijo, or a decrease below rounding); the first that is
    not ends the chord steps, and Newton goes on from the last kept iterate. They only move the
    start: the stopping rule is Newton's.

    Returns ``(z, m, F, A, max|F|, n_evaluations)`` at the last kept iterate."""
    n_evaluations = 0
    if np.shape(reference) != np.shape(A):
        return z, m, F, A, F_max, n_evaluations
    while F_max > tol and math.isfinite(m) and math.isfinite(F_max):
        d = -solve(structure, reference, F)
        slope = float(F @ d)
        if not (math.isfinite(slope) and (slope < 0 or not minimization)):
            break
        z_new = z + d
        m_new, F_new, A_new = system(z_new)
        m_new = float(m_new[0])
        F_max_new = float(np.abs(F_new).max(initial=0.0))
        n_evaluations += 1
        kept = math.isfinite(m_new) and F_max_new <= CHORD_CONTRACTION * F_max
        kept = kept and bool(structure.finite_numpy(A_new).all())
        if kept and minimization:
            kept = m_new <= m + ARMIJO * slope or unseen_decrease(slope, m)
        if not kept:
            break
        z, m, F, A, F_max = z_new, m_new, F_new, A_new, F_max_new
    return z, m, F, A, F_max, n_evaluations


def chord_final_step(F_max, F_max_previous, tol):
    """Per problem: the final Newton step (max|F| ≤ `tol`) may use the Jacobian of the previous
    iterate, whose full Newton step led here with max|F| going from `F_max_previous` to
    `F_max`, instead of factorizing A at this iterate.

    That step errs by ≈ 2ρe, e the current error and ρ = F_max / F_max_previous the last step's
    contraction (in Newton's quadratic regime ρ ≈ ½‖A_prev⁻¹(A − A_prev)‖): allowed when
    ρ · F_max ≤ tol², where the exact final step would leave an error of the same order
    (~e²). Typical when the last step crossed tol with room to spare (max|F| 3e-8 → 1e-15):
    the chord step is then exact to rounding, and with a structure that caches its factor
    (sparse) it costs triangular solves instead of a factorization."""
    return F_max * F_max <= tol * tol * F_max_previous


def check_size(values, z, what: str) -> None:
    """Raise `ProblemUndefined` unless `values` (F, or T(z)) has as many elements as z."""
    if np.size(values) != z.size:
        raise ProblemUndefined(
            f"{what} have {np.size(values)} elements at these parameters, for {z.size} unknowns"
        )


def solve(structure, A, F):
    """A⁻¹ F, NaN in the blocks (or diagonal entries) where A is singular."""
    return structure.solve_or_nan_numpy(A, F)


def positive_definite(structure, A, owner, n_problems):
    """Per problem: whether its part of A is positive definite, from the structure's own test."""
    return per_problem(structure.positive_definite_numpy(A), owner, n_problems)


def per_problem(good, owner, n_problems):
    """Per problem: all its parts are `good` (one flag per independent part of A: diagonal
    entry, block, or the whole matrix), each part's flag given to the problem owning its first
    element."""
    out = np.ones(n_problems, dtype=bool)
    out[part_owner(owner, good.shape[0])[~good]] = False
    return out


def positive_definite_one(structure, A) -> bool:
    """`positive_definite` for one problem."""
    return bool(np.asarray(structure.positive_definite_numpy(A)).all())


def part_owner(owner, n_parts: int):
    """The problem owning each of `n_parts` equal, contiguous parts of z (its first element)."""
    return owner[:: owner.shape[0] // n_parts]


def tiny_step(max_abs_d, max_abs_z):
    """Per problem: the step is below `STEP_TOL` relative to z (their max-norms given)."""
    return max_abs_d <= STEP_TOL * (1.0 + max_abs_z)


def unseen_decrease(slope, m):
    """Per problem: the predicted decrease −slope is below the objective's rounding error."""
    return -slope <= ROUNDING * (1.0 + np.abs(m))


def fixed_point_iteration(update, z0, *, tol: float, max_iter: int):
    """z ← T(z) until ‖T(z) − z‖∞ ≤ tol (converges for contractions, e.g. Bellman operators)."""
    z = np.array(z0, dtype="float64")
    for iteration in range(1, max_iter + 1):
        z_new = update(z)
        check_size(z_new, z, "the update's values")
        if not np.all(np.isfinite(z_new)):
            return z, False, iteration, iteration, SolverStatus.NONFINITE
        with np.errstate(over="ignore"):  # a diverging iteration: inf > tol, then non-finite
            step = np.max(np.abs(z_new - z), initial=0.0)
        if step <= tol:
            return z_new, True, iteration, iteration, SolverStatus.CONVERGED
        z = z_new
    return z, False, max_iter, max_iter, SolverStatus.MAX_ITER


def anderson(update, z0, *, tol: float, max_iter: int, memory: int = ANDERSON_MEMORY):
    """Anderson-accelerated fixed-point iteration (type II, Walker & Ni 2011), `memory` steps.

    With g(z) = T(z) − z and the last differences ΔZ, ΔG, the next iterate is
    z + g − (ΔZ + ΔG) γ where γ minimizes ‖g − ΔG γ‖ (least squares).
    """
    z = np.array(z0, dtype="float64")
    g = update(z)
    check_size(g, z, "the update's values")
    g = g - z
    dz_hist, dg_hist = [], []
    for iteration in range(1, max_iter + 1):
        if not np.all(np.isfinite(g)):
            return z, False, iteration, iteration, SolverStatus.NONFINITE
        if np.max(np.abs(g), initial=0.0) <= tol:
            return z + g, True, iteration, iteration, SolverStatus.CONVERGED
        if dg_hist:
            dG, dZ = np.stack(dg_hist, axis=1), np.stack(dz_hist, axis=1)
            gamma = np.linalg.lstsq(dG, g, rcond=None)[0]
            z_new = z + g - (dZ + dG) @ gamma
        else:
            z_new = z + g
        g_new = update(z_new) - z_new
        dz_hist.append(z_new - z)
        dg_hist.append(g_new - g)
        if len(dg_hist) > memory:
            dz_hist.pop(0)
            dg_hist.pop(0)
        z, g = z_new, g_new
    return z, False, max_iter, max_iter, SolverStatus.MAX_ITER


def reachable_tolerance(tol: float, dtypes) -> float:
    """`tol` for a residual computed in `dtypes`: in float64 as given; in a less precise float
    at least the same multiple of √eps as 1e-8 is in float64 (2.3e-4 in float32), below which
    the residual of a solution is rounding noise (float32 controls never reached 1e-8 and every
    solve failed)."""
    eps = max((np.finfo(d).eps for d in dtypes if np.issubdtype(d, np.floating)), default=0.0)
    eps64 = np.finfo(np.float64).eps
    if eps <= eps64:
        return tol
    return max(tol, 1e-8 * math.sqrt(eps / eps64))
