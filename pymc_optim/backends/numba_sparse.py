"""Numba implementations of the sparse Cholesky Ops (`pymc_optim.linalg.sparse`).

Each Op runs the numba kernels of `pymc_optim.linalg._cholesky` on its pattern's symbolic
analysis, which the process registers (`numba_runtime.register_arrays`, when PyTensor funcifies
the node) and the kernels read at run time: the kernels hold no pattern, so they are compiled
once per process (and kept on numba's disk cache) for every pattern of every size, and called
through their addresses (`numba_outline.outlined`); what is compiled per pattern is a wrapper
holding the pattern's key. (Held as constants, the index arrays of the factor's size were
compiled into every Op's machine code, and past 1 MB made it uncacheable.)
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
    registered_array,
    registered_arrays,
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

#: The arrays of a pattern's symbolic analysis the kernels read, registered in this order.
_FIELDS = (
    "sn_start",
    "sn_xptr",
    "col_to_sn",
    "sn_rowptr",
    "sn_rows",
    "x_map",
    "perm",
    "diag_slots",
)
_SN_START, _SN_XPTR, _COL_TO_SN, _SN_ROWPTR, _SN_ROWS, _X_MAP, _PERM, _DIAG_SLOTS = range(8)
_N_FIELDS = len(_FIELDS)


def _pattern_key(pattern: SparsePattern) -> int:
    """The integer key of `pattern`'s registered analysis and of its factor cache: the same in
    every process."""
    return 2 * (int(pattern._key[:15], 16) >> 1)


def _register(pattern: SparsePattern) -> int:
    """Register `pattern`'s analysis for the kernels; returns its `_pattern_key`."""
    key = _pattern_key(pattern)
    analysis = pattern._analysis()
    numba_runtime.register_arrays(key, [getattr(analysis, name) for name in _FIELDS])
    return key


def _kernel_key(name: str) -> str:
    parts = (name, _SOURCE_KEY, _cholesky.GEMM_MIN, _cholesky.LAPACK_MIN, BLAS_THREADS_SETTABLE)
    return sha256(str(parts).encode()).hexdigest()


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


@numba_njit
def _factorize(table, values):
    """The supernodal factor of the matrix with these values (its block layout,
    `_cholesky.factorize`) and the failing pivot (−1 when positive definite)."""
    sn_xptr, x_map = registered_array(table, _SN_XPTR), registered_array(table, _X_MAP)
    x = np.zeros(sn_xptr[sn_xptr.size - 1])
    for e in range(x_map.size):
        x[x_map[e]] += values[e]
    failed = _cholesky._numeric_supernodal(
        registered_array(table, _SN_START),
        sn_xptr,
        registered_array(table, _COL_TO_SN),
        registered_array(table, _SN_ROWPTR),
        registered_array(table, _SN_ROWS),
        x,
        _cholesky.GEMM_MIN,
        _cholesky.LAPACK_MIN,
    )
    return x, failed


#: Entries of a factor cache before its values: filled, failed pivot, factorizations made.
_CACHE_HEADER = 3


@numba_njit
def _factor_kernel(key, values, cached):
    """``factor(key, values, cached)`` → (x, failed) for the pattern registered under `key`;
    with `cached`, this thread's last factor on the pattern when the values are equal (x is
    then a view of the buffer: the callers only read it)."""
    table = registered_arrays(key, _N_FIELDS)
    if not cached:
        return _factorize(table, values)
    nnz = values.size
    sn_xptr = registered_array(table, _SN_XPTR)
    x_size = sn_xptr[sn_xptr.size - 1]
    # the cache: [1 if filled, failed pivot, factorizations made, values (nnz), factor (x_size)]
    state = solver_buffer(key, _CACHE_HEADER + nnz + x_size)
    if state.size == 0:
        return _factorize(table, values)
    if state[0] == 1.0:
        same = True
        for e in range(nnz):
            if state[_CACHE_HEADER + e] != values[e]:
                same = False
                break
        if same:
            return state[_CACHE_HEADER + nnz :], np.int64(state[1])
    x, failed = _factorize(table, values)
    state[0] = 0.0  # (filled last: an interrupted write leaves it empty)
    state[1] = failed
    state[2] += 1.0
    copy_into(state, _CACHE_HEADER, values)
    copy_into(state, _CACHE_HEADER + nnz, x)
    state[0] = 1.0
    return x, failed


