"""Numba implementations of the sparse Cholesky Ops (`pymc_optim.linalg.sparse`).

Each Op runs the numba kernels of `pymc_optim.linalg._cholesky` on its pattern's symbolic
analysis, which the compiled function holds as constants (index arrays of the factor's size).
As the numpy path caches the last factor per pattern and thread (`SparsePattern._last`), a
one-matrix factorization is kept in a `numba_runtime` buffer under the pattern's key: the log
determinant and its gradient's selected inverse, or a solve and its pullback, at the same
values factorize once. A batch of matrices is factorized row by row, uncached. Every kernel
runs with the calling thread's BLAS on one thread (`numba_runtime.set_blas_threads`).
"""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path

import numpy as np
from pytensor.link.numba.dispatch.basic import numba_njit

from pymc_optim.backends import numba_runtime
from pymc_optim.backends.numba_outline import outlined, register_outlined
from pymc_optim.backends.numba_runtime import (
    BLAS_THREADS_SETTABLE,
    copy_into,
    set_blas_threads,
    solver_buffer,
)
from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.sparse import (
    SelectedInverseOp,
    SparseFactorSolveOp,
    SparseLogdetOp,
    SparsePattern,
    SparseSolveOp,
)

__all__: list[str] = []

#: Part of every cache key: the sources of this module, the kernels and the runtime it calls.
_SOURCE_KEY = sha256(
    Path(__file__).read_bytes()
    + Path(_cholesky.__file__).read_bytes()
    + Path(numba_runtime.__file__).read_bytes()
).hexdigest()


def _cache_key(op, node) -> str:
    parts = (
        type(op).__name__,
        getattr(op, "transposed", None),
        op.pattern._key,
        [(x.type.dtype, x.type.ndim) for x in node.inputs],
        _SOURCE_KEY,
        _cholesky.GEMM_MIN,
        _cholesky.LAPACK_MIN,
        BLAS_THREADS_SETTABLE,
    )
    return sha256(str(parts).encode()).hexdigest()


def _factor_function(pattern: SparsePattern):
    """``factor(values, cached)`` → (x, failed): the supernodal factor of the matrix with these
    values (its block layout, `_cholesky.factorize`) and the failing pivot (−1 when positive
    definite). With `cached`, this thread's last factor on the pattern when the values are
    equal (x is then a view of the buffer: the callers only read it)."""
    s = pattern._analysis()
    sn_start, sn_xptr, col_to_sn = s.sn_start, s.sn_xptr, s.col_to_sn
    sn_rowptr, sn_rows, x_map = s.sn_rowptr, s.sn_rows, s.x_map
    x_size, nnz = int(s.sn_xptr[-1]), pattern.nnz
    gemm_min, lapack_min = _cholesky.GEMM_MIN, _cholesky.LAPACK_MIN
    numeric = _cholesky._numeric_supernodal
    # the cache: [1 if filled, failed pivot, values (nnz), factor (x_size)]
    key = 2 * (int(pattern._key[:15], 16) >> 1)

    @numba_njit
    def factorize(values):
        x = np.zeros(x_size)
        for e in range(nnz):
            x[x_map[e]] += values[e]
        failed = numeric(sn_start, sn_xptr, col_to_sn, sn_rowptr, sn_rows, x, gemm_min, lapack_min)
        return x, failed

    @numba_njit
    def factor(values, cached):
        if not cached:
            return factorize(values)
        state = solver_buffer(key, 2 + nnz + x_size)
        if state.size == 0:
            return factorize(values)
        if state[0] == 1.0:
            same = True
            for e in range(nnz):
                if state[2 + e] != values[e]:
                    same = False
                    break
            if same:
                return state[2 + nnz :], np.int64(state[1])
        x, failed = factorize(values)
        state[0] = 0.0  # (filled last: an interrupted write leaves it empty)
        state[1] = failed
        copy_into(state, 2, values)
        copy_into(state, 2 + nnz, x)
        state[0] = 1.0
        return x, failed

    # compiled once per pattern, whichever Ops call it (log det, selected inverse, solves)
    parts = ("factor", pattern._key, _SOURCE_KEY, gemm_min, lapack_min, BLAS_THREADS_SETTABLE)
    return outlined(factor, sha256(str(parts).encode()).hexdigest())


def _right_hand_side_kernel(pattern: SparsePattern, *, permute, forward, backward, unpermute):
    """``kernel(x, b)`` for b of shape (n,) or (n, k), from the factor x: y = P b (or b) as
    (n, k), then L⁻¹ y and/or L⁻ᵀ y in place, returned as Pᵀ y (or y) in b's shape: the
    solve (all four), a draw Pᵀ L⁻ᵀ z (`_cholesky.sample`) or L⁻¹ P u
    (`_cholesky.forward_permuted`)."""
    s = pattern._analysis()
    sn_start, sn_xptr, sn_rowptr, sn_rows, perm = (
        s.sn_start, s.sn_xptr, s.sn_rowptr, s.sn_rows, s.perm,
    )  # fmt: skip
    n = pattern.n
    forward_blocks, backward_blocks = _cholesky._forward_blocks, _cholesky._backward_blocks

    @numba_njit
    def kernel(x, b):
        columns = b.reshape((n, -1)) if b.flags.c_contiguous else b.copy().reshape((n, -1))
        y = np.empty(columns.shape)
        for i in range(n):
            row = perm[i] if permute else i
            for j in range(y.shape[1]):
                y[i, j] = columns[row, j]
        if forward:
            forward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y)
        if backward:
            backward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y)
        if not unpermute:
            return y.reshape(b.shape)
        out = np.empty(y.shape)
        for i in range(n):
            for j in range(y.shape[1]):
                out[perm[i], j] = y[i, j]
        return out.reshape(b.shape)

    return kernel


