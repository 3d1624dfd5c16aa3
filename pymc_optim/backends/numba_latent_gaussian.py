"""Numba implementations of the latent-Gaussian Ops of `pymc_optim.linalg.latent_gaussian`
(nutpie's default backend): by loops, or the LAPACK routines PyTensor's own numba linear algebra
calls. Without them numba runs these Ops in object mode, a Python call per evaluation.
"""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path

import numpy as np
from pytensor.link.numba.dispatch import basic as numba_basic
from pytensor.link.numba.dispatch.linalg.decomposition.cholesky import _cholesky
from pytensor.link.numba.dispatch.linalg.solvers.cholesky import _cho_solve
from pytensor.link.numba.dispatch.linalg.solvers.triangular import _solve_triangular

from pymc_optim.backends.numba_outline import register_outlined
from pymc_optim.linalg import latent_gaussian as _latent_gaussian
from pymc_optim.linalg.latent_gaussian import BCholesky, CholeskyInverse, LowerSolve, PlusDiagonal

__all__ = ["NUMBA_LOOPS_MAX"]

#: The largest n for which numba computes (L Lᵀ)⁻¹ and L⁻¹ M by loops in one thread
#: (`_cholesky_inverse_loops`, `_lower_solve_loops`) rather than by LAPACK through OpenBLAS's
#: thread pool: potrs with the identity (PyTensor's numba bindings have no potri) does 2n³ flops
#: where the loops do n³/3, and a threaded call waits for a descheduled thread on a busy machine
#: (`benchmarks/bench_contention.py`).
NUMBA_LOOPS_MAX = 512


def _cholesky_inverse_loops(L):
    """(L Lᵀ)⁻¹ for a finite lower-triangular L with a nonzero diagonal: the rows of R = L⁻¹ by
    forward substitution (row i is (eᵢ − Σₖ<ᵢ Lᵢₖ Rₖ) / Lᵢᵢ), then the lower triangle of
    Rᵀ R as a sum of the rows' outer products, mirrored. Every inner loop runs along a row.
    Compiled below."""
    n = L.shape[0]
    R = np.zeros((n, n))
    for i in range(n):
        r = R[i]
        r[i] = 1.0
        for k in range(i):
            c = L[i, k]
            if c != 0.0:
                rk = R[k]
                for j in range(k + 1):
                    r[j] -= c * rk[j]
        d = 1.0 / L[i, i]
        for j in range(i + 1):
            r[j] *= d
    X = np.zeros((n, n))
    for k in range(n):
        rk = R[k]
        for a in range(k + 1):
            c = rk[a]
            if c != 0.0:
                xa = X[a]
                for b in range(a + 1):
                    xa[b] += c * rk[b]
    for a in range(n):
        for b in range(a):
            X[b, a] = X[a, b]
    return X


def _lower_solve_loops(L, M):
    """L⁻¹ M for a lower-triangular L with a nonzero diagonal, row by row (row i of the result
    is (Mᵢ − Σₖ<ᵢ Lᵢₖ Xₖ) / Lᵢᵢ): every inner loop runs along a row. Written for numba."""
    n, m = M.shape
    X = np.empty((n, m))
    for i in range(n):
        x = X[i]
        for j in range(m):
            x[j] = M[i, j]
        for k in range(i):
            c = L[i, k]
            if c != 0.0:
                xk = X[k]
                for j in range(m):
                    x[j] -= c * xk[j]
        d = 1.0 / L[i, i]
        for j in range(m):
            x[j] *= d
    return X


inverse_loops = numba_basic.numba_njit(_cholesky_inverse_loops)
solve_loops = numba_basic.numba_njit(_lower_solve_loops)
# numba's disk cache keys these by the Op's type and props: the salt, the hash of this file and
# the Ops' own, makes an edited implementation a new entry rather than a stale hit
salt = int(
    sha256(Path(__file__).read_bytes() + Path(_latent_gaussian.__file__).read_bytes()).hexdigest()[
        :15
    ],
    16,
)


def _key(op) -> str:
    """PyTensor's default cache key of `op` (its type and props), salted with this file's hash."""
    return numba_basic.default_hash_key_from_props(op, cache_version=str(salt))


@register_outlined(BCholesky)
def _numba_b_cholesky(op, node, **kwargs):
    @numba_basic.numba_njit
    def b_cholesky(K, w):
        n = w.shape[0]
        if not np.all(w >= 0.0):  # False for NaN
            return np.full((n, n), np.nan)
        s = np.sqrt(w)
        B = np.empty((n, n))
        for j in range(n):
            for i in range(n):
                B[i, j] = s[i] * K[i, j] * s[j]
            B[j, j] += 1.0
        # NaN everywhere when potrf fails; a NaN or infinity in B reaches L's diagonal
        L = _cholesky(B, True, True)
        if not np.all(np.isfinite(np.diag(L))):
            return np.full((n, n), np.nan)
        return L

    return b_cholesky, _key(op)


@register_outlined(PlusDiagonal)
def _numba_plus_diagonal(op, node, **kwargs):
    @numba_basic.numba_njit
    def plus_diagonal(Q, w):
        A = Q.copy()
        for i in range(w.shape[0]):
            A[i, i] += w[i]
        return A

    return plus_diagonal, _key(op)


@register_outlined(CholeskyInverse)
def _numba_cholesky_inverse(op, node, **kwargs):
    @numba_basic.numba_njit
    def cholesky_inverse(L):
        n = L.shape[0]
        if not np.all(np.isfinite(L)):
            return np.full((n, n), np.nan)
        if n > NUMBA_LOOPS_MAX:
            return _cho_solve(L, np.eye(n), True, True)
        return inverse_loops(L)

    return cholesky_inverse, _key(op)


@register_outlined(LowerSolve)
def _numba_lower_solve(op, node, **kwargs):
    @numba_basic.numba_njit
    def lower_solve(L, M):
        if L.shape[0] > NUMBA_LOOPS_MAX:
            return _solve_triangular(L, M, True, False, False)
        return solve_loops(L, M)

    return lower_solve, _key(op)
