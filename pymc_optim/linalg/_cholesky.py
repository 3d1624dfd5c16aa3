"""Sparse Cholesky kernels (numba): symbolic analysis once, numeric refactorization per call.

The matrix is symmetric positive definite, given by the entries of its lower triangle. Symbolic
analysis (once per pattern): a fill-reducing permutation P (minimum degree on the pattern of
A + Aᵀ, taken from SuperLU's ordering, renumbered in a postorder of its elimination tree), the
elimination tree of C = P A Pᵀ and, from it, the pattern of the factor L (C = L Lᵀ) row by row,
then its supernodes (relaxed: small ones merged into their parents) as dense blocks, with the
slot of every entry precomputed. The numeric factorization (`factorize`) is left-looking
supernodal, and the factor stays in that block layout for log det, solves, draws and the
selected inverse. The reference it is tested against (`factorize_simplicial`) is the up-looking
algorithm (row k of L is the sparse triangular solve L[:k, :k] l = C[:k, k], its pattern the
reach of C[:k, k] in the elimination tree): no allocation, no search, flops = Σ_j |L[:, j]|².

Selected inverse (Takahashi, Fagan & Chen 1973). With Z = C⁻¹ = L⁻ᵀ L⁻¹, row j of Lᵀ Z = L⁻¹
reads, for i ≥ j,  L_jj Z_ji + Σ_{k > j} L_kj Z_ki = δ_ij / L_jj,  so, columns from last to first,

    Z_ij = -(1/L_jj) Σ_{k ∈ S_j} L_kj Z_ik      (i ∈ S_j),
    Z_jj = 1/L_jj² - (1/L_jj) Σ_{k ∈ S_j} L_kj Z_kj,

with S_j the rows of L's column j below the diagonal. Every Z_ik needed (i, k ∈ S_j) lies on L's
pattern (S_j is a clique of the filled graph), so Z is computed on L's pattern only, never dense.
Column j reads, for each k ∈ S_j, the part of column k below k; its cost is Σ_j Σ_{k ∈ S_j}
|L[:, k]|, the same order as the factorization's. `selected_inverse` runs the same recurrences
on L's supernodes (blocks of columns sharing their rows), as dense matrix products per block
(`_selinv_supernodal`); the column version stays as the tested reference
(`selected_inverse_simplicial`). benchmarks/bench_sparse.py measures both against the
factorization.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - exercised by the missing-extra test via sys.modules
    numba = None

__all__ = [
    "Symbolic",
    "analyse",
    "factorize",
    "factorize_simplicial",
    "forward_permuted",
    "logdet",
    "sample",
    "selected_inverse",
    "selected_inverse_simplicial",
    "solve",
]

_INSTALL_HINT = (
    "Sparse structures need the optional extra `sparse` (numba kernels): "
    "`pip install 'pymc-optim[sparse]'`."
)


def _lapack_symbols():
    """dpotrf, dpotri and dtrsm from scipy's LAPACK/BLAS, callable from numba kernels that
    cache: the addresses are registered under our own symbol names with LLVM at import, and
    the kernels call those names (`numba.types.ExternalFunction`), so a cached kernel links to
    this process's addresses. Arguments are pointers (Fortran convention), passed as
    integers."""
    import llvmlite.binding as llvm
    from numba import types
    from numba.extending import get_cython_function_address

    pointer = types.intp
    llvm.add_symbol(
        "pymc_optim_dpotrf", get_cython_function_address("scipy.linalg.cython_lapack", "dpotrf")
    )
    llvm.add_symbol(
        "pymc_optim_dpotri", get_cython_function_address("scipy.linalg.cython_lapack", "dpotri")
    )
    llvm.add_symbol(
        "pymc_optim_dtrsm", get_cython_function_address("scipy.linalg.cython_blas", "dtrsm")
    )
    potrf = types.ExternalFunction("pymc_optim_dpotrf", types.void(*[pointer] * 5))
    potri = types.ExternalFunction("pymc_optim_dpotri", types.void(*[pointer] * 5))
    trsm = types.ExternalFunction("pymc_optim_dtrsm", types.void(*[pointer] * 11))
    return potrf, potri, trsm


if numba is not None:
    _dpotrf, _dpotri, _dtrsm = _lapack_symbols()


def _blas_thread_setter():
    """OpenBLAS's ``openblas_set_num_threads_local`` for the BLAS the kernels call (scipy's,
    through `scipy.linalg.cython_blas`), or None where that BLAS does not have it (another BLAS,
    or OpenBLAS before 0.3.27)."""
    try:
        import scipy.linalg.cython_blas as blas

        setter = ctypes.CDLL(blas.__file__).openblas_set_num_threads_local
    except (OSError, AttributeError):
        return None
    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
    return setter


#: Sets the calling thread's OpenBLAS thread count and returns the previous one; None where
#: scipy's BLAS cannot (`_one_blas_thread` and the numba Newton loop use it).
SET_BLAS_THREADS = _blas_thread_setter()


def _one_blas_thread(function):
    """`function` with the calling thread's BLAS and LAPACK calls on one thread. Its blocks
    gain nothing measurable from OpenBLAS's threads, and a threaded call waits for a thread
    the OS has descheduled when another process or chain is busy (benchmarks/README.md)."""
    if SET_BLAS_THREADS is None:
        return function

    @functools.wraps(function)
    def on_one_thread(*args, **kwargs):
        previous = SET_BLAS_THREADS(1)
        try:
            return function(*args, **kwargs)
        finally:
            SET_BLAS_THREADS(previous)

    return on_one_thread


def require_backend() -> None:
    """Raise ImportError naming the `sparse` extra when numba is not installed."""
    if numba is None:
        raise ImportError(_INSTALL_HINT)


def _jit(function):
    if numba is None:
        return function
    return numba.njit(cache=True, nogil=True)(function)


class Symbolic:
    """Result of the symbolic analysis of one lower-triangular pattern (numpy arrays only)."""

    __slots__ = (
        "n",
        "perm",
        "inverse_perm",
        "c_indptr",
        "c_indices",
        "c_map",
        "row_indptr",
        "row_columns",
        "row_slots",
        "l_indptr",
        "l_indices",
        "l_map",
        "max_column",
        "sn_start",
        "col_to_sn",
        "sn_xptr",
        "x_map",
        "l_to_x",
        "sn_rowptr",
        "sn_rows",
        "diag_slots",
    )

    def __init__(self, **fields):
        self.set(**fields)

    def set(self, **fields) -> None:
        """Set fields by name (the supernodal layout comes after the column layout)."""
        for name, value in fields.items():
            setattr(self, name, value)

    @property
    def factor_nnz(self) -> int:
        return int(self.l_indptr[-1])

    @property
    def factor_flops(self) -> float:
        """Multiply-adds of one numeric factorization, Σ_j |L[:, j]|²."""
        counts = np.diff(self.l_indptr).astype(np.float64)
        return float((counts**2).sum())


def fill_reducing_order(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """Minimum-degree ordering of the pattern of A + Aᵀ (SuperLU's MMD); returns old → new."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    off = rows != cols
    # A diagonally dominant matrix with the pattern: SuperLU orders it and never pivots off the
    # diagonal, so its column permutation is the symmetric ordering of the pattern.
    r = np.concatenate([rows[off], cols[off], np.arange(n)])
    c = np.concatenate([cols[off], rows[off], np.arange(n)])
    degree = np.bincount(r, minlength=n).astype(np.float64)
    v = np.concatenate([-np.ones(2 * off.sum()), degree + 1.0])
    pattern = sp.csc_matrix((v, (r, c)), shape=(n, n))
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    lu = splu(
        pattern,
        permc_spec="MMD_AT_PLUS_A",
        diag_pivot_thresh=0.0,
        options={"SymmetricMode": True},
    )
    inverse = np.asarray(lu.perm_c, dtype=np.int64)
    if not np.array_equal(np.sort(inverse), np.arange(n)):  # pragma: no cover - SuperLU contract
        raise RuntimeError("SuperLU returned an invalid column permutation")
    return inverse


def analyse(
    rows: np.ndarray, cols: np.ndarray, n: int, *, postorder: bool = True, relax: bool = True
) -> Symbolic:
    """Symbolic analysis of the SPD pattern with lower-triangle entries (rows ≥ cols).

    `postorder` renumbers the minimum-degree ordering in a postorder of its elimination tree
    and `relax` merges small supernodes into their parents at the price of a few explicit
    zeros (see `_relaxed_supernodes`); both only change the blocking, not the factor.
    """
    require_backend()
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    inverse = fill_reducing_order(rows, cols, n)
    if postorder:
        # Renumber in a postorder of the elimination tree (same fill, same tree): each
        # supernode's columns become contiguous with its heaviest child's, so blocks merge.
        c_indptr, c_indices, _, _ = _permuted_upper(rows, cols, n, inverse)
        parent = _etree(n, c_indptr, c_indices)
        weight = np.bincount(_row_patterns_of(n, c_indptr, c_indices, parent), minlength=n)
        order = _postorder(n, parent, weight)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        inverse = rank[inverse]
    perm = np.argsort(inverse)
    c_indptr, c_indices, c_map, (upper_row, upper_col) = _permuted_upper(rows, cols, n, inverse)

    parent = _etree(n, c_indptr, c_indices)
    counts = _row_counts(n, c_indptr, c_indices, parent)
    row_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_indptr[1:])
    row_columns = _row_patterns(n, c_indptr, c_indices, parent, row_indptr)
    column_counts = np.bincount(row_columns, minlength=n) + 1
    l_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(column_counts, out=l_indptr[1:])
    l_indices, row_slots = _factor_slots(n, row_indptr, row_columns, l_indptr)

    symbolic = Symbolic(
        n=n, perm=perm, inverse_perm=inverse, c_indptr=c_indptr, c_indices=c_indices,
        c_map=c_map, row_indptr=row_indptr, row_columns=row_columns, row_slots=row_slots,
        l_indptr=l_indptr, l_indices=l_indices, max_column=int(column_counts.max()),
    )  # fmt: skip
    # Slot in L of each user entry: (max, min) of its permuted indices; L's keys are sorted.
    l_keys = np.repeat(np.arange(n, dtype=np.int64), column_counts) * n + l_indices
    symbolic.l_map = np.searchsorted(l_keys, upper_row * n + upper_col)
    _supernodes(symbolic, parent, column_counts, l_keys, upper_row * n + upper_col, relax)
    return symbolic