def factorizations(pattern: SparsePattern) -> int:
    """How many one-matrix factorizations of `pattern` the compiled Ops have made in this
    thread (each miss of its factor cache; a diagnostic for tests and benchmarks)."""
    state = numba_runtime.thread_buffer(_pattern_key(pattern))
    return 0 if state is None or state.size < _CACHE_HEADER else int(state[2])


@numba_njit
def _logdet_kernel(key, x):
    """log det A = 2 Σ log L_jj from the factor x."""
    diagonal = registered_array(registered_arrays(key, _N_FIELDS), _DIAG_SLOTS)
    total = 0.0
    for slot in diagonal:
        total += np.log(x[slot])
    return 2.0 * total


@numba_njit
def _selected_inverse_kernel(key, x):
    """The entries of A⁻¹ on the pattern, from the factor x."""
    table = registered_arrays(key, _N_FIELDS)
    z = _cholesky._selinv_supernodal(
        registered_array(table, _SN_START),
        registered_array(table, _SN_XPTR),
        registered_array(table, _COL_TO_SN),
        registered_array(table, _SN_ROWPTR),
        registered_array(table, _SN_ROWS),
        x,
        _cholesky.GEMM_MIN,
        _cholesky.LAPACK_MIN,
    )
    return z[registered_array(table, _X_MAP)]


@numba_njit
def _right_hand_side_kernel(key, x, b, permute, forward, backward, unpermute):
    """For b of shape (n,) or (n, k), from the factor x: y = P b (or b) as (n, k), then L⁻¹ y
    and/or L⁻ᵀ y in place, returned as Pᵀ y (or y) in b's shape: the solve (all four), a draw
    Pᵀ L⁻ᵀ z (`_cholesky.sample`) or L⁻¹ P u (`_cholesky.forward_permuted`)."""
    table = registered_arrays(key, _N_FIELDS)
    sn_start, sn_xptr = registered_array(table, _SN_START), registered_array(table, _SN_XPTR)
    sn_rowptr, sn_rows = registered_array(table, _SN_ROWPTR), registered_array(table, _SN_ROWS)
    perm = registered_array(table, _PERM)
    n = perm.size
    columns = b.reshape((n, -1)) if b.flags.c_contiguous else b.copy().reshape((n, -1))
    y = np.empty(columns.shape)
    for i in range(n):
        row = perm[i] if permute else i
        for j in range(y.shape[1]):
            y[i, j] = columns[row, j]
    if forward:
        _cholesky._forward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y)
    if backward:
        _cholesky._backward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y)
    if not unpermute:
        return y.reshape(b.shape)
    out = np.empty(y.shape)
    for i in range(n):
        for j in range(y.shape[1]):
            out[perm[i], j] = y[i, j]
    return out.reshape(b.shape)


# compiled once per process, for every pattern; called through their addresses
_factor = outlined(_factor_kernel, _kernel_key("factor"))
_logdet = outlined(_logdet_kernel, _kernel_key("logdet"))
_selected_inverse = outlined(_selected_inverse_kernel, _kernel_key("selected_inverse"))
_right_hand_side = outlined(_right_hand_side_kernel, _kernel_key("right_hand_side"))


