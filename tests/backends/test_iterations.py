"""The numpy Newton loop's final step: with the previous iterate's Jacobian where the last step
converged fast (`iterations.chord_final_step`), exact to rounding either way."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pytensor.compile.mode import Mode

import pymc_optim as pmo
from pymc_optim import PymcOptimWarning
from pymc_optim.backends import iterations
from pymc_optim.linalg.structure import LinearStructure

DIAGONAL = LinearStructure("diagonal")


def softplus_system(a):
    """min Σ eᶻ − a z for each row of `a` (one problem per row), as `iterations.newton` takes
    it on the flat z: F = eᶻ − a, A = eᶻ (diagonal), z* = log a."""
    flat = a.ravel()

    def system(z):
        return merit(z), np.exp(z) - flat, np.exp(z)

    def merit(z):
        return (np.exp(z) - flat * z).reshape(a.shape).sum(axis=1)

    return system, merit


def solve_with_records(monkeypatch):
    """The Jacobians `iterations.solve` receives, in order (the identity of each array)."""
    seen = []
    solve = iterations.solve

    def recording(structure, A, F):
        seen.append(A)
        return solve(structure, A, F)

    monkeypatch.setattr(iterations, "solve", recording)
    return seen


def run(a, start, rows=None):
    system, merit = softplus_system(a)
    kwargs = dict(structure=DIAGONAL, minimization=True, tol=1e-8, max_iter=20)
    return iterations.newton(system, merit, start.ravel(), rows=rows, **kwargs)


# offsets from z*: 3e-4 converges 9e-8 → 2e-15 in max|F| (ρ·F ≈ 4e-23 ≤ tol²: the previous
# Jacobian serves); 1e-2 ends 1e-4 → 3e-9 (ρ·F ≈ 6e-14 > tol²: A at the last iterate)
@pytest.mark.parametrize("offset, reused", [(3e-4, True), (1e-2, False)])
@pytest.mark.parametrize("n_problems", [1, 2])
def test_final_step_takes_the_previous_jacobian_only_after_a_fast_step(
    monkeypatch, offset, reused, n_problems
):
    a = np.tile([2.0, 3.0, 5.0], (n_problems, 1))
    rows = None if n_problems == 1 else np.arange(a.size).reshape(a.shape)
    start = np.log(a) + offset
    seen = solve_with_records(monkeypatch)
    z, success, n_iterations, n_evaluations, _ = run(a, start, rows)
    assert success.all()
    assert (seen[-1] is seen[-2]) == reused
    assert n_evaluations.tolist() == (n_iterations + 1).tolist()  # one evaluation per iteration
    # exact to rounding either way, and as the exact final step would leave it
    monkeypatch.setattr(iterations, "chord_final_step", lambda *args: False)
    exact, *_ = run(a, start, rows)
    np.testing.assert_allclose(z, np.log(a.ravel()), rtol=4e-16)
    np.testing.assert_allclose(z, exact, rtol=4e-16)


def test_one_slow_problem_keeps_every_problem_on_its_own_jacobian(monkeypatch):
    """The rule is joint: a batch solves with one Jacobian array (a structure caches one
    factorization of it), so one problem ending slowly keeps the last iterate's A for all."""
    a = np.array([[2.0, 3.0, 5.0], [2.0, 3.0, 5.0]])
    start = np.log(a) + np.array([[3e-4], [1e-2]])
    seen = solve_with_records(monkeypatch)
    z, success, n_iterations, *_ = run(a, start, np.arange(6).reshape(2, 3))
    assert success.all() and n_iterations[0] == n_iterations[1]  # both stop in one iteration
    assert seen[-1] is not seen[-2]
    np.testing.assert_allclose(z, np.log(a.ravel()), rtol=4e-16)


def test_the_rule_is_the_predicted_error_against_tol_squared():
    tol = 1e-8
    assert iterations.chord_final_step(2e-15, 9e-8, tol)  # ρ·F = 4e-23
    assert not iterations.chord_final_step(3e-9, 1e-4, tol)  # ρ·F = 9e-14
    assert not iterations.chord_final_step(1e-9, 0.0, tol)  # no previous step
    assert iterations.chord_final_step(0.0, 0.0, tol)  # F = 0: the step is zero anyway


# --- on a sparse Laplace marginal: one factorization fewer, under numpy and numba alike ---------
def icar_marginal():
    """The CustomDist ICAR of `bench_low_rank` on an 18 × 18 grid: H sparse plus rank one, the
    marginal's Newton solve warm-started."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import bench_low_rank

    model, *_ = bench_low_rank.icar_poisson_model(18, "CustomDist")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The prior of `phi`", PymcOptimWarning)
        marginal = pmo.marginalize_laplace(model, "phi")
    return marginal, pmo.laplace_info(marginal).structure.sparse.pattern


def factorizations_at_a_nearby_point(marginal, mode, count):
    """Factorizations of a logp+gradient at θ + 0.002 after one at θ (`count()` reads the
    running total)."""
    fn = marginal.logp_dlogp_function(ravel_inputs=True, mode=mode)
    fn.set_extra_values({})
    theta = np.array([1.0, np.log(0.5)])
    fn(theta)
    before = count()
    fn(theta + 0.002)
    return count() - before


def test_the_final_step_saves_a_factorization_of_a_warm_sparse_marginal(monkeypatch):
    """At a nearby θ the warm solve converges 7e-3 → 1.5e-6 → 1.5e-13 in max|F|: the final
    step reuses the second iterate's factor. Four factorizations (two Newton steps, the canonical
    step, the log determinant) under numpy and under numba, five without the reuse."""
    pytest.importorskip("numba")
    from pymc_optim.backends import numba_sparse
    from pymc_optim.linalg import _cholesky

    marginal, pattern = icar_marginal()
    calls = []
    factorize = _cholesky.factorize
    monkeypatch.setattr(_cholesky, "factorize", lambda *a: calls.append(1) or factorize(*a))
    numpy_count = factorizations_at_a_nearby_point(marginal, Mode(linker="cvm"), calls.__len__)
    numba_count = factorizations_at_a_nearby_point(
        marginal, "NUMBA", lambda: numba_sparse.factorizations(pattern)
    )
    monkeypatch.setattr(iterations, "chord_final_step", lambda *args: False)
    without = factorizations_at_a_nearby_point(marginal, Mode(linker="cvm"), calls.__len__)
    assert numpy_count == numba_count == 4
    assert without == 5
