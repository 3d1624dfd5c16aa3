"""Sparse symmetric positive definite matrices in PyTensor graphs: log det, solve, and draws.

A :class:`SparsePattern` fixes which entries of an n × n symmetric positive definite matrix H
may be non-zero (its lower triangle, as ``rows``/``cols``); the values on that pattern are a
symbolic vector. The pattern is analysed once, when it is created (fill-reducing ordering,
elimination tree, the pattern of the Cholesky factor L); every evaluation of a graph then only
refactorizes numerically. The Ops:

- :meth:`SparsePattern.logdet` — log det H, its gradient the selected inverse (H⁻¹ on the
  pattern, Takahashi recurrences) — never a dense inverse;
- :meth:`SparsePattern.solve` — H⁻¹ b, differentiable in the values and in b;
- :meth:`SparsePattern.sample` — mean + Pᵀ L⁻ᵀ z, a draw from N(mean, H⁻¹) for z ~ N(0, I);
- :meth:`SparsePattern.selected_inverse` — the entries of H⁻¹ on the pattern (e.g. marginal
  variances diag H⁻¹ of a Gaussian with precision H).

The kernels need the optional extra ``sparse`` (``pip install 'pymc-optim[sparse]'``); creating
a pattern without it raises an ImportError naming the extra. See ``docs/sparse.md`` for the
choice of backend and the measured costs. Ops run on PyTensor's C (default) and NUMBA (object
mode) backends; the JAX backend refuses them when compiling.

Convention
----------
``values[e]`` is the entry H[rows[e], cols[e]] = H[cols[e], rows[e]] of the lower triangle;
duplicated (row, col) pairs are summed. The derivative of a function of H with respect to
``values[e]`` therefore counts both symmetric positions: d log det H / d values[e] =
(2 − δ_{rows[e], cols[e]}) (H⁻¹)_{rows[e], cols[e]}. If H is not positive definite (the
numeric factorization meets a non-positive pivot) every Op returns NaN, which PyMC's samplers
treat as a rejected point.

Examples
--------
>>> import numpy as np, pytensor, pytensor.tensor as pt
>>> from pymc_optim.linalg.sparse import SparsePattern
>>> pattern = SparsePattern(rows=[0, 1, 1, 2, 2], cols=[0, 0, 1, 1, 2], n=3)
>>> values = pt.vector("values")
>>> f = pytensor.function([values], pattern.logdet(values))
>>> H = np.array([[2.0, -1, 0], [-1, 2, -1], [0, -1, 2]])
>>> bool(np.isclose(f([2.0, -1, 2, -1, 2]), np.linalg.slogdet(H)[1]))
True
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.gradient
import pytensor.tensor as pt
from pytensor.gradient import grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.replace import _vectorize_node
from pytensor.tensor.blockwise import vectorize_node_fallback
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.structure import LinearStructure, _concat_flat, _finite

__all__ = [
    "SelectedInverseOp",
    "SparseFactorSolveOp",
    "SparseLogdetOp",
    "SparsePattern",
    "SparseSolveOp",
    "SparseStructure",
    "StackedSparseStructure",
]


class SparsePattern:
    """The sparsity pattern of a symmetric positive definite matrix, analysed once.

    Parameters
    ----------
    rows, cols : array_like of int
        The entries of the lower triangle that may be non-zero (``rows[e] >= cols[e]``), every
        diagonal entry included. Duplicated pairs are allowed (their values are summed).
    n : int, optional
        The matrix size; default ``max(rows) + 1``.

    Raises
    ------
    ValueError
        If an entry lies above the diagonal or outside the matrix, or a diagonal entry is
        missing (a positive definite matrix has a positive diagonal).
    ImportError
        If the optional extra ``sparse`` is not installed.

    Notes
    -----
    Equal patterns (same entries in the same order) compare and hash equal, so Ops built on
    equal patterns merge in a graph. Pickling keeps the entries only; the symbolic analysis is
    redone on first use after unpickling (once per process).
    """

    def __init__(self, rows, cols, n: int | None = None):
        _cholesky.require_backend()
        rows = _as_index_vector(rows, "rows")
        cols = _as_index_vector(cols, "cols")
        if rows.shape != cols.shape:
            raise ValueError(
                f"`rows` and `cols` must have the same length; got {rows.size} and {cols.size}."
            )
        if n is None:
            n = int(rows.max()) + 1 if rows.size else 0
        n = int(n)
        if n < 1:
            raise ValueError(f"`n` must be at least 1; got {n}.")
        if rows.size and (rows.min() < 0 or cols.min() < 0 or rows.max() >= n):
            raise ValueError(
                f"`rows` and `cols` must lie in [0, n) = [0, {n}); got rows in "
                f"[{rows.min()}, {rows.max()}] and cols in [{cols.min()}, {cols.max()}]."
            )
        above = np.flatnonzero(rows < cols)
        if above.size:
            e = above[0]
            raise ValueError(
                "`rows` and `cols` must give the lower triangle (rows >= cols); got "
                f"{above.size} entries above the diagonal, e.g. ({rows[e]}, {cols[e]}). Keep "
                "one triangle, e.g. `scipy.sparse.tril(matrix)`, or use "
                "`SparsePattern.from_scipy`."
            )
        has_diagonal = np.zeros(n, dtype=bool)
        has_diagonal[rows[rows == cols]] = True
        if not has_diagonal.all():
            missing = np.flatnonzero(~has_diagonal)
            raise ValueError(
                "`rows` and `cols` must include every diagonal entry (i, i): a positive definite "
                f"matrix has a positive diagonal; {missing.size} of {n} are missing, e.g. "
                f"({missing[0]}, {missing[0]})."
            )
        self.rows = rows
        self.cols = cols
        self.n = n
        self._key = hashlib.sha1(
            np.asarray([n], dtype=np.int64).tobytes() + rows.tobytes() + cols.tobytes()
        ).hexdigest()
        self._symbolic = _cholesky.analyse(rows, cols, n)
        self._cache = threading.local()

    @classmethod
    def from_scipy(cls, matrix) -> tuple[SparsePattern, np.ndarray]:
        """The pattern of a symmetric scipy sparse matrix's lower triangle, and its values.

        Returns
        -------
        pattern : SparsePattern
        values : numpy.ndarray
            The matrix's values on ``pattern``'s entries (a constant; build symbolic values on
            ``pattern.rows``/``pattern.cols`` to make them depend on parameters).

        Raises
        ------
        ValueError
            If the matrix is not square or not symmetric.
        """
        import scipy.sparse as sp

        if not sp.issparse(matrix):
            raise TypeError(
                f"`matrix` must be a scipy.sparse matrix or array; got {type(matrix).__name__}. "
                "Wrap a dense array with `scipy.sparse.csr_array(...)`."
            )
        if matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"`matrix` must be square; got shape {matrix.shape}.")
        matrix = sp.csr_array(matrix, dtype=np.float64)
        asymmetry = abs(matrix - matrix.T).max() if matrix.nnz else 0.0
        scale = abs(matrix).max() if matrix.nnz else 0.0
        # Exact symmetry up to the rounding of building it (a few ulps of the largest entry).
        if asymmetry > 8 * np.finfo(np.float64).eps * scale:
            raise ValueError(
                "`matrix` must be symmetric; max |M - Mᵀ| is "
                f"{asymmetry:.3g} (largest |M_ij| {scale:.3g}). Symmetrize it, e.g. "
                "`(M + M.T) / 2`, or pass the lower triangle's entries to `SparsePattern`."
            )
        lower = sp.tril(matrix, format="coo")
        lower.sum_duplicates()
        order = np.lexsort((lower.row, lower.col))
        rows, cols, values = lower.row[order], lower.col[order], lower.data[order]
        # Keep structurally present diagonal entries even where they are zero-valued.
        missing = np.setdiff1d(np.arange(matrix.shape[0]), rows[rows == cols])
        if missing.size:
            rows = np.concatenate([rows, missing])
            cols = np.concatenate([cols, missing])
            values = np.concatenate([values, np.zeros(missing.size)])
        return cls(rows, cols, matrix.shape[0]), np.asarray(values, dtype=np.float64)

    # --- the graph-building API ---------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of entries (the length of ``values``)."""
        return int(self.rows.size)

    @property
    def factor_nnz(self) -> int:
        """Number of non-zeros of the Cholesky factor L (fill included)."""
        return self._analysis().factor_nnz

    def logdet(self, values) -> TensorVariable:
        """log det H; NaN if H is not positive definite."""
        return SparseLogdetOp(self)(values)

    def solve(self, values, b) -> TensorVariable:
        """H⁻¹ b for b of shape (n,) or (n, k)."""
        return SparseSolveOp(self)(values, b)

    def selected_inverse(self, values) -> TensorVariable:
        """(H⁻¹)[rows[e], cols[e]] for every entry e (not differentiable)."""
        return SelectedInverseOp(self)(values)

    def sample(self, values, mean, z) -> TensorVariable:
        """mean + Pᵀ L⁻ᵀ z: a draw from N(mean, H⁻¹) when z ~ N(0, I) has shape (n,) or (n, k).

        Differentiable in ``mean`` and ``z`` (reparametrization), not in ``values``.
        """
        z = pt.as_tensor_variable(z)
        draw = SparseFactorSolveOp(self, transposed=True)(values, z)
        mean = pt.as_tensor_variable(mean)
        if z.ndim == 2 and mean.ndim == 1:
            mean = mean[:, None]
        return mean + draw

    def to_dense(self, values) -> TensorVariable:
        """The (n, n) matrix H as a dense tensor (for small n: tests and the dense oracle)."""
        values = pt.as_tensor_variable(values)
        lower = pt.zeros((self.n, self.n), dtype=values.dtype)[self.rows, self.cols].inc(values)
        strict = pt.as_tensor_variable(self.rows != self.cols)
        upper = pt.zeros((self.n, self.n), dtype=values.dtype)[self.cols, self.rows].inc(
            pt.switch(strict, values, 0)
        )
        return lower + upper

    # --- numeric ------------------------------------------------------------------------------
    def _analysis(self) -> _cholesky.Symbolic:
        if self._symbolic is None:
            self._symbolic = _cholesky.analyse(self.rows, self.cols, self.n)
        return self._symbolic

    def _factor(self, values: np.ndarray) -> tuple[np.ndarray | None, _cholesky.Symbolic]:
        """Numeric factor for these values, or None if not positive definite (cached once)."""
        symbolic = self._analysis()
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.nnz,):
            raise ValueError(
                f"`values` must have one entry per pattern entry, shape ({self.nnz},); got "
                f"shape {values.shape}."
            )
        lx, failed = self._last("one", values, lambda v: _cholesky.factorize(symbolic, v))
        return (None if failed >= 0 else lx), symbolic

    def _factors(self, values: np.ndarray) -> list[np.ndarray | None]:
        """Numeric factors of a batch of matrices on this pattern, `values` of shape (B, nnz):
        one symbolic analysis, B numeric factorizations (None where not positive definite);
        the last batch is cached like `_factor`'s last matrix."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != self.nnz:
            raise ValueError(
                f"`values` must have shape (B, {self.nnz}) for a batch on this pattern; got "
                f"shape {values.shape}."
            )
        symbolic = self._analysis()

        def factorize(batch):
            factors = []
            for row in batch:
                lx, failed = _cholesky.factorize(symbolic, row)
                factors.append(None if failed >= 0 else lx)
            return factors

        return self._last("batch", values, factorize)

    def _last(self, key: str, values: np.ndarray, compute):
        """``compute(values)``, or this thread's last result under `key` if it was computed
        for equal values: the log det and its gradient (or a solve and its pullback) at the same
        values factorize once; the comparison costs O(nnz), the factorization far more."""
        cache = self._thread_cache()
        last = cache.get(key)
        if last is not None and np.array_equal(last[0], values):
            return last[1]
        result = compute(values)
        cache[key] = (values.copy(), result)
        return result

    def _thread_cache(self) -> dict:
        """This thread's last factor ("one") and last batch of factors ("batch"), by `_last`:
        per thread, so that threads solving on one pattern (e.g. `recover_latent`'s) do not
        evict each other's factors; a thread's entries go with it."""
        cache = getattr(self._cache, "factors", None)
        if cache is None:
            cache = self._cache.factors = {}
        return cache

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SparsePattern) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __getstate__(self) -> dict[str, Any]:
        return {"rows": self.rows, "cols": self.cols, "n": self.n, "_key": self._key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._symbolic = None
        self._cache = threading.local()

    def __repr__(self) -> str:
        return f"SparsePattern(n={self.n}, nnz={self.nnz})"


@dataclass(frozen=True)
class SparseStructure(LinearStructure):
    """A sparse symmetric positive definite A = ∂F/∂x (a Hessian) on a fixed :class:`SparsePattern`.

    Pass it as ``structure=`` of ``minimize(..., method="newton")`` or as ``hessian_structure=``
    of ``marginalize_laplace``. A in compact form is the vector of its values on the pattern,
    built from G Hessian-vector products (G = the number of colours of a distance-2 colouring of
    the pattern: 5 for a 4-neighbour grid, whatever n), never an (n, n) matrix; solves, the
    log-determinant (gradient through the selected inverse) and draws go through the sparse
    Cholesky factor. An entry of A outside the pattern is silently dropped: give the pattern of
    the whole Hessian (prior precision plus likelihood curvature).

    Parameters
    ----------
    pattern : SparsePattern
    """

    kind: str = "sparse"
    block_size: int | None = None
    pattern: SparsePattern | None = None

    def __post_init__(self):
        if not isinstance(self.pattern, SparsePattern):
            raise TypeError(
                "`pattern` must be a SparsePattern, e.g. `SparseStructure.from_edges(edges, n)`; "
                f"got {type(self.pattern).__name__}."
            )
        colors = _cholesky.distance2_coloring(self.pattern.rows, self.pattern.cols, self.pattern.n)
        object.__setattr__(self, "_colors", colors)

    @classmethod
    def from_edges(cls, edges, n: int | None = None) -> SparseStructure:
        """The pattern of a graph's Laplacian plus a diagonal: an ICAR/CAR prior's precision plus
        an element-wise likelihood's curvature. ``edges`` has shape (E, 2)."""
        edges = np.asarray(edges)
        if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
            raise ValueError(
                f"`edges` must be an integer array of shape (E, 2); got dtype {edges.dtype} with "
                f"shape {edges.shape}."
            )
        n = int(edges.max()) + 1 if n is None else int(n)
        off = edges[:, 0] != edges[:, 1]
        high = np.maximum(edges[off, 0], edges[off, 1])
        low = np.minimum(edges[off, 0], edges[off, 1])
        key = np.unique(high.astype(np.int64) * n + low)
        rows = np.concatenate([np.arange(n), key // n])
        cols = np.concatenate([np.arange(n), key % n])
        return cls(pattern=SparsePattern(rows, cols, n))

    def stacked(self) -> StackedSparseStructure:
        """The structure of B such problems stacked (:mod:`pymc_optim.backends.vectorize`)."""
        return StackedSparseStructure(pattern=self.pattern)

    @property
    def n_colors(self) -> int:
        """Hessian-vector products per evaluation of A."""
        return int(self._colors.max()) + 1

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """A's values on the pattern: (Aᵀ s_g)_c = A_rc for r of colour g (one pass per colour)."""
        xs = list(xs)
        F = F.ravel()
        colors = self._colors
        products = [
            _concat_flat(
                pytensor.gradient.grad((F * (colors == g)).sum(), xs, disconnected_inputs="ignore")
            )
            for g in range(self.n_colors)
        ]
        # one flat index into the (colours, n) products (entry (g, c) at g n + c): a 1-d gather,
        # whose reverse (the mean correction's pass through A(x)) is a compiled increment; a 2-d
        # gather's reverse is numpy's `add.at`
        flat = colors[self.pattern.rows] * self.pattern.n + self.pattern.cols
        return pt.stack(products).ravel()[flat]

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool) -> TensorVariable:
        if not symmetric:
            raise NotImplementedError(
                "The sparse structure holds symmetric positive definite A (minimization, the "
                "Laplace Hessian); for a non-symmetric Jacobian use `structure='dense'`."
            )
        return self.pattern.solve(A, rhs)

    def logdet_positive_definite(self, A) -> TensorVariable:
        return self.pattern.logdet(A)

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        return self.pattern.sample(precision, mean, noise)

    # --- numerical -----------------------------------------------------------------------------
    def positive_definite(self, A) -> TensorVariable:
        """One boolean: A is positive definite (its sparse log-determinant is finite)."""
        return _finite(self.pattern.logdet(A))[None]

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """One boolean: the numeric Cholesky factorization of A − margin·I succeeds."""
        if margin:
            A = np.array(A, dtype=np.float64)
            A[self._diagonal_entries()] -= margin
        return np.array([self.pattern._factor(A)[0] is not None])

    def _diagonal_entries(self) -> np.ndarray:
        """The positions of the diagonal among the values, one per row: a duplicated diagonal
        entry is summed, so a shift of the diagonal goes to its first copy only."""
        diagonal = np.flatnonzero(self.pattern.rows == self.pattern.cols)
        _, first = np.unique(self.pattern.rows[diagonal], return_index=True)
        return diagonal[first]

    def solve_or_nan(self, A, F) -> TensorVariable:
        # (A is positive definite by construction here: Cholesky, as `solve_numpy` does)
        return self.solve(A, F, transposed=False, symmetric=True)

    @property
    def compact_ndim(self) -> int:
        return 1  # the values on the pattern

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        lx, symbolic = self.pattern._factor(A)
        if lx is None:
            raise np.linalg.LinAlgError("sparse matrix is not positive definite")
        return _cholesky.solve(symbolic, lx, np.asarray(rhs, dtype=np.float64))

    def matvec_numpy(self, A: np.ndarray, v: np.ndarray) -> np.ndarray:
        rows, cols, n = self.pattern.rows, self.pattern.cols, self.pattern.n
        off = rows != cols
        out = np.bincount(rows, weights=A * v[cols], minlength=n)
        return out + np.bincount(cols[off], weights=A[off] * v[rows[off]], minlength=n)


@dataclass(frozen=True)
class StackedSparseStructure(SparseStructure):
    """B independent sparse problems on one :class:`SparsePattern`, stacked (a native batch).

    :mod:`pymc_optim.backends.vectorize` solves a batch of sparse Newton problems as one
    problem on the stacked unknowns (B contiguous runs of n = ``pattern.n``); the stacked A is
    block-diagonal with one block per problem, each on ``pattern``. A in compact form is a
    (B, nnz) array of the blocks' values: the colouring of one block serves every block (the
    blocks share no unknowns), so the same G Hessian-vector products build all B blocks; each
    block is factorized on the one symbolic analysis of ``pattern``. Positive definiteness is
    reported per problem, and a problem that is not positive definite gets NaN in its own rows
    of a solve only.

    Parameters
    ----------
    pattern : SparsePattern
        The pattern of one problem's A.
    """

    def stacked(self) -> StackedSparseStructure:
        return self

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """The (B, nnz) values of the B blocks: one reverse pass per colour of one block."""
        xs = list(xs)
        F = F.ravel()
        n = self.pattern.n
        colors = pt.as_tensor_variable(self._colors)[pt.arange(F.shape[0]) % n]
        products = [
            _concat_flat(
                pytensor.gradient.grad(
                    (F * pt.eq(colors, g)).sum(), xs, disconnected_inputs="ignore"
                )
            )
            for g in range(self.n_colors)
        ]
        stacked = pt.stack(products).reshape((self.n_colors, -1, n)).transpose(1, 0, 2)
        return stacked[:, self._colors[self.pattern.rows], self.pattern.cols]

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool) -> TensorVariable:
        if not symmetric:
            return super().solve(A, rhs, transposed=transposed, symmetric=symmetric)
        return self.pattern.solve(A, rhs.reshape((A.shape[0], self.pattern.n))).reshape((-1,))

    def logdet_positive_definite(self, A) -> TensorVariable:
        """log det of the stacked (block-diagonal) A: the sum over its blocks."""
        return self.pattern.logdet(A).sum()

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        n = self.pattern.n
        noise = pt.as_tensor_variable(noise).reshape((precision.shape[0], n))
        draw = SparseFactorSolveOp(self.pattern, transposed=True)(precision, noise)
        return pt.as_tensor_variable(mean) + draw.reshape((-1,))

    # --- numerical -----------------------------------------------------------------------------
    def positive_definite(self, A) -> TensorVariable:
        """One boolean per problem: its block's sparse log-determinant is finite."""
        return _finite(self.pattern.logdet(A))

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        if margin:
            A = np.array(A, dtype=np.float64)
            A[:, self._diagonal_entries()] -= margin
        return np.array([lx is not None for lx in self.pattern._factors(A)], dtype=bool)

    def finite(self, A) -> TensorVariable:
        return pt.all(_finite(A), axis=1)

    def finite_numpy(self, A: np.ndarray) -> np.ndarray:
        return np.isfinite(A).all(axis=1)

    @property
    def compact_ndim(self) -> int:
        return 2  # the values on the pattern, one row per problem

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """Per problem H_b⁻¹ rhs_b; NaN in the rows of a problem whose block is not positive
        definite (the others are solved)."""
        symbolic = self.pattern._analysis()
        rhs = np.asarray(rhs, dtype=np.float64).reshape(A.shape[0], self.pattern.n)
        out = np.full(rhs.shape, np.nan)
        for b, lx in enumerate(self.pattern._factors(A)):
            if lx is not None:
                out[b] = _cholesky.solve(symbolic, lx, rhs[b])
        return out.reshape(-1)

    def matvec_numpy(self, A: np.ndarray, v: np.ndarray) -> np.ndarray:
        n = self.pattern.n
        v = np.asarray(v).reshape(A.shape[0], n)
        one = super().matvec_numpy
        return np.concatenate([one(a, vb) for a, vb in zip(A, v, strict=True)])


# --- Ops --------------------------------------------------------------------------------------


class _PatternOp(Op):
    """An Op on the values of a matrix on `pattern`: a vector (nnz,), or a batch (B, nnz) of B
    independent matrices on the same pattern (a native batch of sparse problems,
    :class:`StackedSparseStructure`): one symbolic analysis, one numeric factorization each."""

    __props__ = ("pattern",)

    def __init__(self, pattern: SparsePattern):
        if not isinstance(pattern, SparsePattern):
            raise TypeError(f"`pattern` must be a SparsePattern; got {type(pattern).__name__}.")
        self.pattern = pattern

    def _values(self, values) -> TensorVariable:
        values = pt.as_tensor_variable(values)
        if values.ndim not in (1, 2):
            raise ValueError(
                f"`values` must be a vector with one entry per pattern entry ({self.pattern.nnz}"
                f"), or a (B, {self.pattern.nnz}) batch of them; got a {values.ndim}-d tensor."
            )
        if values.type.shape[-1] not in (None, self.pattern.nnz):
            raise ValueError(
                f"`values` must have length {self.pattern.nnz} (the pattern's entries); got "
                f"static length {values.type.shape[-1]}."
            )
        return pt.cast(values, "float64")

    def _rhs(self, b, values) -> TensorVariable:
        b = pt.cast(pt.as_tensor_variable(b), "float64")
        if values.ndim == 2:
            if b.ndim != 2:
                raise ValueError(
                    f"`b` must have shape (B, n) for a batch of matrices; got a {b.ndim}-d tensor."
                )
            rows = b.type.shape[1]
        else:
            if b.ndim not in (1, 2):
                raise ValueError(f"`b` must have shape (n,) or (n, k); got a {b.ndim}-d tensor.")
            rows = b.type.shape[0]
        if rows not in (None, self.pattern.n):
            raise ValueError(
                f"`b` must have {self.pattern.n} rows (the matrix size); got static shape "
                f"{b.type.shape}."
            )
        return b

    def _weights(self) -> np.ndarray:
        """2 for strictly-lower entries (they stand for two symmetric positions), 1 diagonal."""
        return np.where(self.pattern.rows == self.pattern.cols, 1.0, 2.0)

    def _each(self, values, function, *others, fill_shape):
        """`function(lx, symbolic, *others_b)` per matrix (values 1-d: one matrix, 2-d: a batch,
        the others sliced along their first axis); NaN of `fill_shape` where one is not
        positive definite."""
        symbolic = self.pattern._analysis()
        if values.ndim == 1:
            lx, _ = self.pattern._factor(values)
            return np.full(fill_shape, np.nan) if lx is None else function(lx, symbolic, *others)
        factors = self.pattern._factors(values)
        results = [
            np.full(fill_shape, np.nan)
            if lx is None
            else function(lx, symbolic, *(o[b] for o in others))
            for b, lx in enumerate(factors)
        ]
        return np.stack(results) if results else np.zeros((0, *fill_shape))


class SparseLogdetOp(_PatternOp):
    """log det H for H given by its values on a :class:`SparsePattern` (one per matrix of a
    (B, nnz) batch).

    Notes
    -----
    d log det H = tr(H⁻¹ dH); with values[e] on both symmetric positions of an off-diagonal
    entry, ∂/∂values[e] = (2 − δ) (H⁻¹)_{rows[e], cols[e]}: the selected inverse, computed by
    :class:`SelectedInverseOp` from the same factor (cached), never a dense inverse.
    """

    def make_node(self, values):
        values = self._values(values)
        return Apply(self, [values], [pt.dvector() if values.ndim == 2 else pt.dscalar()])

    def perform(self, node, inputs, outputs):
        value = self._each(inputs[0], lambda lx, s: _cholesky.logdet(s, lx), fill_shape=())
        outputs[0][0] = np.asarray(value, dtype=np.float64)

    def infer_shape(self, node, shapes):
        return [shapes[0][:-1]]

    def pullback(self, inputs, outputs, output_grads):
        (values,) = inputs
        selected = SelectedInverseOp(self.pattern)(values)
        g = output_grads[0][:, None] if values.ndim == 2 else output_grads[0]
        return [g * self._weights() * selected]


class SelectedInverseOp(_PatternOp):
    """(H⁻¹)_{rows[e], cols[e]} for each pattern entry e (Takahashi recurrences on L)."""

    def make_node(self, values):
        values = self._values(values)
        return Apply(self, [values], [values.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = self._each(
            inputs[0],
            lambda lx, s: _cholesky.selected_inverse(s, lx),
            fill_shape=(self.pattern.nnz,),
        )

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        # d(H⁻¹) = −H⁻¹ dH H⁻¹ needs H⁻¹ off the pattern: second derivatives of log det H are
        # not available through the selected inverse.
        return [grad_not_implemented(self, 0, inputs[0], "second derivatives of log det H")]


class _RightHandSideOp(_PatternOp):
    """An Op of (values, b) -> an array shaped like b, one `_kernel(symbolic, lx, b)` per matrix
    from its factor lx (b of shape (n,) or (n, k); (B, n) for a (B, nnz) batch)."""

    def _kernel(self, symbolic, lx, b):
        raise NotImplementedError

    def make_node(self, values, b):
        values = self._values(values)
        b = self._rhs(b, values)
        return Apply(self, [values, b], [b.type()])

    def perform(self, node, inputs, outputs):
        values, b = inputs
        b = np.asarray(b)
        outputs[0][0] = self._each(
            values,
            lambda lx, s, rhs: self._kernel(s, lx, rhs),
            b,
            fill_shape=b.shape[values.ndim - 1 :],
        )

    def infer_shape(self, node, shapes):
        return [shapes[1]]


class SparseSolveOp(_RightHandSideOp):
    """x = H⁻¹ b, b of shape (n,) or (n, k); for a (B, nnz) batch of matrices b is (B, n).

    Notes
    -----
    Pullback of x̄: b̄ = H⁻¹ x̄ (H symmetric), H̄ = −b̄ xᵀ, so ∂/∂values[e] for entry (i, j) is
    −(b̄_i x_j + b̄_j x_i) off the diagonal and −b̄_i x_i on it (summed over columns of b). Both
    are graph expressions, so the solve is differentiable to any order in b and the values.
    """

    def _kernel(self, symbolic, lx, b):
        return _cholesky.solve(symbolic, lx, b)

    def pullback(self, inputs, outputs, output_grads):
        values, b = inputs
        (x,) = outputs
        b_bar = self(values, output_grads[0])
        rows, cols = self.pattern.rows, self.pattern.cols
        half = np.where(rows == cols, 0.5, 1.0)
        if values.ndim == 2:  # (B, n) right-hand sides, one per matrix
            product = b_bar[:, rows] * x[:, cols] + b_bar[:, cols] * x[:, rows]
        else:
            product = b_bar[rows] * x[cols] + b_bar[cols] * x[rows]
            if b.ndim == 2:
                product = product.sum(axis=1)
        return [-half * product, b_bar]


class SparseFactorSolveOp(_RightHandSideOp):
    """Pᵀ L⁻ᵀ z (``transposed=True``: a draw from N(0, H⁻¹) for z ~ N(0, I)) or L⁻¹ P z.

    H = Pᵀ L Lᵀ P with P the fill-reducing permutation, so Cov(Pᵀ L⁻ᵀ z) = H⁻¹. The two
    directions are each other's pullback in z; the derivative in the values (of the Cholesky
    factor itself) is not implemented. For a (B, nnz) batch of matrices z is (B, n).
    """

    __props__ = ("pattern", "transposed")

    def __init__(self, pattern: SparsePattern, transposed: bool = True):
        super().__init__(pattern)
        self.transposed = bool(transposed)

    def _kernel(self, symbolic, lx, z):
        kernel = _cholesky.sample if self.transposed else _cholesky.forward_permuted
        return kernel(symbolic, lx, z)

    def pullback(self, inputs, outputs, output_grads):
        values, z = inputs
        adjoint = SparseFactorSolveOp(self.pattern, transposed=not self.transposed)
        return [
            grad_not_implemented(self, 0, values, "the derivative of the Cholesky factor"),
            adjoint(values, output_grads[0]),
        ]


def _as_index_vector(index, name: str) -> np.ndarray:
    array = np.asarray(index)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(
            f"`{name}` must be a 1-d array of integer indices; got dtype {array.dtype} with "
            f"shape {array.shape}."
        )
    return np.ascontiguousarray(array, dtype=np.int64)


@_vectorize_node.register(_PatternOp)
def _vectorize_pattern_op(op: _PatternOp, node, *batched_inputs):
    """`vectorize_graph` over one batch dimension of the values (and of b or z alike): the
    same Op on (B, nnz) values, one factorization per matrix, instead of a Blockwise loop
    over copies of the Op. Other batchings (b batched alone, several batch dimensions, b of
    shape (n, k)) fall back to the Blockwise loop."""
    core = node.inputs
    batch = [new.type.ndim - old.type.ndim for new, old in zip(batched_inputs, core, strict=True)]
    if not any(batch):
        return op.make_node(*batched_inputs)
    if batch != [1] * len(core) or any(old.type.ndim != 1 for old in core):
        return vectorize_node_fallback(op, node, *batched_inputs)
    return op.make_node(*batched_inputs)
