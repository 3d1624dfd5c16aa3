"""Sparse non-symmetric Jacobians: A = ∂F/∂x of a root or fixed-point Newton solve on a fixed
pattern, its values from row-coloured vector–Jacobian products, solved by a sparse LU.

:class:`~pymc_optim.linalg.sparse.SparseStructure` holds a symmetric positive definite A (a
Hessian) and factorizes it by sparse Cholesky. A root's Jacobian has no symmetry, so
:class:`SparseJacobianStructure` keeps A's whole pattern (read off the graph by
:func:`pymc_optim.linalg._hessian_sparsity.jacobian_pattern`, memory O(nnz)) and factorizes it by
SuperLU (``scipy.sparse.linalg.splu``: partial pivoting by rows, a fill-reducing column order).
The column order is computed once, at the first factorization (COLAMD), and every later
evaluation factorizes A with that order numerically; the factor of the last A is kept (per
thread), so that the Newton step, the implicit gradient's transposed solve and its pullback at
the same A factorize once.

Values. Rows of A that share no column get one colour (a greedy colouring of the rows' conflict
graph); one vector–Jacobian product per colour, sᵀA with s the indicator of the colour's rows,
holds every entry of those rows: A_rc = (sᵀA)_c for r of that colour. For a banded or
graph-structured F the number of colours is the largest number of rows meeting in a column
(three for a tridiagonal A), whatever n.

Gradient of x = A⁻¹b: b̄ = A⁻ᵀx̄ and Ā_rc = −b̄_r x_c on the pattern; of x = A⁻ᵀb: b̄ = A⁻¹x̄ and
Ā_rc = −x_r b̄_c. Never a dense inverse.

Backends: the C backend, and numba in object mode (the Ops' Python implementation inside the
natively compiled Newton loop); JAX refuses at compile time, naming the backends that work.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
import scipy.sparse as sp
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.structure import LinearStructure, _concat_flat

__all__ = ["JacobianPattern", "SparseJacobianStructure", "SparseLUSolveOp"]


class JacobianPattern:
    """The sparsity pattern of a square non-symmetric matrix, analysed once.

    Parameters
    ----------
    rows, cols : array_like of int
        The entries that may be non-zero, every diagonal entry included, without repeats.
    n : int
        The matrix size.

    Raises
    ------
    ValueError
        If an entry lies outside the matrix, repeats, or a diagonal entry is missing (an LU with
        partial pivoting needs a possible pivot in every column; a fixed point's A − I has them).

    Notes
    -----
    The entries are kept sorted by row, then column; equal patterns compare and hash equal, so
    Ops built on equal patterns merge in a graph. Pickling keeps the entries only.
    """

    def __init__(self, rows, cols, n: int):
        rows = np.asarray(rows, dtype=np.int64).ravel()
        cols = np.asarray(cols, dtype=np.int64).ravel()
        n = int(n)
        if rows.shape != cols.shape:
            raise ValueError(
                f"`rows` and `cols` must have the same length; got {rows.size} and {cols.size}."
            )
        if n < 1 or (
            rows.size and (min(rows.min(), cols.min()) < 0 or max(rows.max(), cols.max()) >= n)
        ):
            raise ValueError(f"`rows` and `cols` must lie in [0, n) with n ≥ 1; got n = {n}.")
        order = np.lexsort((cols, rows))
        rows, cols = rows[order], cols[order]
        key = rows * n + cols
        if np.any(key[1:] == key[:-1]):
            raise ValueError("`rows` and `cols` must not repeat an entry.")
        diagonal = np.zeros(n, dtype=bool)
        diagonal[rows[rows == cols]] = True
        if not diagonal.all():
            missing = int(np.flatnonzero(~diagonal)[0])
            raise ValueError(
                f"`rows` and `cols` must include every diagonal entry; ({missing}, {missing}) "
                "is missing."
            )
        self.rows, self.cols, self.n = rows, cols, n
        self._key = hashlib.sha1(np.asarray([n]).tobytes() + key.tobytes()).hexdigest()
        self.row_colors = _row_coloring(rows, cols, n)
        self._cache = threading.local()
        self._column_order = None  # COLAMD's, from the first factorization

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @property
    def n_colors(self) -> int:
        """Vector–Jacobian products per evaluation of A."""
        return int(self.row_colors.max()) + 1

    def matrix(self, values: np.ndarray) -> sp.csc_array:
        """A as a scipy CSC matrix."""
        return sp.csc_array(
            (np.asarray(values, dtype=np.float64), (self.rows, self.cols)), shape=(self.n, self.n)
        )

    def lu(self, values: np.ndarray):
        """A's sparse LU (``scipy.sparse.linalg.SuperLU`` of A P, P the column order found at
        the first factorization) with P, or None where A is singular; the last one is kept
        (per thread) for equal values."""
        values = np.asarray(values, dtype=np.float64)
        cache = getattr(self._cache, "last", None)
        if cache is not None and np.array_equal(cache[0], values):
            return cache[1]
        result = self._factorize(values)
        self._cache.last = (values.copy(), result)
        return result

    def _factorize(self, values):
        from scipy.sparse.linalg import splu

        if not np.isfinite(values).all():
            return None
        matrix = self.matrix(values)
        try:
            if self._column_order is None:
                factor = splu(matrix, permc_spec="COLAMD")
                self._column_order = np.argsort(factor.perm_c)  # A P = A[:, order]
            order = self._column_order
            factor = splu(sp.csc_array(matrix[:, order]), permc_spec="NATURAL")
        except RuntimeError:  # "Factor is exactly singular"
            return None
        return factor, order

    def solve_numpy(self, values: np.ndarray, b: np.ndarray, transposed: bool = False):
        """A⁻¹b (or A⁻ᵀb); NaN where A is singular or the result is not finite."""
        found = self.lu(values)
        b = np.asarray(b, dtype=np.float64)
        if found is None:
            return np.full(b.shape, np.nan)
        factor, order = found
        if transposed:  # Aᵀx = b ⇔ (A P)ᵀ x = Pᵀ b, and (Pᵀ b) = b[order]
            out = factor.solve(b[order], trans="T")
        else:  # A x = b ⇔ (A P) y = b with x = P y, i.e. x[order] = y
            out = np.empty_like(b)
            out[order] = factor.solve(b)
        return out if np.isfinite(out).all() else np.full(b.shape, np.nan)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JacobianPattern) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __getstate__(self) -> dict[str, Any]:
        return {"rows": self.rows, "cols": self.cols, "n": self.n}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rows"], state["cols"], state["n"])

    def __repr__(self) -> str:
        return f"JacobianPattern(n={self.n}, nnz={self.nnz}, colors={self.n_colors})"


def _row_coloring(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """Colours of the rows such that two rows with an entry in a common column differ (a greedy
    colouring of the conflict graph, rows in order): one vector–Jacobian product per colour then
    holds every entry of its rows."""
    pattern = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))
    conflicts = sp.csr_array(pattern @ pattern.T)  # rows meeting in some column
    colors = np.full(n, -1, dtype=np.int64)
    indptr, indices = conflicts.indptr, conflicts.indices
    for r in range(n):
        taken = colors[indices[indptr[r] : indptr[r + 1]]]
        taken = taken[taken >= 0]
        free = np.ones(taken.size + 1, dtype=bool)
        free[taken[taken <= taken.size]] = False
        colors[r] = int(np.argmax(free))
    return colors


class SparseLUSolveOp(Op):
    """x = A⁻¹b (or A⁻ᵀb with ``transposed``) for A given by its values on a
    :class:`JacobianPattern`; NaN where A is singular. Differentiable (module Notes)."""

    __props__ = ("pattern", "transposed")

    def __init__(self, pattern: JacobianPattern, transposed: bool = False):
        if not isinstance(pattern, JacobianPattern):
            raise TypeError(f"`pattern` must be a JacobianPattern; got {type(pattern).__name__}.")
        self.pattern = pattern
        self.transposed = bool(transposed)

    def make_node(self, values, b):
        values = pt.cast(pt.as_tensor_variable(values), "float64")
        b = pt.cast(pt.as_tensor_variable(b), "float64")
        if values.ndim != 1 or b.ndim != 1:
            raise ValueError(
                "`values` and `b` must be vectors (one matrix, one right-hand side; a batch of "
                f"sparse non-symmetric solves is not implemented); got {values.ndim}-d and "
                f"{b.ndim}-d."
            )
        return Apply(self, [values, b], [b.type()])

    def perform(self, node, inputs, outputs):
        values, b = inputs
        outputs[0][0] = self.pattern.solve_numpy(values, b, transposed=self.transposed)

    def infer_shape(self, node, shapes):
        return [shapes[1]]

    def pullback(self, inputs, outputs, output_grads):
        values, _ = inputs
        (x,) = outputs
        (x_bar,) = output_grads
        b_bar = type(self)(self.pattern, not self.transposed)(values, x_bar)
        rows, cols = self.pattern.rows, self.pattern.cols
        if self.transposed:  # Aᵀx = b: Ā_rc = −x_r b̄_c
            values_bar = -x[rows] * b_bar[cols]
        else:  # A x = b: Ā_rc = −b̄_r x_c
            values_bar = -b_bar[rows] * x[cols]
        return [values_bar, b_bar]


@dataclass(frozen=True)
class SparseJacobianStructure(LinearStructure):
    """A sparse non-symmetric A = ∂F/∂x (a root's or a fixed point's Jacobian) on a fixed
    :class:`JacobianPattern`: A in compact form is the vector of its values on the pattern, built
    from one vector–Jacobian product per row colour, and solved by a sparse LU (module Notes).

    ``structure="sparse"`` of ``root`` and ``fixed_point`` (``method="newton"``) reads the
    pattern off the graph; an entry of A outside the pattern would be silently dropped, which is
    why the pattern is read (a superset of A's), never guessed.

    Parameters
    ----------
    pattern : JacobianPattern
    """

    kind: str = "sparse"
    block_size: int | None = None
    pattern: JacobianPattern | None = None

    def __post_init__(self):
        if not isinstance(self.pattern, JacobianPattern):
            raise TypeError(
                "`pattern` must be a JacobianPattern (rows, cols of A's entries, the diagonal "
                f"included); got {type(self.pattern).__name__}."
            )

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """A's values on the pattern: (sᵀA)_c = A_rc for r of the colour of s."""
        xs = list(xs)
        F = F.ravel()
        colors = self.pattern.row_colors
        products = [
            _concat_flat(
                pytensor.gradient.grad((F * (colors == g)).sum(), xs, disconnected_inputs="ignore")
            )
            for g in range(self.pattern.n_colors)
        ]
        flat = colors[self.pattern.rows] * self.pattern.n + self.pattern.cols
        return pt.stack(products).ravel()[flat]

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool = False) -> TensorVariable:
        return SparseLUSolveOp(self.pattern, transposed)(A, rhs)

    def logdet_positive_definite(self, A) -> TensorVariable:
        raise TypeError("A sparse non-symmetric Jacobian has no Cholesky log-determinant.")

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        raise TypeError("A sparse non-symmetric Jacobian is not a Gaussian precision.")

    def stacked(self):
        raise NotImplementedError(
            "A batch of sparse non-symmetric solves is not implemented; vectorize with "
            "`structure='dense'` or solve the problems one by one."
        )

    # --- numerical (the Newton loops; root finding has no curvature test) ----------------------
    def positive_definite(self, A) -> TensorVariable:
        return pt.ones((1,), dtype="bool")

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        return np.array([True])

    @property
    def compact_ndim(self) -> int:
        return 1  # the values on the pattern

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        out = self.pattern.solve_numpy(A, rhs)
        if not np.isfinite(out).all():
            raise np.linalg.LinAlgError("sparse Jacobian is singular")
        return out