def _permuted_upper(rows, cols, n, inverse):
    """C = P A Pᵀ as its upper triangle by columns (entry (min, max) in column max): indptr,
    row indices, the slot of each user entry, and the user entries' (min, max) indices."""
    new_r, new_c = inverse[rows], inverse[cols]
    upper_col = np.maximum(new_r, new_c)
    upper_row = np.minimum(new_r, new_c)
    keys, c_map = np.unique(upper_col * n + upper_row, return_inverse=True)
    c_indices = keys % n
    c_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // n, minlength=n), out=c_indptr[1:])
    return c_indptr, c_indices, c_map.astype(np.int64).ravel(), (upper_row, upper_col)


def _row_patterns_of(n, c_indptr, c_indices, parent):
    counts = _row_counts(n, c_indptr, c_indices, parent)
    row_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_indptr[1:])
    return _row_patterns(n, c_indptr, c_indices, parent, row_indptr)


def _supernodes(symbolic: Symbolic, parent, column_counts, l_keys, user_keys, relax) -> None:
    """Supernodes of L and their dense blocks.

    Fundamental supernodes are runs of columns j, j+1, … with parent(j) = j + 1 and
    |L[:, j]| = |L[:, j+1]| + 1, i.e. struct L[:, j] = {j} ∪ struct L[:, j+1]. With `relax`,
    a supernode is then merged into its parent when they are adjacent (`_relaxed_supernodes`).
    A supernode with columns [f, l) has rows R = [f, l) ∪ (struct L[:, l − 1] below l − 1)
    (every column's structure lies in it) and is one dense (|R|, l − f) block, row-major,
    explicit zeros included; the numeric factorization and the selected inverse work on these
    blocks, and `l_to_x` maps L's entries (column layout, no explicit zeros) into them."""
    n = symbolic.n
    l_indptr, l_indices = symbolic.l_indptr, symbolic.l_indices
    joins = np.zeros(n, dtype=bool)
    if n > 1:
        j = np.arange(n - 1)
        joins[1:] = (parent[j] == j + 1) & (column_counts[j] == column_counts[j + 1] + 1)
    sn_start = np.append(np.flatnonzero(~joins), n).astype(np.int64)
    if relax and sn_start.size > 2:
        sn_start = _relaxed_supernodes(sn_start, parent, column_counts)
    widths = np.diff(sn_start)
    last = sn_start[1:] - 1
    below = column_counts[last] - 1  # rows under each supernode's diagonal block
    heights = widths + below
    sn_rowptr = np.zeros(widths.size + 1, dtype=np.int64)
    np.cumsum(heights, out=sn_rowptr[1:])
    sn_xptr = np.zeros(widths.size + 1, dtype=np.int64)
    np.cumsum(widths * heights, out=sn_xptr[1:])
    col_to_sn = np.repeat(np.arange(widths.size, dtype=np.int64), widths)
    sn_rows = _supernode_rows(sn_start, sn_rowptr, l_indptr, l_indices)
    l_to_x = _entry_slots(sn_start, sn_rowptr, sn_rows, sn_xptr, col_to_sn, l_indptr, l_indices)
    local = np.arange(n, dtype=np.int64) - sn_start[col_to_sn]
    symbolic.set(
        l_to_x=l_to_x, x_map=l_to_x[np.searchsorted(l_keys, user_keys)], sn_start=sn_start,
        col_to_sn=col_to_sn, sn_xptr=sn_xptr, sn_rowptr=sn_rowptr, sn_rows=sn_rows,
        diag_slots=sn_xptr[col_to_sn] + local * widths[col_to_sn] + local,
    )  # fmt: skip