def _of_values(key: int, kernel, batched: bool, width: int):
    """An Op of the values alone on the pattern registered under `key`: ``kernel(key, x)`` on
    each matrix's factor, a scalar (`width` 0) or `width` values per matrix, NaN where a matrix
    is not positive definite."""
    if not batched and width == 0:

        @numba_njit
        def scalar_of_one_matrix(values):
            threads = set_blas_threads(1)
            x, failed = _factor(key, np.ascontiguousarray(values), True)
            out = np.nan if failed >= 0 else kernel(key, x)
            set_blas_threads(threads)
            return np.asarray(out)

        return scalar_of_one_matrix

    if not batched:

        @numba_njit
        def of_one_matrix(values):
            threads = set_blas_threads(1)
            x, failed = _factor(key, np.ascontiguousarray(values), True)
            out = np.full(width, np.nan)
            if failed < 0:
                copy_into(out, 0, kernel(key, x))
            set_blas_threads(threads)
            return out

        return of_one_matrix

    if width == 0:

        @numba_njit
        def scalar_of_each_matrix(values):
            threads = set_blas_threads(1)
            out = np.full(values.shape[0], np.nan)
            for b in range(values.shape[0]):
                x, failed = _factor(key, np.ascontiguousarray(values[b]), False)
                if failed < 0:
                    out[b] = kernel(key, x)
            set_blas_threads(threads)
            return out

        return scalar_of_each_matrix

    @numba_njit
    def of_each_matrix(values):
        threads = set_blas_threads(1)
        out = np.full((values.shape[0], width), np.nan)
        for b in range(values.shape[0]):
            x, failed = _factor(key, np.ascontiguousarray(values[b]), False)
            if failed < 0:
                copy_into(out[b], 0, kernel(key, x))
        set_blas_threads(threads)
        return out

    return of_each_matrix


def _of_values_and_rhs(key: int, kernel, batched: bool):
    """An Op of (values, b) on the pattern registered under `key`: ``kernel(key, x, b)``
    shaped like b (row b of b for matrix b of a batch), NaN where a matrix is not positive
    definite."""
    if not batched:

        @numba_njit
        def of_one_matrix(values, rhs):
            threads = set_blas_threads(1)
            x, failed = _factor(key, np.ascontiguousarray(values), True)
            out = np.full(rhs.shape, np.nan) if failed >= 0 else kernel(key, x, rhs)
            set_blas_threads(threads)
            return out

        return of_one_matrix

    @numba_njit
    def of_each_matrix(values, rhs):
        threads = set_blas_threads(1)
        out = np.full(rhs.shape, np.nan)
        for b in range(values.shape[0]):
            x, failed = _factor(key, np.ascontiguousarray(values[b]), False)
            if failed < 0:
                copy_into(out[b], 0, kernel(key, x, rhs[b]))
        set_blas_threads(threads)
        return out

    return of_each_matrix


def _solve_kernel(*, permute, forward, backward, unpermute):
    """``kernel(key, x, b)``: `_right_hand_side_kernel` with these steps."""

    @numba_njit
    def kernel(key, x, b):
        return _right_hand_side(key, x, b, permute, forward, backward, unpermute)

    return kernel


@register_outlined(SparseLogdetOp)
def _numba_sparse_logdet(op, node=None, **kwargs):
    batched = node.inputs[0].type.ndim == 2
    return _of_values(_register(op.pattern), _logdet, batched, 0), _cache_key(op, node)


@register_outlined(SelectedInverseOp)
def _numba_selected_inverse(op, node=None, **kwargs):
    batched = node.inputs[0].type.ndim == 2
    funcified = _of_values(_register(op.pattern), _selected_inverse, batched, op.pattern.nnz)
    return funcified, _cache_key(op, node)


@register_outlined(SparseSolveOp)
def _numba_sparse_solve(op, node=None, **kwargs):
    kernel = _solve_kernel(permute=True, forward=True, backward=True, unpermute=True)
    batched = node.inputs[0].type.ndim == 2
    funcified = _of_values_and_rhs(_register(op.pattern), kernel, batched)
    return funcified, _cache_key(op, node)


@register_outlined(SparseFactorSolveOp)
def _numba_sparse_factor_solve(op, node=None, **kwargs):
    # Pᵀ L⁻ᵀ z (a draw), or its adjoint L⁻¹ P u
    draw = op.transposed
    kernel = _solve_kernel(permute=not draw, forward=not draw, backward=draw, unpermute=draw)
    batched = node.inputs[0].type.ndim == 2
    funcified = _of_values_and_rhs(_register(op.pattern), kernel, batched)
    return funcified, _cache_key(op, node)