def _of_values(factor, kernel, batched: bool, width: int):
    """An Op of the values alone: ``kernel(x)`` on each matrix's factor, a scalar (`width` 0)
    or `width` values per matrix, NaN where a matrix is not positive definite."""
    if not batched and width == 0:

        @numba_njit
        def scalar_of_one_matrix(values):
            threads = set_blas_threads(1)
            x, failed = factor(np.ascontiguousarray(values), True)
            out = np.nan if failed >= 0 else kernel(x)
            set_blas_threads(threads)
            return np.asarray(out)

        return scalar_of_one_matrix

    if not batched:

        @numba_njit
        def of_one_matrix(values):
            threads = set_blas_threads(1)
            x, failed = factor(np.ascontiguousarray(values), True)
            out = np.full(width, np.nan)
            if failed < 0:
                copy_into(out, 0, kernel(x))
            set_blas_threads(threads)
            return out

        return of_one_matrix

    if width == 0:

        @numba_njit
        def scalar_of_each_matrix(values):
            threads = set_blas_threads(1)
            out = np.full(values.shape[0], np.nan)
            for b in range(values.shape[0]):
                x, failed = factor(np.ascontiguousarray(values[b]), False)
                if failed < 0:
                    out[b] = kernel(x)
            set_blas_threads(threads)
            return out

        return scalar_of_each_matrix

    @numba_njit
    def of_each_matrix(values):
        threads = set_blas_threads(1)
        out = np.full((values.shape[0], width), np.nan)
        for b in range(values.shape[0]):
            x, failed = factor(np.ascontiguousarray(values[b]), False)
            if failed < 0:
                copy_into(out[b], 0, kernel(x))
        set_blas_threads(threads)
        return out

    return of_each_matrix


def _of_values_and_rhs(factor, kernel, batched: bool):
    """An Op of (values, b): ``kernel(x, b)`` shaped like b (row b of b for matrix b of a
    batch), NaN where a matrix is not positive definite."""
    if not batched:

        @numba_njit
        def of_one_matrix(values, rhs):
            threads = set_blas_threads(1)
            x, failed = factor(np.ascontiguousarray(values), True)
            out = np.full(rhs.shape, np.nan) if failed >= 0 else kernel(x, rhs)
            set_blas_threads(threads)
            return out

        return of_one_matrix

    @numba_njit
    def of_each_matrix(values, rhs):
        threads = set_blas_threads(1)
        out = np.full(rhs.shape, np.nan)
        for b in range(values.shape[0]):
            x, failed = factor(np.ascontiguousarray(values[b]), False)
            if failed < 0:
                copy_into(out[b], 0, kernel(x, rhs[b]))
        set_blas_threads(threads)
        return out

    return of_each_matrix


@register_outlined(SparseLogdetOp)
def _numba_sparse_logdet(op, node=None, **kwargs):
    diagonal = op.pattern._analysis().diag_slots

    @numba_njit
    def logdet(x):  # log det A = 2 Σ log L_jj
        total = 0.0
        for slot in diagonal:
            total += np.log(x[slot])
        return 2.0 * total

    batched = node.inputs[0].type.ndim == 2
    return _of_values(_factor_function(op.pattern), logdet, batched, 0), _cache_key(op, node)


@register_outlined(SelectedInverseOp)
def _numba_selected_inverse(op, node=None, **kwargs):
    s = op.pattern._analysis()
    sn_start, sn_xptr, col_to_sn, sn_rowptr, sn_rows, x_map = (
        s.sn_start, s.sn_xptr, s.col_to_sn, s.sn_rowptr, s.sn_rows, s.x_map,
    )  # fmt: skip
    gemm_min, recurrences = _cholesky.GEMM_MIN, _cholesky._selinv_supernodal

    @numba_njit
    def selected_inverse(x):
        z = recurrences(sn_start, sn_xptr, col_to_sn, sn_rowptr, sn_rows, x, gemm_min)
        return z[x_map]

    batched = node.inputs[0].type.ndim == 2
    factor = _factor_function(op.pattern)
    funcified = _of_values(factor, selected_inverse, batched, op.pattern.nnz)
    return funcified, _cache_key(op, node)


@register_outlined(SparseSolveOp)
def _numba_sparse_solve(op, node=None, **kwargs):
    kernel = _right_hand_side_kernel(
        op.pattern, permute=True, forward=True, backward=True, unpermute=True
    )
    batched = node.inputs[0].type.ndim == 2
    funcified = _of_values_and_rhs(_factor_function(op.pattern), kernel, batched)
    return funcified, _cache_key(op, node)


@register_outlined(SparseFactorSolveOp)
def _numba_sparse_factor_solve(op, node=None, **kwargs):
    # Pᵀ L⁻ᵀ z (a draw), or its adjoint L⁻¹ P u
    draw = op.transposed
    kernel = _right_hand_side_kernel(
        op.pattern, permute=not draw, forward=not draw, backward=draw, unpermute=draw
    )
    batched = node.inputs[0].type.ndim == 2
    funcified = _of_values_and_rhs(_factor_function(op.pattern), kernel, batched)
    return funcified, _cache_key(op, node)
