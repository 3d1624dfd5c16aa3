"""H = S + Jᵀ C J: a sparse symmetric positive definite S plus a rank-k term through k linear
reductions r = J x of the controls.

A term of the log density that depends on x through a few sums or constant-weighted dot
products — PyMC's soft sum-to-zero penalty −½ (Σx / (ε N))² of ``pm.ICAR``, the same written in a
``pm.CustomDist`` or a Potential, an observation of a total — makes every pair of elements
interact: ∂²h(Jx)/∂x² = Jᵀ h''(r) J is dense. The rest of the density is often sparse (a GMRF
prior, an element-wise likelihood). Cutting the graph at the reductions (each r replaced by a
free variable r̃) separates the two, when the density is separable in them (∂²ℓ/∂x∂r̃ = 0, which
the graph shows: ∂ℓ/∂r̃ does not depend on x):

- S = ∂²ℓ/∂x² with r̃ held: sparse, its pattern read off the cut graph and its values by the
  coloured Hessian-vector products of :class:`~pymc_optim.linalg.sparse.SparseStructure`;
- C = ∂²ℓ/∂r̃² (k × k), read as (J Jᵀ)⁻¹ J ∂F̃/∂r̃ from the cut gradient F̃ (k reverse passes);
- J, constant, found once from the graph.

Solves by Woodbury through S's sparse Cholesky factor, log det by the matrix determinant lemma,
draws from the factor with a rank-k correction. The gradients are PyTensor's through those
pieces (the selected inverse for log det S, the sparse solve's pullback for the k columns
S⁻¹Jᵀ): O(nnz(L) k) per evaluation, nothing of size n × n.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs, io_toposort
from pytensor.scalar import basic as ps
from pytensor.tensor import basic as ptb
from pytensor.tensor import subtensor as pts
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape
from pytensor.tensor.variable import TensorVariable

from pymc_optim._modes import PYTHON_MODE
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure, _finite

__all__ = ["MAX_RANK", "LowRankUpdateStructure", "linear_reductions", "low_rank_hessian_structure"]

#: The most reductions cut: each costs a column of S⁻¹Jᵀ per solve, and a k × k system.
MAX_RANK = 8


@dataclass(frozen=True, eq=False)
class LowRankUpdateStructure(LinearStructure):
    """A symmetric positive definite H = S + Jᵀ C J: S sparse on `sparse`'s pattern, J the
    constant (k, n) `loadings` of k linear reductions of x, C a symmetric (k, k) matrix.

    Found by ``structure="auto"`` / ``hessian_structure="auto"`` (or ``"sparse"``) where the
    Hessian is sparse but for terms through a few sums of x (:func:`low_rank_hessian_structure`):
    not built by hand. A in compact form is the vector ``[S's values on the pattern, C.ravel()]``.
    S must be positive definite (a GMRF prior plus a likelihood observing every connected
    component; an intrinsic prior alone is not), C positive semidefinite for draws.
    """

    kind: str = "sparse_low_rank"
    block_size: int | None = None
    sparse: SparseStructure | None = None
    loadings: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.sparse, SparseStructure):
            raise TypeError(
                f"`sparse` must be a SparseStructure; got {type(self.sparse).__name__}."
            )
        J = np.array(self.loadings, dtype=np.float64, ndmin=2)
        if J.ndim != 2 or J.shape[1] != self.sparse.pattern.n or not 1 <= J.shape[0] <= MAX_RANK:
            raise ValueError(
                f"`loadings` must have shape (k, {self.sparse.pattern.n}) with 1 ≤ k ≤ "
                f"{MAX_RANK}; got shape {J.shape}."
            )
        J.setflags(write=False)
        object.__setattr__(self, "loadings", J)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.sparse == self.sparse
            and np.array_equal(other.loadings, self.loadings)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.sparse, self.loadings.shape, self.loadings.tobytes()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sparse={self.sparse!r}, rank={self.rank})"

    @property
    def rank(self) -> int:
        """k, the number of reductions."""
        return int(self.loadings.shape[0])

    @property
    def compact_ndim(self) -> int:
        return 1

    def stacked(self) -> None:
        """No stacked form: a batch of these problems is solved one problem at a time."""
        return None

    def parts(self, A) -> tuple[TensorVariable, TensorVariable]:
        """(S's values, C) of A in compact form."""
        nnz, k = self.sparse.pattern.nnz, self.rank
        A = pt.as_tensor_variable(A)
        return A[:nnz], A[nnz:].reshape((k, k))

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        xs = list(xs)
        if len(xs) != 1:
            raise ValueError("A low-rank update structure has one control.")
        F = pt.as_tensor_variable(F).ravel()
        (x,) = xs
        cut, held = self._cut(F, x)
        F_cut = graph_replace(F, cut, strict=False)
        values = self.sparse.jacobian(F_cut, xs)
        J = pt.constant(self.loadings)
        # ∂F̃/∂r̃ = Jᵀ C where ℓ is separable in the reductions: C = (J Jᵀ)⁻¹ J ∂F̃/∂r̃
        projected = pt.dot(J, F_cut)
        D = pt.stack(
            [
                pt.stack(grad(projected[i], held, disconnected_inputs="ignore"))
                for i in range(self.rank)
            ]
        )
        C = pt.dot(pt.constant(np.linalg.inv(self.loadings @ self.loadings.T)), D)
        back = {r_tilde: reduction for reduction, r_tilde in cut.items()}
        values, C = graph_replace([values, C], back, strict=False)
        return pt.concatenate([values, C.ravel()])

    def _cut(self, F, x) -> tuple[dict, list]:
        """The reductions of F's graph, each mapped to the free scalar standing for its row of
        `loadings`, and those scalars in row order."""
        found = linear_reductions([F], x)
        held = [pt.scalar(f"r_{i}", dtype="float64") for i in range(self.rank)]
        if not found:
            raise ValueError(
                "The graph has none of the reductions this low-rank structure was found with "
                "(was it found on another graph?). Pass `structure='auto'`."
            )
        rows = _loadings(found, x, self.sparse.pattern.n)
        cut = {}
        for reduction, row in zip(found, rows, strict=True):
            match = [i for i in range(self.rank) if np.allclose(row, self.loadings[i], rtol=1e-12)]
            if not match:
                raise ValueError(
                    "The graph has a linear reduction of x that this low-rank structure was not "
                    "found with (was it found on another graph?); H would miss its term. Pass "
                    "`structure='auto'`."
                )
            cut[reduction] = held[match[0]].astype(reduction.type.dtype)
        return cut, held

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool) -> TensorVariable:
        """H⁻¹ rhs by Woodbury: y − Y (I + C G)⁻¹ C J y, y = S⁻¹ rhs, Y = S⁻¹ Jᵀ, G = J Y (H is
        symmetric: `transposed` and `symmetric` change nothing)."""
        S, C = self.parts(A)
        rhs = pt.as_tensor_variable(rhs)
        y, Y, G = self._solves(S, rhs)
        J = pt.constant(self.loadings)
        eye = pt.eye(self.rank)
        t = pt.linalg.solve(eye + pt.dot(C, G), pt.dot(C, pt.dot(J, y)))
        return y - pt.dot(Y, t)

    def _solves(self, S, rhs):
        """S⁻¹ rhs, S⁻¹ Jᵀ and J S⁻¹ Jᵀ, from one sparse solve with k + 1 (or k + m) columns."""
        columns = rhs[:, None] if rhs.ndim == 1 else rhs
        m = 1 if rhs.ndim == 1 else rhs.shape[1]
        both = self.sparse.pattern.solve(
            S, pt.concatenate([columns, pt.constant(self.loadings.T)], axis=1)
        )
        y = both[:, 0] if rhs.ndim == 1 else both[:, :m]
        Y = both[:, m:]
        G = pt.dot(pt.constant(self.loadings), Y)
        return y, Y, 0.5 * (G + G.T)

    def logdet_positive_definite(self, A) -> TensorVariable:
        """log det S + log det(I + C G): NaN where S is not positive definite."""
        S, C = self.parts(A)
        Y = self.sparse.pattern.solve(S, pt.constant(self.loadings.T))
        G = pt.dot(pt.constant(self.loadings), Y)
        lemma = pt.linalg.det(pt.eye(self.rank) + pt.dot(C, 0.5 * (G + G.T)))
        return self.sparse.pattern.logdet(S) + pt.log(lemma)

    def positive_definite(self, A) -> TensorVariable:
        """One boolean: S is positive definite and so is G⁻¹ + C (then so is H)."""
        S, C = self.parts(A)
        Y = self.sparse.pattern.solve(S, pt.constant(self.loadings.T))
        G = pt.dot(pt.constant(self.loadings), Y)
        inner = pt.linalg.inv(0.5 * (G + G.T)) + 0.5 * (C + C.T)
        L = pt.linalg.cholesky(inner, on_error="nan")
        good = _finite(self.sparse.pattern.logdet(S)) & pt.all(_finite(L))
        return good[None]

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        """mean + z − Y K (I + G K)⁻¹ J z, z = Pᵀ L⁻ᵀ ε a draw of N(0, S⁻¹): a draw of
        N(mean, H⁻¹) from n standard normals.

        With S = Pᵀ L Lᵀ P and W = L⁻¹ P Jᵀ, H = Pᵀ L (I + W C Wᵀ) Lᵀ P, and I + W K Wᵀ is a square
        root of I + W C Wᵀ when K G K + 2K = C (G = WᵀW = J S⁻¹ Jᵀ): K = G^{-½} ((I + G^{½} C
        G^{½})^{½} − I) G^{-½}. Needs G^{½} C G^{½} > −I, which holds where H is positive
        definite."""
        S, C = self.parts(precision)
        noise, mean = pt.as_tensor_variable(noise), pt.as_tensor_variable(mean)
        if noise.ndim == 2 and mean.ndim == 1:  # (n, m): m draws
            mean = mean[:, None]
        z = self.sparse.pattern.sample(S, pt.zeros((self.sparse.pattern.n,)), noise)
        Y = self.sparse.pattern.solve(S, pt.constant(self.loadings.T))
        G = pt.dot(pt.constant(self.loadings), Y)
        G = 0.5 * (G + G.T)
        g, V = pt.linalg.eigh(G)
        root, inverse_root = (pt.dot(V * pt.sqrt(g), V.T), pt.dot(V / pt.sqrt(g), V.T))
        mu, U = pt.linalg.eigh(pt.eye(self.rank) + pt.dot(pt.dot(root, 0.5 * (C + C.T)), root))
        K = pt.dot(
            pt.dot(inverse_root, pt.dot(U * pt.sqrt(mu), U.T) - pt.eye(self.rank)), inverse_root
        )
        J = pt.constant(self.loadings)
        Jz = pt.dot(J, z)
        t = pt.linalg.solve(pt.eye(self.rank) + pt.dot(G, K), Jz)
        return mean + z - pt.dot(Y, pt.dot(K, t))

    # --- numerical -----------------------------------------------------------------------------
    def _parts_numpy(self, A: np.ndarray):
        nnz, k = self.sparse.pattern.nnz, self.rank
        A = np.asarray(A, dtype=np.float64)
        return A[:nnz], A[nnz:].reshape(k, k)

    def _factor_numpy(self, S: np.ndarray):
        lx, symbolic = self.sparse.pattern._factor(S)
        if lx is None:
            raise np.linalg.LinAlgError("sparse part S is not positive definite")
        return lambda b: _cholesky.solve(symbolic, lx, np.asarray(b, dtype=np.float64))

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        S, C = self._parts_numpy(A)
        solve_S = self._factor_numpy(S)
        J = self.loadings
        rhs = np.asarray(rhs, dtype=np.float64)
        both = solve_S(np.column_stack([rhs.reshape(rhs.shape[0], -1), J.T]))
        m = both.shape[1] - self.rank
        y, Y = both[:, :m], both[:, m:]
        G = J @ Y
        t = np.linalg.solve(np.eye(self.rank) + C @ (0.5 * (G + G.T)), C @ (J @ y))
        return (y - Y @ t).reshape(rhs.shape)

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """One boolean: H − margin·I is positive definite (S − margin·I and G⁻¹ + C are)."""
        S, C = self._parts_numpy(A)
        if margin:
            S = S.copy()
            S[self.sparse._diagonal_entries()] -= margin
        try:
            Y = self._factor_numpy(S)(self.loadings.T)
            G = self.loadings @ Y
            np.linalg.cholesky(np.linalg.inv(0.5 * (G + G.T)) + 0.5 * (C + C.T))
        except np.linalg.LinAlgError:
            return np.array([False])
        return np.array([bool(np.all(np.isfinite(C)))])

    def matvec_numpy(self, A: np.ndarray, v: np.ndarray) -> np.ndarray:
        S, C = self._parts_numpy(A)
        J = self.loadings
        return self.sparse.matvec_numpy(S, v) + J.T @ (C @ (J @ v))

    def dense_matrix(self, A, xp=np):
        """H as an (n, n) array (tests and small problems)."""
        S, C = self._parts_numpy(A)
        pattern = self.sparse.pattern
        H = np.zeros((pattern.n, pattern.n))
        np.add.at(H, (pattern.rows, pattern.cols), S)
        off = pattern.rows != pattern.cols
        np.add.at(H, (pattern.cols[off], pattern.rows[off]), S[off])
        return H + self.loadings.T @ C @ self.loadings


# --- reading the graph -----------------------------------------------------------------------
#: Element-wise scalar Ops linear in each argument that depends on x, the others constant.
_SUMS = (ps.Add, ps.Sub, ps.Neg, ps.Identity)
#: Ops whose first input's entries they copy, select or rearrange (the rest: constants).
_MOVES = (
    DimShuffle,
    Reshape,
    SpecifyShape,
    pts.Subtensor,
    pts.AdvancedSubtensor,
    ptb.Split,
)


def linear_reductions(outputs: Sequence[Variable], x: Variable) -> list[Variable]:
    """The scalars of the graph of `outputs` that are linear in `x` with constant coefficients
    and reduce a non-scalar such variable (Σx, w · x, the sum of a slice, in any order of
    copies, sums and constant scalings): the points at which a term of the graph sees x only
    through J x."""
    constant = _constants(outputs, x)
    linear = {x}
    found = []
    for node in io_toposort([x, *graph_inputs(outputs)], outputs):
        ins = node.inputs
        dependent = [i in linear for i in ins]
        if not any(dependent):
            continue
        if not all(d or i in constant for d, i in zip(dependent, ins, strict=True)):
            continue
        if not _linear_node(node, dependent):
            continue
        linear.update(node.outputs)
        out = node.outputs[0]
        if (
            len(node.outputs) == 1
            and out.type.ndim == 0
            and out.type.dtype.startswith("float")
            and any(d and i.type.ndim > 0 for d, i in zip(dependent, ins, strict=True))
        ):
            found.append(out)
    return found


def _constants(outputs, x) -> set:
    """The variables of the graph computed from constants alone (x's static shape included)."""
    known = set()
    for var in graph_inputs(outputs):
        if isinstance(var, Constant):
            known.add(var)
    for node in io_toposort(list(graph_inputs(outputs)), outputs):
        if isinstance(node.op, Shape | Shape_i) and None not in node.inputs[0].type.shape:
            known.update(node.outputs)
        elif all(i in known for i in node.inputs):
            known.update(node.outputs)
    return known


def _linear_node(node, dependent) -> bool:
    """Whether `node` is linear in its `dependent` inputs, the others held."""
    op = node.op
    if isinstance(op, Elemwise):
        scalar = op.scalar_op
        if isinstance(scalar, _SUMS):
            return True
        if isinstance(scalar, ps.Cast):
            return node.outputs[0].type.dtype.startswith("float")
        if isinstance(scalar, ps.Mul):
            return sum(dependent) == 1
        if isinstance(scalar, ps.TrueDiv):
            return dependent == [True, False]
        return False
    if isinstance(op, _MOVES):
        return dependent[0] and not any(dependent[1:])
    if isinstance(op, ptb.Join):
        return not dependent[0]
    if isinstance(op, CAReduce):
        return isinstance(op.scalar_op, ps.Add)
    if isinstance(op, Dot) or (isinstance(op, Blockwise) and isinstance(op.core_op, Dot)):
        return sum(dependent) == 1
    return False


def _value_ancestors(var) -> set:
    """The variables whose values `var`'s value depends on: not those that only give a shape
    (the first input of ``second``, which gradients fill with ones; a ``Shape``'s input)."""
    seen, pending = set(), [var]
    while pending:
        v = pending.pop()
        if v in seen:
            continue
        seen.add(v)
        node = v.owner
        if node is None or isinstance(node.op, Shape | Shape_i):
            continue
        ins = node.inputs
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, ps.Second):
            ins = ins[1:]
        pending.extend(ins)
    return seen