#: Relaxed amalgamation (CHOLMOD's defaults): a merged supernode of at most RELAX_COLUMNS[k]
#: columns is accepted when at most RELAX_ZEROS[k] of its block's entries are explicit zeros
#: (any share up to 4 columns; past 48 columns, 5 %).
RELAX_COLUMNS = (4, 16, 48)
RELAX_ZEROS = (0.8, 0.1, 0.05)


def _relaxed_supernodes(sn_start, parent, column_counts):
    """Merge each fundamental supernode into the one after it when that one is its parent
    (in a postorder, its heaviest child comes just before it), while the merged block keeps
    few explicit zeros (`RELAX_COLUMNS`, `RELAX_ZEROS`). Fewer, larger blocks: fewer
    updates, longer inner loops and matrix products, for a few percent more entries."""
    n_fund = sn_start.size - 1
    first_cols = sn_start[:-1]
    last_cols = sn_start[1:] - 1
    widths = np.diff(sn_start)
    col_to_fund = np.repeat(np.arange(n_fund, dtype=np.int64), widths)
    fund_parent = np.full(n_fund, -1, dtype=np.int64)
    has_parent = parent[last_cols] >= 0
    fund_parent[has_parent] = col_to_fund[parent[last_cols[has_parent]]]
    true_nnz = np.add.reduceat(column_counts, first_cols).astype(np.float64)
    below = (column_counts[last_cols] - 1).astype(np.float64)
    columns = widths.astype(np.float64)
    keep = np.ones(n_fund + 1, dtype=bool)
    for j in range(n_fund - 2, -1, -1):
        if fund_parent[j] != j + 1:
            continue
        k = j + 1  # first fundamental supernode of the merged block that starts at j + 1
        total_columns = columns[j] + columns[k]
        padded = total_columns * (total_columns + 1) / 2 + total_columns * below[k]
        zeros = (padded - true_nnz[j] - true_nnz[k]) / padded
        if (
            total_columns <= RELAX_COLUMNS[0]
            or (total_columns <= RELAX_COLUMNS[1] and zeros < RELAX_ZEROS[0])
            or (total_columns <= RELAX_COLUMNS[2] and zeros < RELAX_ZEROS[1])
            or zeros < RELAX_ZEROS[2]
        ):
            keep[k] = False
            columns[j] = total_columns
            true_nnz[j] += true_nnz[k]
            below[j] = below[k]
    return sn_start[keep]


@_one_blas_thread
def factorize(symbolic: Symbolic, values: np.ndarray) -> tuple[np.ndarray, int]:
    """Numeric factor L in the supernodal block layout (the representation every other function
    here takes); second output the failing pivot (-1 when SPD). Supernodal: dense blocks, each
    updated by its descendants' blocks (see `_numeric_supernodal`)."""
    s = symbolic
    x = np.bincount(s.x_map, weights=values, minlength=int(s.sn_xptr[-1]))
    failed = _numeric_supernodal(
        s.sn_start, s.sn_xptr, s.col_to_sn, s.sn_rowptr, s.sn_rows, x, GEMM_MIN, LAPACK_MIN
    )
    return x, int(failed)


