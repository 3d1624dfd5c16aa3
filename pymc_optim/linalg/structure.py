"""Structure of the square linear systems A = ∂F/∂x: how A is built compactly and solved.

The implicit rule and the graph-native Newton solvers both solve with A. Its structure decides
the cost: ``"dense"`` builds the (n, n) matrix (n reverse passes, O(n³) solve); ``"diagonal"``
(F_i depends on x only through x_i) needs one reverse pass, Aᵀ1 = diag(A), and an element-wise
division; ``"block_diagonal"`` with block size b (contiguous blocks of b elements of x, e.g.
several random effects per group) needs b reverse passes and G = n/b independent b×b solves,
O(G b³): a latent field of G independent groups costs O(G), not O(G³).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad, jacobian
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.linalg import Solve
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "STRUCTURES",
    "LinearStructure",
    "UnlessFinite",
    "as_linear_structure",
    "structure_from_pattern",
]

STRUCTURES = ("dense", "diagonal", "block_diagonal")


@dataclass(frozen=True)
class LinearStructure:
    """How A = ∂F/∂x is laid out: `kind` in STRUCTURES, `block_size` for block-diagonal A."""

    kind: str = "dense"
    block_size: int | None = None
    #: Whether `jacobian` builds A from the condition's parts alone, without F or x (then
    #: `jacobian_at_solution(*parts)` builds A at the solution).
    from_parts_alone: ClassVar[bool] = False

    def _require_keywords(self, kind: str, fields: str, example: str) -> None:
        """For a subclass whose own `fields` follow `kind` and `block_size`: refuse a positional
        call, which would put the first of them in `kind`."""
        if self.kind != kind or self.block_size is not None:
            raise ValueError(
                f"`{type(self).__name__}` takes {fields} by keyword (its first fields are "
                f"LinearStructure's `kind` and `block_size`); got kind={self.kind!r}, "
                f"block_size={self.block_size!r}. Pass e.g. `{example}`."
            )

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """A in compact form: (n, n) dense, (n,) diagonal, or (G, b, b) blocks."""
        xs = list(xs)
        if all(None not in x.type.shape for x in xs):
            # A is square: F has x's size, which is then a constant of the graph (JAX needs it).
            F = pt.specify_shape(F, (sum(int(np.prod(x.type.shape)) for x in xs),))
        if self.kind == "diagonal":
            return _concat_flat(grad(F.sum(), xs, disconnected_inputs="ignore"))
        if self.kind == "block_diagonal":
            b = self.block_size
            position = pt.arange(F.shape[0]) % b
            # Aᵀ e_j (e_j = 1 at position j of every block) holds row j of every block. (One
            # reverse pass vectorized over the b directions e_j instead of b passes compiles
            # faster for large b, but its gradient, the third derivatives a Laplace marginal's
            # dlogp needs, fails PyTensor's shape checks: kept as b passes.)
            rows = [
                _concat_flat(grad((F * pt.eq(position, j)).sum(), xs, disconnected_inputs="ignore"))
                for j in range(b)
            ]
            return pt.stack(rows).reshape((b, -1, b)).transpose(1, 0, 2)
        blocks = jacobian(F, xs, vectorize=True, disconnected_inputs="ignore")
        return pt.concatenate(
            [blk.reshape((F.shape[0], x.size)) for blk, x in zip(blocks, xs, strict=True)], axis=1
        )

    def solve(
        self, A: TensorVariable, rhs: TensorVariable, *, transposed: bool, symmetric: bool
    ) -> TensorVariable:
        """Solve A y = rhs (or Aᵀ y = rhs) symbolically, A in compact form."""
        if self.kind == "diagonal":
            return rhs / A
        assume_a = "sym" if symmetric else "gen"
        if transposed and not symmetric:
            A = A.mT
        if self.kind == "block_diagonal":
            rhs = rhs.reshape((-1, self.block_size))
        # A singular or NaN A (e.g. A at the NaN iterate of a failed solve) must give NaN of
        # rhs's shape, which every backend's solve does except pytensor's Solve.perform (NaN
        # shaped like A, which breaks the graph downstream): hence _FailSafeSolve. The
        # one-column form is the one the structured-linalg rewrites recognise.
        y = Blockwise(_FailSafeSolve(assume_a=assume_a, b_ndim=2))(A, rhs[..., None])[..., 0]
        return y.reshape((-1,))

    def logdet_positive_definite(self, A: TensorVariable) -> TensorVariable:
        """log det A for symmetric positive definite A in compact form, via Cholesky (NaN if A
        is not positive definite)."""
        if self.kind == "diagonal":
            return pt.log(A).sum()
        L = pt.linalg.cholesky(A)
        return 2.0 * pt.log(pt.diagonal(L, axis1=-2, axis2=-1)).sum()

    def positive_definite(self, A: TensorVariable) -> TensorVariable:
        """Whether A (compact form, symmetric) is positive definite, one boolean per independent
        part of A: per diagonal entry, per block, or one for a dense A. NaN entries count as not
        positive definite. The JAX and numba Newton loops compile this graph for their curvature
        test at a minimum (see `positive_definite_numpy` for the numpy loop)."""
        if self.kind == "diagonal":
            return pt.gt(A, 0)
        L = pt.linalg.cholesky(A, on_error="nan")
        finite = pt.all(_finite(L), axis=(-2, -1))
        return finite if self.kind == "block_diagonal" else finite[None]

    def finite(self, A: TensorVariable) -> TensorVariable:
        """Whether A (compact form) has only finite entries, one boolean per independent part of
        A, as `positive_definite` counts them. The Newton loops reject a trial point whose A is
        not finite: its Newton step would be NaN."""
        if self.kind == "diagonal":
            return _finite(A)
        if self.kind == "block_diagonal":
            return pt.all(_finite(A), axis=(-2, -1))
        return pt.all(_finite(A))[None]

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        """mean + P^{-1/2} ε: a draw of N(mean, P⁻¹) from standard normal `noise` (P = L Lᵀ,
        the draw solves Lᵀ v = ε)."""
        if self.kind == "diagonal":
            return mean + noise / pt.sqrt(precision)
        L = pt.linalg.cholesky(precision)
        if self.kind == "block_diagonal":
            noise = noise.reshape((-1, self.block_size))
        v = pt.linalg.solve_triangular(L.mT, noise[..., None], lower=False, b_ndim=2)[..., 0]
        return mean + v.reshape((-1,))

    # --- numerical (the graph-native solvers' perform) -----------------------------------------
    def solve_array(self, A, rhs, xp=np):
        """Solve A y = rhs with an array module `xp` (numpy or jax.numpy), A in compact form."""
        if self.kind == "diagonal":
            return rhs / A
        if self.kind == "block_diagonal":
            return xp.linalg.solve(A, rhs.reshape(-1, self.block_size, 1)).reshape(-1)
        return xp.linalg.solve(A, rhs)

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """`solve_array` with numpy; raises numpy.linalg.LinAlgError when A is singular."""
        if self.kind == "diagonal" and not np.all(A != 0):
            raise np.linalg.LinAlgError("singular diagonal system")
        return self.solve_array(A, rhs)

    def finite_numpy(self, A: np.ndarray) -> np.ndarray:
        """`finite` with numpy."""
        if self.kind == "diagonal":
            return np.isfinite(A)
        if self.kind == "block_diagonal":
            return np.isfinite(A).all(axis=(-2, -1))
        return np.isfinite(A).all()[None]

    def solve_or_nan(self, A: TensorVariable, F: TensorVariable) -> TensorVariable:
        """A⁻¹F in the graph as `solve_or_nan_numpy` computes it (the compiled Newton loops'
        direction): LU as numpy.linalg.solve, NaN where a diagonal entry is zero."""
        if self.kind == "diagonal":
            nonzero = pt.neq(A, 0)
            return pt.switch(nonzero, F / pt.switch(nonzero, A, 1.0), np.nan)
        return self.solve(A, F, transposed=False, symmetric=False)

    def solve_or_nan_numpy(self, A: np.ndarray, F: np.ndarray) -> np.ndarray:
        """A⁻¹F, NaN in the independent parts of A (diagonal entries, blocks; all of a single
        system) that are singular: the numpy Newton loop's direction."""
        if self.kind == "diagonal" and A.all():  # (no zero entry; NaN counts as nonzero)
            return F / A
        try:
            return self.solve_numpy(A, F)
        except np.linalg.LinAlgError:
            pass
        if self.kind == "diagonal":
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(A != 0, F / np.where(A != 0, A, 1.0), np.nan)
        if self.kind != "block_diagonal":
            return np.full_like(F, np.nan)
        b = self.block_size
        out = np.full((A.shape[0], b), np.nan)
        for j, (block, rhs) in enumerate(zip(A, F.reshape(-1, b), strict=True)):
            try:
                out[j] = np.linalg.solve(block, rhs)
            except np.linalg.LinAlgError:
                pass
        return out.reshape(-1)

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """`positive_definite` with numpy, of A − margin·I (Cholesky per block): one boolean
        per independent part of A. The numpy Newton loop tests A itself; scipy's methods test
        their minimum with a margin."""
        if self.kind == "diagonal":
            return A > margin  # False for NaN
        blocks = A if self.kind == "block_diagonal" else A[None]
        good = np.all(np.isfinite(blocks), axis=(1, 2))
        if margin:
            blocks = blocks - margin * np.eye(blocks.shape[-1])
        try:
            np.linalg.cholesky(blocks)
        except np.linalg.LinAlgError:
            for j, block in enumerate(blocks):
                try:
                    np.linalg.cholesky(block)
                except np.linalg.LinAlgError:
                    good[j] = False
        return good

    @property
    def compact_ndim(self) -> int:
        """Dimensions of A in compact form (its inner graphs are typed with them)."""
        return {"diagonal": 1, "dense": 2, "block_diagonal": 3}[self.kind]


