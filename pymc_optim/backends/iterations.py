"""The graph-native solvers' iterations in numpy: damped Newton, fixed-point and Anderson.

These loops call compiled inner graphs (no scipy); the JAX backend runs the same loops with
``jax.lax.while_loop`` (:mod:`pymc_optim.backends.jax`). Each returns
``(z, success, n_iterations, n_evaluations)`` on the flat vector z and never raises: a singular
system, a NaN or a line search that cannot descend ends the loop with ``success=False`` and the
last finite iterate.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ANDERSON_MEMORY",
    "ARMIJO",
    "MAX_BACKTRACKS",
    "ROUNDING",
    "STEP_TOL",
    "anderson",
    "fixed_point_iteration",
    "newton",
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
#: For minimization: when the Newton step's predicted decrease gᵀH⁻¹g is below 16 ulp of the
#: objective, no line search can see progress any more: the minimum is found to rounding error.
ROUNDING = 16 * np.finfo("float64").eps


def newton(system, merit, z0, *, structure, minimization: bool, tol: float, max_iter: int):
    """Damped Newton on F(z) = 0 with an Armijo backtracking line search on a merit function.

    Stops with success when max|F| ≤ tol, or when a full Newton step (a descent direction) is
    negligible: tiny relative to z (`STEP_TOL`) or, for minimization, predicting a decrease
    below the objective's rounding error (`ROUNDING`).

    `system(z)` returns ``(merit, F, A)`` with A compact in `structure`; `merit(z)` the merit
    alone. For minimization the merit is the objective and F its gradient (a non-descent Newton
    direction falls back to −F); otherwise the merit is ½‖F‖², whose slope along the Newton
    direction is −‖F‖².
    """
    z = np.array(z0, dtype="float64")
    m, F, A = system(z)
    n_evaluations = 1
    for iteration in range(max_iter + 1):
        if not (np.isfinite(m) and np.all(np.isfinite(F))):
            return z, False, iteration, n_evaluations
        if np.max(np.abs(F), initial=0.0) <= tol:
            return z, True, iteration, n_evaluations
        if iteration == max_iter:
            break
        try:
            d = -structure.solve_numpy(A, F)
        except np.linalg.LinAlgError:
            d = None
        if minimization:
            slope = float(F @ d) if d is not None else np.inf
            is_newton_step = np.isfinite(slope) and slope < 0
            if not is_newton_step:
                d, slope = -F, -float(F @ F)
        elif d is None or not np.all(np.isfinite(d)):
            return z, False, iteration, n_evaluations
        else:
            slope, is_newton_step = -2.0 * m, True
        if is_newton_step and newton_step_is_negligible(d, z, slope, m, minimization):
            return z + d, True, iteration + 1, n_evaluations
        t = 1.0
        for _ in range(MAX_BACKTRACKS):
            trial = merit(z + t * d)
            n_evaluations += 1
            if trial <= m + ARMIJO * t * slope:  # False for NaN: keep halving
                break
            t *= 0.5
        else:
            return z, False, iteration, n_evaluations
        z = z + t * d
        m, F, A = system(z)
        n_evaluations += 1
    return z, False, max_iter, n_evaluations


def newton_step_is_negligible(d, z, slope, m, minimization: bool) -> bool:
    """See `STEP_TOL` and `ROUNDING`."""
    tiny_step = np.max(np.abs(d), initial=0.0) <= STEP_TOL * (1.0 + np.max(np.abs(z), initial=0.0))
    unseen_decrease = minimization and -slope <= ROUNDING * (1.0 + abs(m))
    return bool(tiny_step or unseen_decrease)


def fixed_point_iteration(update, z0, *, tol: float, max_iter: int):
    """z ← T(z) until ‖T(z) − z‖∞ ≤ tol (converges for contractions, e.g. Bellman operators)."""
    z = np.array(z0, dtype="float64")
    for iteration in range(1, max_iter + 1):
        z_new = update(z)
        if not np.all(np.isfinite(z_new)):
            return z, False, iteration, iteration
        if np.max(np.abs(z_new - z), initial=0.0) <= tol:
            return z_new, True, iteration, iteration
        z = z_new
    return z, False, max_iter, max_iter


def anderson(update, z0, *, tol: float, max_iter: int, memory: int = ANDERSON_MEMORY):
    """Anderson-accelerated fixed-point iteration (type II, Walker & Ni 2011), `memory` steps.

    With g(z) = T(z) − z and the last differences ΔZ, ΔG, the next iterate is
    z + g − (ΔZ + ΔG) γ where γ minimizes ‖g − ΔG γ‖ (least squares).
    """
    z = np.array(z0, dtype="float64")
    g = update(z) - z
    dz_hist, dg_hist = [], []
    for iteration in range(1, max_iter + 1):
        if not np.all(np.isfinite(g)):
            return z, False, iteration, iteration
        if np.max(np.abs(g), initial=0.0) <= tol:
            return z + g, True, iteration, iteration
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
    return z, False, max_iter, max_iter