def factorize_simplicial(symbolic: Symbolic, values: np.ndarray) -> tuple[np.ndarray, int]:
    """`factorize` by the up-looking simplicial algorithm, column by column (the reference the
    supernodal kernel is tested against), returned in the same block layout."""
    s = symbolic
    cx = np.zeros(len(s.c_indices))
    np.add.at(cx, s.c_map, values)
    lx = np.empty(s.factor_nnz)
    failed = _numeric(
        s.n, s.c_indptr, s.c_indices, cx, s.row_indptr, s.row_columns, s.row_slots, s.l_indptr,
        s.l_indices, lx,
    )  # fmt: skip
    x = np.zeros(int(s.sn_xptr[-1]))
    x[s.l_to_x] = lx
    return x, int(failed)


def logdet(symbolic: Symbolic, x: np.ndarray) -> float:
    """log det A = 2 Σ log L_jj."""
    return float(2.0 * np.log(x[symbolic.diag_slots]).sum())


def _blocks(symbolic: Symbolic):
    s = symbolic
    return s.sn_start, s.sn_xptr, s.sn_rowptr, s.sn_rows


def _permuted(symbolic: Symbolic, v: np.ndarray) -> np.ndarray:
    """P v as a fresh C-contiguous (n, k) array (the sweeps work in place)."""
    return np.ascontiguousarray(v[symbolic.perm].reshape(symbolic.n, -1), dtype=np.float64)


def _unpermuted(symbolic: Symbolic, y: np.ndarray, shape) -> np.ndarray:
    """Pᵀ y, reshaped to the caller's `shape`."""
    out = np.empty_like(y)
    out[symbolic.perm] = y
    return out.reshape(shape)


@_one_blas_thread
def solve(symbolic: Symbolic, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A⁻¹ b for b of shape (n,) or (n, k)."""
    y = _permuted(symbolic, b)
    _forward_blocks(*_blocks(symbolic), x, y)
    _backward_blocks(*_blocks(symbolic), x, y)
    return _unpermuted(symbolic, y, b.shape)


@_one_blas_thread
def sample(symbolic: Symbolic, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Pᵀ L⁻ᵀ z: for z ~ N(0, I) (shape (n,) or (n, k)) a draw from N(0, A⁻¹)."""
    # a copy: the solve works in place, and z (an Op's input) must not change
    y = np.array(z.reshape(symbolic.n, -1), dtype=np.float64, order="C")
    _backward_blocks(*_blocks(symbolic), x, y)
    return _unpermuted(symbolic, y, z.shape)


@_one_blas_thread
def forward_permuted(symbolic: Symbolic, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """L⁻¹ P u, the adjoint of :func:`sample` (u of shape (n,) or (n, k))."""
    y = _permuted(symbolic, u)
    _forward_blocks(*_blocks(symbolic), x, y)
    return y.reshape(u.shape)


@_one_blas_thread
def selected_inverse(symbolic: Symbolic, x: np.ndarray) -> np.ndarray:
    """(A⁻¹)_ij at every user entry (i, j) of the pattern: the Takahashi recurrences on L's
    supernodes, dense products on each block (see `_selinv_supernodal`)."""
    s = symbolic
    z = _selinv_supernodal(
        s.sn_start, s.sn_xptr, s.col_to_sn, s.sn_rowptr, s.sn_rows, x, GEMM_MIN, LAPACK_MIN
    )
    return z[s.x_map]


def selected_inverse_simplicial(symbolic: Symbolic, x: np.ndarray) -> np.ndarray:
    """`selected_inverse` by the column recurrences (the reference the supernodal kernel is
    tested against)."""
    s = symbolic
    z = _takahashi(s.n, s.l_indptr, s.l_indices, x[s.l_to_x], s.max_column)
    return z[s.l_map]


def _postorder(n, parent, weight):
    """A postorder of the forest `parent`, each node's children visited by increasing
    `weight` (so the heaviest comes last, just before its parent)."""
    nodes = np.arange(n, dtype=np.int64)
    order = np.lexsort((weight, parent))  # by parent, then weight; roots (parent -1) first
    order = order[parent[order] >= 0]
    child_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent[parent >= 0], minlength=n), out=child_ptr[1:])
    roots = nodes[parent < 0]
    roots = roots[np.argsort(weight[roots], kind="stable")]
    return _postorder_kernel(n, child_ptr, order, roots)


@_jit
def _postorder_kernel(n, child_ptr, children, roots):
    out = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    next_child = child_ptr[:-1].copy()
    k = 0
    for root in roots:
        top = 0
        stack[0] = root
        while top >= 0:
            node = stack[top]
            if next_child[node] < child_ptr[node + 1]:
                top += 1
                stack[top] = children[next_child[node]]
                next_child[node] += 1
            else:
                out[k] = node
                k += 1
                top -= 1
    return out


@_jit
def _supernode_rows(sn_start, sn_rowptr, l_indptr, l_indices):
    """Rows of each supernode's block: its columns, then the rows of its last column below
    the diagonal."""
    rows = np.empty(sn_rowptr[-1], dtype=np.int64)
    for s in range(sn_start.size - 1):
        f, end = sn_start[s], sn_start[s + 1]
        q = sn_rowptr[s]
        for j in range(f, end):
            rows[q] = j
            q += 1
        for p in range(l_indptr[end - 1] + 1, l_indptr[end]):
            rows[q] = l_indices[p]
            q += 1
    return rows