def as_linear_structure(structure, block_size=None, argument: str = "structure"):
    """Validate the user's `structure` (a name) and `block_size`.

    ``"auto"`` comes back as the string ``"auto"``: the layout is read off the graph later, by
    :func:`pymc_optim.linalg.detect.resolve_structure`, once F exists.
    """
    if isinstance(structure, LinearStructure):
        return structure
    if structure == "auto":
        if block_size is not None:
            raise ValueError(
                f"`block_size` is only used with `{argument}='block_diagonal'`; got "
                f"`{argument}='auto'` and block_size={block_size!r}. Drop `block_size`, or pass "
                f"`{argument}='block_diagonal'`."
            )
        return "auto"
    if structure == "sparse":  # the pattern is read off the graph later, like "auto"
        if block_size is not None:
            raise ValueError(
                f"`block_size` is only used with `{argument}='block_diagonal'`; got "
                f"`{argument}='sparse'` and block_size={block_size!r}. Drop `block_size`."
            )
        return "sparse"
    if structure not in STRUCTURES:
        raise ValueError(
            f"`{argument}` must be one of "
            f"{', '.join(map(repr, ('auto', *STRUCTURES, 'sparse')))}; got {structure!r}."
        )
    if structure == "block_diagonal":
        if not isinstance(block_size, int | np.integer) or block_size < 1:
            raise ValueError(
                f"`{argument}='block_diagonal'` needs `block_size`, a positive integer "
                f"(the number of consecutive elements of x per block); got {block_size!r}."
            )
        return LinearStructure("block_diagonal", int(block_size))
    if block_size is not None:
        raise ValueError(f"`block_size` is only used with `{argument}='block_diagonal'`.")
    return LinearStructure(structure)