def _loadings(reductions, x, n: int) -> np.ndarray:
    """The rows J_i = ∂r_i/∂x of linear `reductions` (constant: evaluated at x = 0)."""
    rows = [grad(r, x, disconnected_inputs="ignore").ravel() for r in reductions]
    fn = pytensor.function([x], rows, mode=PYTHON_MODE, on_unused_input="ignore")
    return np.stack([np.asarray(row, dtype=np.float64) for row in fn(np.zeros(n, x.type.dtype))])


def low_rank_hessian_structure(
    objective: Variable, xs: Sequence[Variable], sizes: Sequence[int], max_nnz: int
) -> LowRankUpdateStructure | None:
    """H = ∇²ₓ objective as S + Jᵀ C J, or None: the objective's scalar linear reductions of x
    (:func:`linear_reductions`) cut where it is separable in them and curved in them, and S's
    pattern (read off the cut graph, at most `max_nnz` entries) sparse."""
    from pymc_optim.linalg import _hessian_sparsity

    if len(xs) != 1:
        return None
    (x,) = xs
    n = int(sum(sizes))
    found = linear_reductions([objective], x)
    if not found or x.type.ndim != 1:
        return None
    held = {r: r.type() for r in found}
    cut = graph_replace(objective, held, strict=False)
    slopes = grad(cut, list(held.values()), disconnected_inputs="ignore")
    keep = []
    for reduction, slope in zip(found, slopes, strict=True):
        above = _value_ancestors(slope)
        if x in above:  # ℓ not separable in this reduction: H has no such split
            return None
        if any(r_tilde in above for r_tilde in held.values()):  # curved: part of C
            keep.append(reduction)
    if len(keep) > MAX_RANK:
        warnings.warn(
            f"The Hessian couples every pair of elements of `{x.name or 'x'}` through {len(keep)} "
            f"sums of it (e.g. a soft sum-to-zero penalty per connected component); a sparse "
            f"plus low-rank Hessian takes at most {MAX_RANK} (pymc_optim.linalg.low_rank."
            "MAX_RANK), so the Hessian is not split. Fewer sums (one penalty on the whole "
            "field, or an exact sum-to-zero constraint) keep it sparse.",
            PymcOptimWarning,
            stacklevel=2,
        )
        return None
    if not keep:
        return None
    objective = graph_replace(objective, {r: held[r] for r in keep}, strict=False)
    J = _loadings(keep, x, n)
    if np.linalg.matrix_rank(J) < J.shape[0] or not np.all(np.isfinite(J)):
        return None  # (two reductions with one row: their sum is the one to cut)
    pattern = _hessian_sparsity.hessian_pattern(objective, [x], [n], max_nnz)
    if pattern is None:
        return None
    from pymc_optim.linalg.sparse import SparsePattern

    rows, cols = pattern
    return LowRankUpdateStructure(
        sparse=SparseStructure(pattern=SparsePattern(rows, cols, n)), loadings=J
    )