@_jit
def _entry_slots(sn_start, sn_rowptr, sn_rows, sn_xptr, col_to_sn, l_indptr, l_indices):
    """Slot in the supernodal blocks of each entry of L's column layout (rows sorted in both,
    so one merge per column)."""
    n = col_to_sn.size
    slots = np.empty(l_indptr[n], dtype=np.int64)
    for j in range(n):
        s = col_to_sn[j]
        f = sn_start[s]
        w = sn_start[s + 1] - f
        q = sn_rowptr[s] + (j - f)
        for p in range(l_indptr[j], l_indptr[j + 1]):
            while sn_rows[q] != l_indices[p]:
                q += 1
            slots[p] = sn_xptr[s] + (q - sn_rowptr[s]) * w + (j - f)
    return slots


# --- kernels ---------------------------------------------------------------------------------


@_jit
def _etree(n, c_indptr, c_indices):
    """Elimination tree of C from its upper triangle by columns (Liu, path compression)."""
    parent = np.full(n, -1, dtype=np.int64)
    ancestor = np.full(n, -1, dtype=np.int64)
    for k in range(n):
        for p in range(c_indptr[k], c_indptr[k + 1]):
            i = c_indices[p]
            while i != -1 and i < k:
                following = ancestor[i]
                ancestor[i] = k
                if following == -1:
                    parent[i] = k
                i = following
    return parent