def structure_from_pattern(pattern: np.ndarray) -> LinearStructure:
    """The most compact structure whose layout holds every nonzero of the (n, n) `pattern`.

    Diagonal if only the diagonal is nonzero; block-diagonal with the smallest block size b
    (a proper divisor of n) such that every nonzero (i, j) has i // b == j // b; else dense.
    """
    pattern = np.asarray(pattern, dtype=bool)
    n = pattern.shape[0]
    rows, cols = np.nonzero(pattern)
    if np.all(rows == cols):
        return LinearStructure("diagonal")
    # a block holds both ends of its widest entry: no block size below that width + 1
    for b in range(int(np.abs(rows - cols).max()) + 1, n // 2 + 1):
        if n % b == 0 and np.all(rows // b == cols // b):
            return LinearStructure("block_diagonal", b)
    return LinearStructure("dense")


class _FailSafeSolve(Solve):
    """pytensor's `Solve`, except that when A is singular or not finite the Python
    implementation returns NaN shaped like b (the output's type) instead of shaped like A.

    The numba and JAX implementations of `Solve` (dispatched to for this subclass too) already
    return NaN, or inf/NaN, of b's shape; pytensor's rewrites rebuild it as ``type(op)(**props)``,
    which keeps the subclass.
    """

    def perform(self, node, inputs, outputs):
        super().perform(node, inputs, outputs)
        b = inputs[1]
        if outputs[0][0].shape != b.shape:
            outputs[0][0] = np.full(b.shape, np.nan, dtype=node.outputs[0].type.dtype)
        elif not outputs[0][0].flags.writeable:
            # scipy's solve with overwrite_b returns a read-only view of b; ops downstream
            # may work in place on this output
            outputs[0][0] = np.array(outputs[0][0])


def _finite(x) -> TensorVariable:
    """Element-wise: neither NaN nor ±inf (pytensor has no `isfinite`)."""
    return pt.invert(pt.isnan(x) | pt.isinf(x))


def _concat_flat(pieces) -> TensorVariable:
    pieces = [pt.as_tensor_variable(p).ravel() for p in pieces]
    return pieces[0] if len(pieces) == 1 else pt.concatenate(pieces)


class UnlessFinite(Op):
    """`schur` (a solve by a structure's blocks) where every entry is finite, else the dense
    solve of (A, rhs) by ``structure.dense_matrix(A, xp)``, computed numerically and only then
    (for the KKT system: H singular, the KKT matrix not).

    One Op rather than ``ifelse``: PyTensor evaluates an ifelse's untaken branch when an in-place
    Op of the taken one overwrites a view it reads, and an ifelse cannot be batched by Blockwise
    (``vectorize_graph`` of a solution's gradient). The gradient is that of `schur` (exact where
    it is finite; NaN at a singular H, where the Schur form is NaN).
    """

    __props__ = ("structure", "transposed")
    view_map = {0: [0]}

    def __init__(self, structure: LinearStructure, transposed: bool):
        self.structure = structure
        self.transposed = transposed

    def make_node(self, schur, A, rhs):
        schur, A, rhs = (pt.as_tensor_variable(v) for v in (schur, A, rhs))
        return Apply(self, [schur, A, rhs], [schur.type()])

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def perform(self, node, inputs, outputs):
        schur, A, rhs = inputs
        if np.all(np.isfinite(schur)):
            outputs[0][0] = schur
            return
        dense = self.structure.dense_matrix(A, np)
        try:
            out = np.linalg.solve(dense.T if self.transposed else dense, rhs)
        except np.linalg.LinAlgError:
            out = np.full(rhs.shape, np.nan)
        outputs[0][0] = out.astype(node.outputs[0].type.dtype, copy=False)

    def pullback(self, inputs, outputs, output_grads):
        _, A, rhs = inputs
        return [output_grads[0], A.zeros_like(), rhs.zeros_like()]
