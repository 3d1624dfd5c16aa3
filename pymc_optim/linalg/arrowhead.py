"""H = [[A, B], [Bᵀ, D]]: a diagonal or block-diagonal A bordered by p dense rows and columns.

The Hessian of a latent field that stacks p fixed effects β with G random effects u (R-INLA's
formulation of every model: η = Xβ + Zu, the fixed effects part of the latent) couples every
random effect to every fixed effect, and the random effects to each other not at all (or within
a group of b): in the order (u, β),

    H = [[A, B], [Bᵀ, D]],   A (m × m) diagonal or block-diagonal, B (m × p), D (p × p),

an "arrowhead". It is dense as a whole and, after a fill-reducing order that puts the border
last, a sparse Cholesky factor has no fill-in; but a distance-2 colouring of its pattern needs
n colours (every pair of random effects shares a fixed-effect neighbour), so a sparse layout
would still build H from n Hessian-vector products. This structure builds it from b + p: one
per position within A's blocks (the sum of those columns of H, whose rows in A's blocks are
A's entries) and one per border column. Everything else goes through the Schur complement
S = D − Bᵀ A⁻¹ B (p × p):

- solve: y_D = S⁻¹ (r_D − Bᵀ A⁻¹ r_A), y_A = A⁻¹ (r_A − B y_D);
- log det H = log det A + log det S;
- draws: with A = L_A L_Aᵀ and S = L_S L_Sᵀ, H = L Lᵀ for L = [[L_A, 0], [Bᵀ L_A⁻ᵀ, L_S]], and
  Lᵀ v = ε gives v_D = L_S⁻ᵀ ε_D, v_A = L_A⁻ᵀ ε_A − A⁻¹ B v_D, a draw of N(0, H⁻¹).

Each costs O(m b² + m p² + p³) and builds nothing of size n × n. The pieces are PyTensor Ops
(element-wise arithmetic, gathers, small Cholesky factors and triangular solves), so the
gradients are PyTensor's and every backend compiles them; the numba Newton loop compiles the
structure's own graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.basic import Variable
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.structure import LinearStructure, _concat_flat, _finite

__all__ = [
    "AUTO_MIN_SIZE",
    "MAX_BORDER",
    "ArrowheadStructure",
    "arrowhead_hessian_structure",
    "arrowhead_of_pattern",
]

#: Most border rows: each costs a Hessian-vector product per evaluation of H and a column of
#: A⁻¹B per solve, and the Schur complement is a dense p × p matrix. Regression models carry a
#: few to a few dozen fixed effects.
MAX_BORDER = 32
#: The layout is taken when it builds H from at most this fraction of the n reverse passes of a
#: dense H (b + p ≤ n / 2); below it the dense layout is as cheap and simpler.
_MAX_PASS_FRACTION = 0.5
#: Fewest latent values for which "auto" looks for the layout: below it a dense H costs under a
#: millisecond per evaluation even on a busy machine and compiles faster (Seeds, n = 25: a
#: latent draw 0.47 ms dense, 0.35–0.45 ms arrowhead, compilation 20–22 s against 24–25 s), while
#: at n = 65 (Epil) a dense draw costs 0.8 ms on a quiet machine and 17–28 ms on a busy one,
#: the arrowhead's 0.1–0.3 ms on either (benchmarks/README.md).
AUTO_MIN_SIZE = 40


@dataclass(frozen=True, eq=False)
class ArrowheadStructure(LinearStructure):
    """A symmetric positive definite H whose rows and columns `border` are dense and whose other
    rows and columns (the inner part A, in their order) are diagonal or block-diagonal with
    blocks of `inner_block_size`.

    Found by ``hessian_structure="auto"`` (:func:`arrowhead_hessian_structure`) for a latent
    that stacks fixed effects with random effects; it can also be given explicitly, and is then
    verified against the Hessian's pattern like any other structure. A in compact form is the
    (n, b + p) matrix of the columns H s_j (s_j: the inner positions j, j + b, j + 2b, … of A,
    j < b) and H e_k for the border indices k.

    Parameters
    ----------
    border : array_like of int
        The indices of the dense rows and columns (p ≥ 1 of them, distinct, in [0, n)).
    n : int
        The size of H.
    inner_block_size : int, default 1
        The block size b of A (1: diagonal); n − p must be a multiple of it.

    Raises
    ------
    ValueError
        If `border` is empty, repeats an index or lies outside [0, n), if it leaves no inner
        part, or if the inner size is not a multiple of `inner_block_size`.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_optim.linalg.arrowhead import ArrowheadStructure
    >>> structure = ArrowheadStructure(border=[0], n=4)
    >>> H = np.array([[4.0, 1, 1, 1], [1, 2, 0, 0], [1, 0, 3, 0], [1, 0, 0, 5]])
    >>> compact = np.column_stack([H[:, 1:].sum(axis=1), H[:, 0]])  # columns H s_0, H e_0
    >>> y = structure.solve_numpy(compact, np.ones(4))
    >>> bool(np.allclose(y, np.linalg.solve(H, np.ones(4))))
    True
    """

    kind: str = "arrowhead"
    block_size: int | None = None
    border: np.ndarray | None = None
    n: int | None = None
    inner_block_size: int = 1

    def __post_init__(self):
        self._require_keywords(
            "arrowhead", "`border` and `n`", "ArrowheadStructure(border=[0, 1], n=10)"
        )
        if self.n is None or isinstance(self.n, bool) or int(self.n) != self.n or self.n < 2:
            raise ValueError(f"`n` must be an integer of at least 2; got {self.n!r}.")
        n = int(self.n)
        border = np.array(self.border if self.border is not None else [], dtype=np.int64).ravel()
        if border.size == 0 or border.min() < 0 or border.max() >= n:
            raise ValueError(
                f"`border` must hold at least one index in [0, n) = [0, {n}); got {self.border!r}."
            )
        if np.unique(border).size != border.size:
            raise ValueError(f"`border` must not repeat an index; got {border.tolist()}.")
        border = np.sort(border)
        b = self.inner_block_size
        if isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 1:
            raise ValueError(f"`inner_block_size` must be a positive integer; got {b!r}.")
        m = n - border.size
        if m < 1 or m % b:
            raise ValueError(
                f"The inner part has n − p = {n} − {border.size} = {m} rows, which must be a "
                f"positive multiple of `inner_block_size` = {b}. Pass a border that leaves whole "
                "blocks."
            )
        inner = np.setdiff1d(np.arange(n), border)
        order = np.concatenate([inner, border])
        run = (
            "last"
            if border[0] == m and border[-1] == n - 1
            else "first"
            if border[-1] == border.size - 1
            else "general"
        )
        object.__setattr__(self, "_run", run)
        for name, value in (
            ("border", border),
            ("inner", inner),
            ("order", order),
            ("inverse", np.argsort(order)),
        ):
            value.setflags(write=False)
            object.__setattr__(self, name if name == "border" else f"_{name}", value)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "inner_block_size", int(b))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.n == self.n
            and other.inner_block_size == self.inner_block_size
            and np.array_equal(other.border, self.border)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.n, self.inner_block_size, self.border.tobytes()))

    def __repr__(self) -> str:
        inner = "diagonal" if self.inner_block_size == 1 else f"blocks of {self.inner_block_size}"
        return f"{type(self).__name__}(n={self.n}, border={self.p}, inner={inner!r})"

    @property
    def p(self) -> int:
        """The number of border rows."""
        return int(self.border.size)

    @property
    def compact_ndim(self) -> int:
        return 2

    def stacked(self) -> None:
        """No stacked form: a batch of these problems is solved one problem at a time."""
        return None

    def directions(self) -> np.ndarray:
        """The (b + p, n) directions whose Hessian-vector products are A's compact columns."""
        b = self.inner_block_size
        out = np.zeros((b + self.p, self.n))
        for j in range(b):
            out[j, self._inner[j::b]] = 1.0
        out[b + np.arange(self.p), self.border] = 1.0
        return out

    def holds(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Whether each entry (rows[e], cols[e]) lies inside the layout."""
        rows, cols = np.asarray(rows), np.asarray(cols)
        edge = np.isin(rows, self.border) | np.isin(cols, self.border)
        position = np.full(self.n, -1, dtype=np.int64)
        position[self._inner] = np.arange(self._inner.size) // self.inner_block_size
        return edge | (position[rows] == position[cols])

    def _split(self, v):
        """(v's inner rows, v's border rows), in their order. A border that is one run at
        either end of x (fixed effects listed first or last) is sliced: a symbolic gather's
        reverse pass is an increment, whose graph compiles slower."""
        p, m = self.p, self._inner.size
        if self._run == "last":
            return v[:m], v[m:]
        if self._run == "first":
            return v[p:], v[:p]
        return v[self._inner], v[self.border]

    def _join(self, inner, border, xp):
        """The rows `inner` and `border` back in x's order (the inverse of `_split`)."""
        if self._run == "last":
            return xp.concatenate([inner, border])
        if self._run == "first":
            return xp.concatenate([border, inner])
        return xp.concatenate([inner, border])[self._inverse]

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """A's compact columns H v for the directions v of :meth:`directions` (H symmetric: the
        reverse pass gives Aᵀ v = A v)."""
        xs = list(xs)
        F = pt.as_tensor_variable(F).ravel()
        # one reverse pass vectorized over the b + p directions, as the dense layout's n: its
        # graph, and that of its own gradient (the marginal's), is one pass's size; b + p
        # separate passes compiled four times slower (Epil: 56 s against 14 s)
        v = pt.vector("v", dtype=F.dtype)
        column = _concat_flat(grad((F * v).sum(), xs, disconnected_inputs="ignore"))
        directions = pt.constant(self.directions().astype(F.dtype))
        return vectorize_graph(column, {v: directions}).T

    def parts(self, A):
        """(A's diagonal (m,) or blocks (G, b, b), B (m, p), D (p, p)) of A in compact form."""
        return self._parts(pt.as_tensor_variable(A), pt)

    def _inner_factor(self, first):
        """A's square root: √a for a diagonal A, else the blocks' lower Cholesky factors (NaN
        where a block is not positive definite)."""
        if self.inner_block_size == 1:
            return pt.sqrt(first)
        return pt.linalg.cholesky(first, lower=True, on_error="nan")

    def _inner_solve(self, first, factor, R):
        """A⁻¹ R for an (m, k) R, from A's diagonal or blocks and `_inner_factor`."""
        if self.inner_block_size == 1:
            return R / first[:, None]
        b = self.inner_block_size
        blocks = R.reshape((-1, b, R.shape[-1]))
        half = pt.linalg.solve_triangular(factor, blocks, lower=True, check_finite=False, b_ndim=2)
        out = pt.linalg.solve_triangular(factor.mT, half, lower=False, check_finite=False, b_ndim=2)
        return out.reshape((-1, R.shape[-1]))

    def _schur(self, A):
        """(A's diagonal or blocks, A's factor, B, A⁻¹B, S's lower Cholesky factor)."""
        first, B, D = self.parts(A)
        factor = self._inner_factor(first)
        AinvB = self._inner_solve(first, factor, B)
        S = D - pt.dot(B.T, AinvB)
        L_S = pt.linalg.cholesky(0.5 * (S + S.T), lower=True, on_error="nan")
        return first, factor, B, AinvB, L_S

    def solve(self, A, rhs, *, transposed: bool = False, symmetric: bool = True):
        """H⁻¹ rhs by the Schur complement (H is symmetric: `transposed` and `symmetric` change
        nothing). NaN where A or S is not positive definite."""
        first, factor, B, AinvB, L_S = self._schur(A)
        rhs = pt.as_tensor_variable(rhs)
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        r_A, r_D = self._split(columns)
        Ainv_r = self._inner_solve(first, factor, r_A)
        t = r_D - pt.dot(B.T, Ainv_r)
        y_D = pt.linalg.solve_triangular(L_S, t, lower=True, check_finite=False, b_ndim=2)
        y_D = pt.linalg.solve_triangular(L_S.T, y_D, lower=False, check_finite=False, b_ndim=2)
        y_A = Ainv_r - pt.dot(AinvB, y_D)
        y = self._join(y_A, y_D, pt)
        return y[:, 0] if rhs.ndim == 1 else y

    def logdet_positive_definite(self, A) -> TensorVariable:
        """log det A + log det S: NaN where either is not positive definite."""
        first, factor, _, _, L_S = self._schur(A)
        if self.inner_block_size == 1:
            inner = pt.log(first).sum()
        else:
            inner = 2.0 * pt.log(pt.diagonal(factor, axis1=-2, axis2=-1)).sum()
        return inner + 2.0 * pt.log(pt.diagonal(L_S)).sum()

    def positive_definite(self, A) -> TensorVariable:
        """One boolean: A and the Schur complement S are positive definite (then so is H)."""
        _, factor, _, _, L_S = self._schur(A)
        good = pt.all(_finite(factor)) & pt.all(_finite(L_S))
        if self.inner_block_size == 1:
            good = good & pt.all(factor > 0)
        return good[None]

    def finite(self, A) -> TensorVariable:
        return pt.all(_finite(A))[None]

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        """mean + v with Lᵀ v = ε for H = L Lᵀ (the block factor of the module docstring): a draw
        of N(mean, H⁻¹) from n standard normals (or (n, k) of them: k draws)."""
        _, factor, _, AinvB, L_S = self._schur(precision)
        noise, mean = pt.as_tensor_variable(noise), pt.as_tensor_variable(mean)
        columns = noise[:, None] if noise.ndim == 1 else noise
        eps_A, eps_D = self._split(columns)
        v_D = pt.linalg.solve_triangular(L_S.T, eps_D, lower=False, check_finite=False, b_ndim=2)
        if self.inner_block_size == 1:
            root = eps_A / factor[:, None]
        else:
            b = self.inner_block_size
            blocks = eps_A.reshape((-1, b, eps_A.shape[-1]))
            root = pt.linalg.solve_triangular(
                factor.mT, blocks, lower=False, check_finite=False, b_ndim=2
            ).reshape((-1, eps_A.shape[-1]))
        v = self._join(root - pt.dot(AinvB, v_D), v_D, pt)
        if noise.ndim == 1:
            return mean + v[:, 0]
        return (mean[:, None] if mean.ndim == 1 else mean) + v

    # --- numerical -----------------------------------------------------------------------------
    def _parts(self, A, xp=np):
        """`parts` with an array module `xp` (numpy, jax.numpy or pytensor.tensor)."""
        b = self.inner_block_size
        inner, D = self._split(A)
        D = D[:, b:]
        if b == 1:
            first = inner[:, 0]
        else:
            blocks = inner[:, :b].reshape((-1, b, b))
            first = 0.5 * (blocks + xp.swapaxes(blocks, -1, -2))
        return first, inner[:, b:], 0.5 * (D + D.T)

    def _inner_solve_array(self, first, R, xp):
        if self.inner_block_size == 1:
            return R / first[:, None]
        b = self.inner_block_size
        return xp.linalg.solve(first, R.reshape(-1, b, R.shape[-1])).reshape(-1, R.shape[-1])

    def solve_array(self, A, rhs, xp=np):
        """Solve H y = rhs with an array module `xp` (numpy or jax.numpy), A in compact form."""
        first, B, D = self._parts(A, xp)
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        r_A, r_D = self._split(columns)
        both = self._inner_solve_array(first, xp.concatenate([B, r_A], axis=1), xp)
        AinvB, Ainv_r = both[:, : self.p], both[:, self.p :]
        y_D = xp.linalg.solve(D - B.T @ AinvB, r_D - B.T @ Ainv_r)
        y = self._join(Ainv_r - AinvB @ y_D, y_D, xp)
        return y[:, 0] if rhs.ndim == 1 else y

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """`solve_array` with numpy; raises numpy.linalg.LinAlgError when H is singular."""
        A = np.asarray(A, dtype=np.float64)
        if self.inner_block_size == 1 and not np.all(A[self._inner, 0] != 0):
            raise np.linalg.LinAlgError("singular diagonal part of an arrowhead matrix")
        return self.solve_array(A, np.asarray(rhs, dtype=np.float64))

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """One boolean: H − margin·I is positive definite (A − margin·I and its Schur complement
        are)."""
        first, B, D = self._parts(np.asarray(A, dtype=np.float64))
        b = self.inner_block_size
        if not (np.all(np.isfinite(first)) and np.all(np.isfinite(B)) and np.all(np.isfinite(D))):
            return np.array([False])
        try:
            if b == 1:
                if not np.all(first - margin > 0):
                    return np.array([False])
                AinvB = B / (first - margin)[:, None]
            else:
                shifted = first - margin * np.eye(b)
                np.linalg.cholesky(shifted)
                AinvB = np.linalg.solve(shifted, B.reshape(-1, b, self.p)).reshape(-1, self.p)
            np.linalg.cholesky(D - margin * np.eye(self.p) - B.T @ AinvB)
        except np.linalg.LinAlgError:
            return np.array([False])
        return np.array([True])

    def finite_numpy(self, A: np.ndarray) -> np.ndarray:
        return np.isfinite(A).all()[None]

    def matvec_numpy(self, A: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self.dense_matrix(A) @ v

    def dense_matrix(self, A, xp=np):
        """H as an (n, n) array (tests, small problems and the JAX fallback solve)."""
        first, B, D = self._parts(A, xp)
        b, m = self.inner_block_size, self._inner.size
        if b == 1:
            inner = xp.diag(first)
        else:
            G = m // b
            inner = (xp.eye(G)[:, None, :, None] * first[:, :, None, :]).reshape(m, m)
        permuted = xp.concatenate(
            [xp.concatenate([inner, B], axis=1), xp.concatenate([B.T, D], axis=1)], axis=0
        )
        return permuted[self._inverse][:, self._inverse]


# --- detection ---------------------------------------------------------------------------------


def arrowhead_of_pattern(
    rows: np.ndarray, cols: np.ndarray, n: int, max_border: int = MAX_BORDER
) -> ArrowheadStructure | None:
    """The arrowhead layout of a symmetric pattern given by its lower-triangle entries, or None.

    The border is the p rows with the most off-diagonal entries (ties by index), for the
    smallest p ≤ `max_border` that leaves a diagonal or block-diagonal inner part (blocks of b
    consecutive inner indices), provided b + p ≤ n / 2 (fewer reverse passes than a dense H
    by half). None for a pattern that is diagonal or block-diagonal already (p = 0) or has no
    such border.
    """
    from pymc_optim.linalg.detect import _lower_layout

    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    off = rows != cols
    r, c = rows[off], cols[off]
    if r.size == 0 or _lower_layout(rows, cols, n).kind != "dense":
        return None
    degree = np.bincount(r, minlength=n) + np.bincount(c, minlength=n)
    ranking = np.argsort(-degree, kind="stable")
    for p in range(1, min(max_border, n - 1) + 1):
        if degree[ranking[p - 1]] == 0:
            return None  # the rest carry no coupling: no border reaches a larger p
        border = np.sort(ranking[:p])
        is_border = np.zeros(n, dtype=bool)
        is_border[border] = True
        position = np.cumsum(~is_border) - 1  # an inner index's place in the inner order
        keep = ~(is_border[r] | is_border[c])
        m = n - p
        inner_r, inner_c = position[r[keep]], position[c[keep]]
        diagonal = np.arange(m)
        layout = _lower_layout(
            np.concatenate([diagonal, inner_r]), np.concatenate([diagonal, inner_c]), m
        )
        if layout.kind == "dense":
            continue
        b = 1 if layout.kind == "diagonal" else int(layout.block_size)
        if b + p > _MAX_PASS_FRACTION * n:
            return None
        return ArrowheadStructure(border=border, n=n, inner_block_size=b)
    return None


def arrowhead_hessian_structure(
    objective: Variable, xs: Sequence[Variable], sizes: Sequence[int]
) -> ArrowheadStructure | None:
    """An :class:`ArrowheadStructure` for ∇²ₓ objective where the pattern read off the graph
    (:mod:`pymc_optim.linalg._hessian_sparsity`, memory O(nnz)) is one and x has at least
    ``AUTO_MIN_SIZE`` elements, else None.

    The reading stops once the pattern has more entries than an arrowhead with ``MAX_BORDER``
    border rows and the widest inner blocks it would take could hold.
    """
    from pymc_optim.linalg import _hessian_sparsity

    n = int(sum(sizes))
    if n < AUTO_MIN_SIZE:
        return None
    # p ≤ MAX_BORDER border rows hold ≤ p n entries of the lower triangle, inner blocks of
    # b ≤ 2 MAX_BORDER elements ≤ n b / 2, the diagonal n: memory O(n), never O(n²)
    budget = min(n * (n + 1) // 2, n * (2 * MAX_BORDER + 1))
    found = _hessian_sparsity.hessian_pattern(objective, xs, sizes, budget)
    if found is None:
        return None
    return arrowhead_of_pattern(*found, n)