@_jit
def _row_counts(n, c_indptr, c_indices, parent):
    """|row k of L| - 1 for each k: the size of the reach of C[:k, k] in the tree."""
    flag = np.full(n, -1, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    for k in range(n):
        flag[k] = k
        for p in range(c_indptr[k], c_indptr[k + 1]):
            i = c_indices[p]
            while flag[i] != k:
                counts[k] += 1
                flag[i] = k
                i = parent[i]
    return counts


@_jit
def _row_patterns(n, c_indptr, c_indices, parent, row_indptr):
    """Columns of row k of L (below the diagonal) in topological order of the tree."""
    flag = np.full(n, -1, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    out = np.empty(row_indptr[n], dtype=np.int64)
    for k in range(n):
        flag[k] = k
        top = row_indptr[k + 1]
        for p in range(c_indptr[k], c_indptr[k + 1]):
            i = c_indices[p]
            length = 0
            while flag[i] != k:
                stack[length] = i
                length += 1
                flag[i] = k
                i = parent[i]
            while length > 0:
                top -= 1
                length -= 1
                out[top] = stack[length]
    return out


@_jit
def _factor_slots(n, row_indptr, row_columns, l_indptr):
    """Row indices of L by columns (diagonal first) and the slot of each (k, column) entry."""
    l_indices = np.empty(l_indptr[n], dtype=np.int64)
    slots = np.empty(row_indptr[n], dtype=np.int64)
    fill = l_indptr[:-1].copy() + 1
    for j in range(n):
        l_indices[l_indptr[j]] = j
    for k in range(n):  # rows in increasing order: each column's rows come out sorted
        for t in range(row_indptr[k], row_indptr[k + 1]):
            j = row_columns[t]
            l_indices[fill[j]] = k
            slots[t] = fill[j]
            fill[j] += 1
    return l_indices, slots


@_jit
def _numeric(
    n, c_indptr, c_indices, cx, row_indptr, row_columns, row_slots, l_indptr, l_indices, lx
):
    """Up-looking Cholesky on the precomputed pattern; returns the failing row or -1."""
    x = np.zeros(n)
    for k in range(n):
        d = 0.0
        for p in range(c_indptr[k], c_indptr[k + 1]):
            i = c_indices[p]
            if i == k:
                d += cx[p]
            else:
                x[i] += cx[p]
        for t in range(row_indptr[k], row_indptr[k + 1]):
            i = row_columns[t]
            lki = x[i] / lx[l_indptr[i]]
            x[i] = 0.0
            for p in range(l_indptr[i] + 1, row_slots[t]):
                x[l_indices[p]] -= lx[p] * lki
            d -= lki * lki
            lx[row_slots[t]] = lki
        if not d > 0.0:  # also catches NaN
            return k
        lx[l_indptr[k]] = np.sqrt(d)
    return -1


#: Below this many multiply-adds a block update runs as loops; above, as one matrix product.
GEMM_MIN = 4096
#: Supernodes at least this wide factorize their diagonal block and the rows below by LAPACK
#: potrf and BLAS trsm; narrower ones by loops.
LAPACK_MIN = 16


@_jit
def _supernode(s, sn_start, sn_rowptr):
    """Supernode s's first column f, width w, offset r0 of its row list and height (rows)."""
    f = sn_start[s]
    w = sn_start[s + 1] - f
    r0 = sn_rowptr[s]
    return f, w, r0, sn_rowptr[s + 1] - r0


@_jit
def _block(x, s, sn_xptr, height, w):
    """Supernode s's (height × w) block of the factor values x (row-major), as a view."""
    return x[sn_xptr[s] : sn_xptr[s] + height * w].reshape(height, w)


@_jit
def _numeric_supernodal(sn_start, sn_xptr, col_to_sn, sn_rowptr, sn_rows, x, gemm_min, lapack_min):
    """Left-looking supernodal Cholesky, in place on the blocks `x` (assembled from A).

    Supernode s (columns [f, l), rows R_s, block B_s of shape (|R_s|, l − f)) receives, from
    each earlier supernode d with rows in [f, l) (rows p1:p2 of R_d), the update
    B_d[p1:, :] B_d[p1:p2, :]ᵀ scattered into B_s by global row; then its diagonal block is
    factorized and the rows below it solved (B_s ← B_s L_ss⁻ᵀ) in one pass. An update of at
    least `gemm_min` multiply-adds is one matrix product (BLAS), a smaller one loops. After its own
    factorization, and after each update, d waits in the list of the supernode of its next
    row (the classical linked lists of left-looking Cholesky). Returns the failing column or -1.
    """
    n_super = sn_start.size - 1
    n = sn_start[n_super]
    head = np.full(n_super, -1, dtype=np.int64)
    following = np.full(n_super, -1, dtype=np.int64)
    position = np.zeros(n_super, dtype=np.int64)
    local = np.zeros(n, dtype=np.int64)
    # Fortran arguments of potrf/trsm: the characters "L", "N", "U", "T" (one byte each, in
    # int32s), then the sizes and info; alpha = 1
    ints = np.array([76, 78, 85, 84, 0, 0, 0], dtype=np.int32)
    one = np.ones(1)
    for s in range(n_super):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        block = _block(x, s, sn_xptr, height, w)
        for r in range(height):
            local[sn_rows[r0 + r]] = r
        d = head[s]
        while d != -1:
            next_d = following[d]
            fd = sn_start[d]
            wd = sn_start[d + 1] - fd
            rd0 = sn_rowptr[d]
            height_d = sn_rowptr[d + 1] - rd0
            source = x[sn_xptr[d] : sn_xptr[d] + height_d * wd].reshape(height_d, wd)
            p1 = position[d]
            p2 = p1
            while p2 < height_d and sn_rows[rd0 + p2] < f + w:
                p2 += 1
            m1 = height_d - p1
            m2 = p2 - p1
            if wd * m1 * m2 >= gemm_min:
                # contiguous row ranges of the block, so the product is one BLAS call
                start = sn_xptr[d] + p1 * wd
                lower = x[start : start + m1 * wd].reshape(m1, wd)
                upper = x[start : start + m2 * wd].reshape(m2, wd)
                update = np.dot(lower, upper.T)
                for b in range(m2):
                    col = sn_rows[rd0 + p1 + b] - f
                    for a in range(b, m1):
                        block[local[sn_rows[rd0 + p1 + a]], col] -= update[a, b]
            else:
                for b in range(m2):
                    col = sn_rows[rd0 + p1 + b] - f
                    for a in range(b, m1):
                        total = 0.0
                        for k in range(wd):
                            total += source[p1 + a, k] * source[p1 + b, k]
                        block[local[sn_rows[rd0 + p1 + a]], col] -= total
            if p2 < height_d:
                t = col_to_sn[sn_rows[rd0 + p2]]
                position[d] = p2
                following[d] = head[t]
                head[t] = d
            d = next_d
        if w >= lapack_min:
            # LAPACK on the block seen column-major as Bᵀ (w × height, leading dimension w):
            # Bᵀ's upper triangle is B's lower one, so potrf("U") gives U = Lᵀ in place, and
            # the rows below, B_R ← B_R L⁻ᵀ, are Bᵀ_R ← U⁻ᵀ Bᵀ_R (trsm "L", "U", "T").
            base = x[sn_xptr[s] :].ctypes.data
            ints[4] = w
            ints[5] = height - w
            ints[6] = 0
            _dpotrf(ints[2:].ctypes.data, ints[4:].ctypes.data, base, ints[4:].ctypes.data,
                    ints[6:].ctypes.data)  # fmt: skip
            if ints[6] != 0:
                return f + ints[6] - 1
            for j in range(w):
                if not block[j, j] > 0.0:  # NaN (some LAPACKs let it through)
                    return f + j
            if height > w:
                _dtrsm(ints[0:].ctypes.data, ints[2:].ctypes.data, ints[3:].ctypes.data,
                       ints[1:].ctypes.data, ints[4:].ctypes.data, ints[5:].ctypes.data,
                       one.ctypes.data, base, ints[4:].ctypes.data, base + 8 * w * w,
                       ints[4:].ctypes.data)  # fmt: skip
        # the diagonal block's Cholesky and the rows below, column by column
        for j in range(w if w < lapack_min else 0):
            total = block[j, j]
            for k in range(j):
                total -= block[j, k] * block[j, k]
            if not total > 0.0:  # also catches NaN
                return f + j
            diagonal = np.sqrt(total)
            block[j, j] = diagonal
            for i in range(j + 1, height):
                total = block[i, j]
                for k in range(j):
                    total -= block[i, k] * block[j, k]
                block[i, j] = total / diagonal
        if height > w:
            t = col_to_sn[sn_rows[r0 + w]]
            position[s] = w
            following[s] = head[t]
            head[t] = s
    return -1 if ints[0] == 76 and one[0] == 1.0 else -2  # (keeps both arrays alive)


@_jit
def _forward_blocks_vector(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y):
    """`_forward_blocks` for one right-hand side (scalar accumulators)."""
    for s in range(sn_start.size - 1):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        base = sn_xptr[s]
        for r in range(height):
            acc = 0.0
            row = base + r * w
            for c in range(min(r, w)):
                acc += x[row + c] * y[f + c]
            if r < w:
                y[f + r] = (y[f + r] - acc) / x[row + r]
            else:
                y[sn_rows[r0 + r]] -= acc


@_jit
def _backward_blocks_vector(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y):
    """`_backward_blocks` for one right-hand side."""
    for s in range(sn_start.size - 2, -1, -1):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        base = sn_xptr[s]
        for r in range(w, height):
            value = y[sn_rows[r0 + r]]
            row = base + r * w
            for c in range(w):
                y[f + c] -= x[row + c] * value
        for r in range(w - 1, -1, -1):
            row = base + r * w
            value = y[f + r] / x[row + r]
            y[f + r] = value
            for c in range(r):
                y[f + c] -= x[row + c] * value


@_jit
def _forward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y):
    """y ← L⁻¹ y in place (y of shape (n, m)), supernode by supernode: the diagonal block's
    triangular solve, then y[R] −= L_RJ y[J], both along the blocks' rows (contiguous)."""
    m = y.shape[1]
    if m == 1:
        _forward_blocks_vector(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y[:, 0])
        return
    acc = np.empty(m)
    for s in range(sn_start.size - 1):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        block = _block(x, s, sn_xptr, height, w)
        for r in range(height):
            for k in range(m):
                acc[k] = 0.0
            for c in range(min(r, w)):
                value = block[r, c]
                for k in range(m):
                    acc[k] += value * y[f + c, k]
            if r < w:
                diag = block[r, r]
                for k in range(m):
                    y[f + r, k] = (y[f + r, k] - acc[k]) / diag
            else:
                i = sn_rows[r0 + r]
                for k in range(m):
                    y[i, k] -= acc[k]


@_jit
def _backward_blocks(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y):
    """y ← L⁻ᵀ y in place (y of shape (n, m)), supernodes from last to first: y[J] −= L_RJᵀ y[R],
    then the diagonal block's transposed triangular solve, along the blocks' rows."""
    m = y.shape[1]
    if m == 1:
        _backward_blocks_vector(sn_start, sn_xptr, sn_rowptr, sn_rows, x, y[:, 0])
        return
    for s in range(sn_start.size - 2, -1, -1):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        block = _block(x, s, sn_xptr, height, w)
        for r in range(w, height):
            i = sn_rows[r0 + r]
            for c in range(w):
                value = block[r, c]
                for k in range(m):
                    y[f + c, k] -= value * y[i, k]
        for r in range(w - 1, -1, -1):
            diag = block[r, r]
            for k in range(m):
                y[f + r, k] /= diag
            for c in range(r):
                value = block[r, c]
                for k in range(m):
                    y[f + c, k] -= value * y[f + r, k]


@_jit
def _takahashi(n, l_indptr, l_indices, lx, max_column):
    """Z = (L Lᵀ)⁻¹ on L's pattern, columns from last to first (recurrences in the docstring)."""
    z = np.empty(l_indptr[n])
    acc = np.empty(max_column)
    for j in range(n - 1, -1, -1):
        p0 = l_indptr[j]
        m = l_indptr[j + 1] - p0 - 1
        for a in range(m):
            acc[a] = 0.0
        # acc = Z[S, S] L[S, j], reading the lower triangle of Z[S, S] column by column.
        for b in range(m):
            k = l_indices[p0 + 1 + b]
            lkj = lx[p0 + 1 + b]
            acc[b] += z[l_indptr[k]] * lkj
            q = l_indptr[k] + 1
            for a in range(b + 1, m):
                row = l_indices[p0 + 1 + a]
                while l_indices[q] != row:
                    q += 1
                zik = z[q]
                acc[a] += zik * lkj
                acc[b] += zik * lx[p0 + 1 + a]
                q += 1
        diag = lx[p0]
        total = 0.0
        for a in range(m):
            value = -acc[a] / diag
            z[p0 + 1 + a] = value
            total += lx[p0 + 1 + a] * value
        z[p0] = (1.0 / diag - total) / diag
    return z


@_jit
def _selinv_supernodal(sn_start, sn_xptr, col_to_sn, sn_rowptr, sn_rows, x, gemm_min, lapack_min):
    """Z = (L Lᵀ)⁻¹ on the supernodal blocks of L (`x`, row-major (height, width) blocks), from
    the last supernode to the first.

    For supernode J (columns J, rows R below its diagonal block), block row J of Lᵀ Z = L⁻¹
    reads L_JJᵀ Z_J· + L_RJᵀ Z_R· = (L⁻¹)_J·. Its columns in R (where L⁻¹ is zero) and in J
    give, with Y = L_RJ L_JJ⁻¹,

        Z_RJ = −Z_RR Y,        Z_JJ = (L_JJ L_JJᵀ)⁻¹ − Yᵀ Z_RJ.

    R is a clique of the filled graph, so Z_RR lies on L's pattern, in the blocks of later
    supernodes (already computed): it is gathered into a dense |R| × |R| matrix, the row
    positions found by one merge through each later supernode's rows that R touches. Then the
    three products are matrix products (BLAS) when they reach `gemm_min` multiply-adds, loops
    below; a supernode at least `lapack_min` wide takes Y by BLAS trsm and (L_JJ L_JJᵀ)⁻¹ by
    LAPACK potri (its loops read T = L_JJ⁻¹ by columns). Cost: per supernode |R|²|J| +
    |R||J|² + |J|³/3 multiply-adds, the same order as the factorization's updates from it.
    """
    n_super = sn_start.size - 1
    z = np.zeros(x.size)
    max_height = 0
    for s in range(n_super):
        f = sn_start[s]
        height = sn_rowptr[s + 1] - sn_rowptr[s]
        if height > max_height:
            max_height = height
    gather_buffer = np.empty(max_height * max_height)
    y_buffer = np.empty(max_height * max_height)
    inner_buffer = np.empty(max_height * max_height)
    position = np.empty(max_height, dtype=np.int64)
    # Fortran arguments of potri/trsm: "L", "N", "U" (one byte each, in int32s), then the sizes
    # and info; alpha = 1
    ints = np.array([76, 78, 85, 0, 0, 0], dtype=np.int32)
    one = np.ones(1)
    for s in range(n_super - 1, -1, -1):
        f, w, r0, height = _supernode(s, sn_start, sn_rowptr)
        m = height - w
        block = _block(x, s, sn_xptr, height, w)
        out = _block(z, s, sn_xptr, height, w)
        inner = inner_buffer[: w * w].reshape(w, w)
        y = y_buffer[: m * w].reshape(m, w)
        if w >= lapack_min:
            # Column-major, the row-major blocks are their transposes: L_JJᵀ upper triangular
            # (leading dimension w). potri("U") on a copy gives (L_JJ L_JJᵀ)⁻¹ in the upper
            # triangle, `inner`'s lower one; Yᵀ = (L_JJᵀ)⁻¹ L_RJᵀ is trsm("L", "U", "N") on
            # L_RJᵀ, which `y` holds (row-major Y is column-major Yᵀ).
            for r in range(w):
                for c in range(r + 1):
                    inner[r, c] = block[r, c]
            ints[3] = w
            ints[4] = m
            _dpotri(ints[2:].ctypes.data, ints[3:].ctypes.data, inner_buffer.ctypes.data,
                    ints[3:].ctypes.data, ints[5:].ctypes.data)  # fmt: skip
            if m > 0:
                y[:, :] = block[w:, :]
                _dtrsm(ints[0:].ctypes.data, ints[2:].ctypes.data, ints[1:].ctypes.data,
                       ints[1:].ctypes.data, ints[3:].ctypes.data, ints[4:].ctypes.data,
                       one.ctypes.data, x[sn_xptr[s] :].ctypes.data, ints[3:].ctypes.data,
                       y_buffer.ctypes.data, ints[3:].ctypes.data)  # fmt: skip
        else:
            # T = L_JJ⁻¹ (lower triangular), in the top of `out` for now
            for c in range(w):
                out[c, c] = 1.0 / block[c, c]
                for r in range(c + 1, w):
                    total = 0.0
                    for k in range(c, r):
                        total += block[r, k] * out[k, c]
                    out[r, c] = -total / block[r, r]
            # Y = L_RJ T, along rows of T (contiguous): y_i = Σ_k L_ik T[k, :k+1]
            for i in range(m):
                for c in range(w):
                    y[i, c] = 0.0
                for k in range(w):
                    lik = block[w + i, k]
                    for c in range(k + 1):
                        y[i, c] += lik * out[k, c]
            # Tᵀ T, the lower triangle
            for c in range(w):
                for r in range(c, w):
                    total = 0.0
                    for k in range(r, w):
                        total += out[k, r] * out[k, c]
                    inner[r, c] = total
        if m > 0:
            # gather Z_RR: the rows of R, supernode by supernode of R's columns
            gather = gather_buffer[: m * m].reshape(m, m)
            ib = 0
            while ib < m:
                b = sn_rows[r0 + w + ib]
                t = col_to_sn[b]
                ft = sn_start[t]
                wt = sn_start[t + 1] - ft
                rt0 = sn_rowptr[t]
                ht = sn_rowptr[t + 1] - rt0
                q = wt
                for ia in range(ib, m):
                    a = sn_rows[r0 + w + ia]
                    if a < ft + wt:
                        position[ia] = a - ft
                    else:
                        while sn_rows[rt0 + q] != a:
                            q += 1
                        position[ia] = q
                ie = ib
                while ie < m and sn_rows[r0 + w + ie] < ft + wt:
                    ie += 1
                zt = z[sn_xptr[t] : sn_xptr[t] + ht * wt].reshape(ht, wt)
                for jb in range(ib, ie):
                    cb = sn_rows[r0 + w + jb] - ft
                    for ia in range(jb, m):
                        value = zt[position[ia], cb]
                        gather[ia, jb] = value
                        gather[jb, ia] = value
                ib = ie
            # Z_RJ = −Z_RR Y
            if m * m * w >= gemm_min:
                product = np.dot(gather, y)
                for i in range(m):
                    for c in range(w):
                        out[w + i, c] = -product[i, c]
            else:
                for i in range(m):
                    for c in range(w):
                        total = 0.0
                        for k in range(m):
                            total += gather[i, k] * y[k, c]
                        out[w + i, c] = -total
        # Z_JJ = (L_JJ L_JJᵀ)⁻¹ − Yᵀ Z_RJ (lower triangle, then mirrored)
        if m > 0:
            if m * w * w >= gemm_min:
                correction = np.dot(y.T, np.ascontiguousarray(out[w:, :]))
                for c in range(w):
                    for r in range(c, w):
                        inner[r, c] -= correction[r, c]
            else:
                for c in range(w):
                    for r in range(c, w):
                        total = 0.0
                        for i in range(m):
                            total += y[i, r] * out[w + i, c]
                        inner[r, c] -= total
        for c in range(w):
            for r in range(c, w):
                out[r, c] = inner[r, c]
                out[c, r] = inner[r, c]
    return z if ints[0] == 76 and one[0] == 1.0 else z[:0]  # (keeps both arrays alive)


def distance2_coloring(symbolic_rows: np.ndarray, symbolic_cols: np.ndarray, n: int) -> np.ndarray:
    """Greedy colouring of the symmetric pattern's columns, no two sharing a row in one colour.

    Columns of one colour are structurally orthogonal, so one product A s (s the colour's
    indicator) recovers every entry of those columns (Curtis, Powell & Reid 1974).
    """
    off = symbolic_rows != symbolic_cols
    r = np.concatenate([symbolic_rows[off], symbolic_cols[off]])
    c = np.concatenate([symbolic_cols[off], symbolic_rows[off]])
    order = np.argsort(r, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return _greedy_distance2(n, indptr, c[order].astype(np.int64))


@_jit
def _greedy_distance2(n, indptr, indices):
    color = np.full(n, -1, dtype=np.int64)
    forbidden = np.full(n + 1, -1, dtype=np.int64)
    for j in range(n):
        for p in range(indptr[j], indptr[j + 1]):
            k = indices[p]
            if color[k] >= 0:
                forbidden[color[k]] = j
            for q in range(indptr[k], indptr[k + 1]):
                m = indices[q]
                if m != j and color[m] >= 0:
                    forbidden[color[m]] = j
        g = 0
        while forbidden[g] == j:
            g += 1
        color[j] = g
    return color
