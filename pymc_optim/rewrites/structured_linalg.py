"""Graph rewrites that decompose Kronecker and block-diagonal matrices through their factors.

Latent Gaussian fields are structured: grouped random effects give block-diagonal covariances
(Σ = block_diag(Σ₁, …, Σ_G)), separable space–time effects give Kronecker products
(Σ = Σ_t ⊗ Σ_s). A dense Cholesky, solve or determinant of such a matrix costs O(N³); through
the factors it costs the factors' O(n³ + m³) (plus O(N(n + m)) to apply them) or G·O(b³).

PyTensor already lifts ``inv``/``pinv``/``cholesky`` through ``kron`` and ``block_diag``
(``lift_linalg_of_expanded_matrices``, specialize phase only), rewrites ``det`` of them and
splits a solve with a block-diagonal matrix into block solves. This module
adds, for A (n × n), B (m × m), N = n·m and ⊗ = ``pt.linalg.kron`` (row-major: the element
(i·m + k) of a vector is X[i, k] of its (n, m) reshape, so (A ⊗ B) vec(X) = vec(A X Bᵀ)):

- ``cholesky(A ⊗ B) = cholesky(A) ⊗ cholesky(B)``, ``cholesky(block_diag(Aᵢ)) =
  block_diag(cholesky(Aᵢ))``, batched (``Blockwise``) inputs included, and as early as the
  canonicalize phase so that the rewrites below see the factors. Blocks of one static size are
  factored as one stack (one batched Cholesky, whose solves and Σ log diag take the stack, with a
  gradient written with masks, `_MaskedCholesky`): the graph and its gradient then hold one
  batched Op per step instead of one per block (a 30-block MvNormal: 1282 → 318 nodes);
- ``solve``, ``solve_triangular`` and ``cho_solve`` with a Kronecker matrix by the vec trick
  X = A⁻¹ Y B⁻ᵀ (two small solves with many right-hand sides), and with a block-diagonal matrix
  as independent block solves — one batched solve when the blocks share a static shape;
- log-determinants: ``slogdet``, ``log(det(·))``, ``log(abs(det(·)))`` and the Cholesky form
  Σ log diag(L) of a Kronecker product, log|A ⊗ B| = m log|A| + n log|B| (sign sign(A)ᵐ sign(B)ⁿ),
  and of a block-diagonal matrix, Σᵢ log|Aᵢ|;
- ``(A ⊗ B)ᵀ = Aᵀ ⊗ Bᵀ``, ``block_diag(Aᵢ)ᵀ = block_diag(Aᵢᵀ)`` and the products
  (A ⊗ B) M, M (A ⊗ B) by the same vec trick (the gradient of a Cholesky solves with and
  multiplies by Lᵀ), and a fix for batched ``log(det(·))``, which PyTensor 2.38 cannot compile;
- a batch of solves with one matrix (a vectorized Jacobian solving with a prior's Cholesky
  factor once per direction) as one solve with more columns, not a Python loop of Blockwise
  solves.

Registration. The rewrites carry the tag ``"pmo_structured_linalg"`` (`TAG`). They run in every
``FAST_RUN`` compilation — an early pass before canonicalize (so that ``log(det(A ⊗ B))`` is
taken before PyTensor's ``det(A ⊗ B) = det(A)ᵐ det(B)ⁿ``, which over/underflows), and again in
canonicalize, stabilize and specialize for patterns that appear later — which includes the inner
graphs of the solver Ops (compiled with ``pytensor.function`` in the default mode).
``mode.excluding(TAG)`` turns them all off (the dense reference in tests and benchmarks).
The solvers' graph splitting (``_inner_graph.build_inner_problem``) calls
:func:`structure_linalg` first: it makes the x-independent sub-expressions parameters of the
Op, and without it the parameter would be the dense Cholesky factor of A ⊗ B, computed outside
and handed to every inner iteration as an (N, N) matrix; with it, the parameters are the
factors' Cholesky factors and the inner solves go through them.

Gradients. Compile-time rewrites act after ``pytensor.grad`` has already differentiated the dense
graph: the Cholesky gradient of a Kronecker covariance then still builds an (N, N) cotangent (its
triangular solves go through the factors, O(N^2.5), but the dense O(N²) memory remains).
:func:`structure_linalg` applies the same rewrites to a graph *before* it is differentiated, so
the gradient is taken of the factored graph and never forms an (N, N) matrix. PyMC's MvNormal
log density is passed through it as PyMC builds it: importing pymc_optim wraps PyMC's
``_logprob`` function for ``MvNormalRV``, so ``pm.logp(pm.MvNormal.dist(cov=kron(A, B)), x)``
inside or outside a model, ``model.logp()``, ``compile_logp``, ``compile_dlogp``,
``logp_dlogp_function`` and ``pm.sample`` all differentiate the factored density (measured in
``benchmarks/bench_user_graphs.py``: 900 dimensions, value and gradient, ≥ 20× faster).
A density differentiated densely anyway — ``pm.logp`` of a Kronecker MvNormal built before
``import pymc_optim``, or after ``disable_rewrites`` and compiled with them back on — is caught
at compile time by :func:`kronecker_cholesky_pullback`: the gradient of cholesky(A ⊗ B) with
respect to A and B goes through the factors' Choleskys (no O(N³) step and no solve with N
columns; the (N, N) cotangent of the Cholesky factor, O(N²), remains).

What importing pymc_optim changes for every graph of the process
----------------------------------------------------------------
- PyTensor's ``optdb``: the rewrites above and ``pmo_batched_slogdet`` (stabilize), all tagged
  `TAG`, in the ``fast_run`` passes. Each acts only on a Cholesky, solve, inverse, determinant,
  transpose or product whose matrix is a ``kron`` or ``block_diag`` (or, for
  ``pmo_batched_slogdet``, a batched ``det``): on a graph without them no rewrite of ours
  fires (``tests/test_user_graphs.py`` spies on every rewriter).
- PyMC's logprob database: the same rewrites in the ``cleanup`` pass, and the MvNormal
  ``_logprob`` wrapper (a density without Kronecker or block-diagonal matrices comes back as
  PyMC's very same graph).

``pmo.disable_rewrites()`` (:mod:`pymc_optim.rewrites.switch`) turns both off for the rest of
the process — every rewriter checks the switch when it runs, and PyMC's dispatch gets PyMC's
own MvNormal function back — together with every other change of the import
(``tests/test_side_effects.py`` compares compiled graphs with those of an interpreter that
never imported pymc_optim); ``pmo.enable_rewrites()`` turns them back on;
``mode.excluding(TAG)`` turns off the compile-time part for one function.

Symmetry. Like PyTensor's own lift, the Cholesky rewrites assume that the factors are symmetric
(``cholesky`` reads one triangle; the triangle of A ⊗ B holds entries from both triangles of B).
Triangular solves and the Σ log diag form are rewritten only when the factors are known to be
triangular (outputs of ``cholesky``, their transposes, or tagged ``lower_triangular`` /
``upper_triangular``); block-diagonal matrices need no such condition.

Laplace. For a latent x with prior N(0, Q⁻¹) and likelihood p(y | x, θ), the Laplace Hessian is
H = Q + W with W = −∇²ₓ log p(y | x). Its structure, and what is done with it:

- block-diagonal Q (independent groups of b correlated effects) and a likelihood whose terms
  each depend on one group: W is block-diagonal with the same blocks, so H is block-diagonal.
  ``marginalize_laplace(..., hessian_structure="block_diagonal", block_size=b)`` (or ``"auto"``)
  builds the (G, b, b) blocks with b reverse passes and factors each: O(G b³).
- Kronecker Q = Q_t ⊗ Q_s with a Gaussian likelihood of constant precision τ (W = τI): H is
  not a Kronecker product but shares its eigenvectors, H = (U_t ⊗ U_s)(Λ_t ⊗ Λ_s + τ)(…)ᵀ,
  so log det H = Σ log(λ_t,i λ_s,k + τ) in O(n³ + m³) — the form of PyMC's ``KroneckerNormal``.
  No rewrite recognises Q + τI from a dense graph; the model must say it (KroneckerNormal with
  ``sigma``).
- Kronecker Q with a non-Gaussian element-wise likelihood (Poisson counts on a space–time grid):
  W = diag(w) with w varying by element, and Q + diag(w) is neither a Kronecker product nor
  block-diagonal. Nothing of the product structure survives in H: the Hessian is dense, built
  with N Hessian–vector products and factored in O(N³) (``hessian_structure="dense"``, which is
  what ``"auto"`` detects). What the rewrites still save there is every operation on the prior
  alone: its log-density (log det Q = m log det Q_t + n log det Q_s), the prior's part of the
  gradient and of the Hessian–vector products inside the Newton iterations (solves with the
  Kronecker Cholesky factor by the vec trick), provided the prior's graph is factored before it
  is differentiated (:func:`structure_linalg`). Cheaper exact alternatives exist (conjugate
  gradients on H with Kronecker matrix–vector products and a stochastic or Lanczos log-det) but
  they are approximations of log det H and are not implemented here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.compile.builders import OpFromGraph
from pytensor.configdefaults import config
from pytensor.graph.basic import Variable, equal_computations
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.rewriting.basic import EquilibriumGraphRewriter, dfs_rewriter, node_rewriter
from pytensor.graph.traversal import apply_ancestors
from pytensor.scalar.basic import Abs, Log, Mul, Sign
from pytensor.tensor.basic import ExtractDiag
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.linalg import (
    BlockDiagonal,
    Cholesky,
    CholeskySolve,
    Det,
    KroneckerProduct,
    MatrixInverse,
    SLogDet,
    Solve,
    SolveTriangular,
    block_diag,
)
from pytensor.tensor.math import Dot, Sum
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.subtensor import Subtensor

from pymc_optim.rewrites.switch import enabled, install

__all__ = ["TAG", "structure_linalg"]

#: The tag of every rewrite here: ``get_default_mode().excluding(TAG)`` compiles densely.
TAG = "pmo_structured_linalg"


def structure_linalg(outputs: Variable | Sequence[Variable]):
    """Rewrite `outputs` so that Kronecker and block-diagonal matrices are decomposed through
    their factors, before the graph is differentiated.

    Parameters
    ----------
    outputs : Variable or sequence of Variable
        Left unchanged (the graph is cloned; its inputs are kept).

    Returns
    -------
    outputs : Variable or list of Variable
        Equal in value; take ``pytensor.grad`` of these to get gradients that never form the
        (N, N) matrix.

    Examples
    --------
    >>> import numpy as np, pytensor, pytensor.tensor as pt
    >>> a, b = pt.dmatrix("a"), pt.dmatrix("b")
    >>> L = pt.linalg.cholesky(pt.linalg.kron(a, b))
    >>> [logdet] = structure_linalg([2 * pt.log(pt.diagonal(L)).sum()])
    >>> A, B = np.diag([1.0, 2.0]), np.diag([3.0, 4.0, 5.0])
    >>> bool(np.isclose(logdet.eval({a: A, b: B}), 3 * np.log(2.0) + 2 * np.log(60.0)))
    True
    """
    single = isinstance(outputs, Variable)
    outs = [outputs] if single else list(outputs)
    if not enabled() or not _has_structure(outs):
        return outputs if single else outs  # nothing to factor: the very same variables
    # Random variables and PyMC's model-variable markers must stay the very same objects (a
    # model graph holds one node per variable): they stand aside while the rest is cloned.
    kept = _kept_as_is(outs)
    stand_ins = [v.type() for v in kept]
    cut = graph_replace(outs, dict(zip(kept, stand_ins, strict=True)), strict=False)
    fgraph = FunctionGraph(outputs=cut, clone=True, copy_inputs=False, copy_orphans=False)
    _equilibrium().rewrite(fgraph)
    rewritten = list(fgraph.outputs)
    if kept:
        rewritten = graph_replace(rewritten, dict(zip(stand_ins, kept, strict=True)), strict=False)
    return rewritten[0] if single else list(rewritten)


def _kept_as_is(outputs) -> list[Variable]:
    from pymc.model.fgraph import ModelVar

    kept, seen, stack = [], set(), list(outputs)
    while stack:  # the outermost such variables only (a ModelVar wraps its random variable)
        v = stack.pop()
        if v in seen or v.owner is None:
            continue
        seen.add(v)
        if isinstance(v.owner.op, RandomVariable | ModelVar):
            kept.append(v)
        else:
            stack.extend(v.owner.inputs)
    return kept


def _has_structure(outputs) -> bool:
    return any(
        isinstance(_core_op(node.op), KroneckerProduct | BlockDiagonal)
        for node in apply_ancestors(outputs)
    )


# --- recognising structure --------------------------------------------------------------------


def _core_op(op):
    return op.core_op if isinstance(op, Blockwise) else op


def _kron_factors(x):
    """(A, B) if x = A ⊗ B of two matrices (batched through Blockwise), else None."""
    x = _unspecified(x)
    node = x.owner
    if node is None:
        return None
    if (inner := _padded(x)) is not None:
        factors = _kron_factors(inner)
        k = x.ndim - inner.ndim
        return factors and tuple(pt.expand_dims(f, tuple(range(k))) for f in factors)
    if (inner := _squeezed(x)) is not None:
        factors = _kron_factors(inner)
        k = inner.ndim - x.ndim
        if factors and all(f.ndim == inner.ndim for f in factors):
            return tuple(f[(0,) * k] for f in factors)
        return None
    if isinstance(node.op, KroneckerProduct):
        a, b = node.inputs
        return (a, b) if a.ndim == 2 and b.ndim == 2 else None
    if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Mul) and x.ndim == 2:
        # c (A ⊗ B) = (c A) ⊗ B for a scalar c (a variance times a correlation structure)
        if len(node.inputs) == 2:
            for k, c in (node.inputs, node.inputs[::-1]):
                if all(c.type.broadcastable) and (factors := _kron_factors(k)):
                    return (c * factors[0], factors[1])
    if isinstance(node.op, Blockwise) and isinstance(node.op.core_op, KroneckerProduct):
        return tuple(node.inputs)
    return None


def _blocks(x):
    """[A₁, …, A_k] if x = block_diag(A₁, …, A_k) (batched through Blockwise), else None."""
    x = _unspecified(x)
    node = x.owner
    if node is not None and isinstance(_core_op(node.op), BlockDiagonal):
        return list(node.inputs)
    if (inner := _padded(x)) is not None:
        blocks = _blocks(inner)
        k = x.ndim - inner.ndim
        return blocks and [pt.expand_dims(blk, tuple(range(k))) for blk in blocks]
    return None


def _unspecified(x):
    """x without the SpecifyShape wrappers that replacements put on it, nor ``x[()]``."""
    while x.owner is not None and (
        isinstance(x.owner.op, SpecifyShape)
        or (isinstance(x.owner.op, Subtensor) and not x.owner.op.idx_list)
    ):
        x = x.owner.inputs[0]
    return x


def _dimshuffle(x):
    """(y, new_order) if x (under any specify_shape) is a DimShuffle of y, else (None, ())."""
    node = _unspecified(x).owner
    if node is None or not isinstance(node.op, DimShuffle):
        return None, ()
    return node.inputs[0], tuple(node.op.new_order)


def _squeezed(x):
    """y if x is y without some leading broadcastable axes (a Blockwise gradient's squeeze, or
    ``y[0, …, 0]`` of a padded y, as batched factors are indexed back)."""
    node = _unspecified(x).owner
    if node is not None and isinstance(node.op, Subtensor):
        y = node.inputs[0]
        k = y.ndim - x.ndim
        scalar = all(not isinstance(i, slice) for i in node.op.idx_list)
        if k > 0 and scalar and len(node.op.idx_list) == k and all(y.type.broadcastable[:k]):
            return y
        return None
    y, order = _dimshuffle(x)
    if y is None:
        return None
    k = y.ndim - x.ndim
    if k > 0 and order == tuple(range(k, y.ndim)) and all(y.type.broadcastable[:k]):
        return y
    return None


def _padded(x):
    """y if x is y with new leading broadcastable axes (how Blockwise batches a core input)."""
    y, order = _dimshuffle(x)
    if y is None:
        return None
    k = x.ndim - y.ndim
    return y if k > 0 and order == (*("x",) * k, *range(y.ndim)) else None


def _transposed(x):
    """y if x = yᵀ (a swap of the last two axes and nothing else), else None."""
    y, order = _dimshuffle(x)
    if y is None or y.ndim < 2:
        return None
    nd = y.ndim
    return y if order == (*range(nd - 2), nd - 1, nd - 2) else None


def _is_triangular(x, lower: bool) -> bool:
    """Whether x is known to be lower (upper) triangular from how it was made."""
    x = _unspecified(x)
    if getattr(x.tag, "lower_triangular" if lower else "upper_triangular", False):
        return True
    if x.owner is None:
        return False
    op = _core_op(x.owner.op)
    if isinstance(op, Cholesky):
        return op.lower == lower
    if (y := _transposed(x)) is not None:
        return _is_triangular(y, not lower)
    if (y := _padded(x)) is not None or (y := _squeezed(x)) is not None:
        return _is_triangular(y, lower)
    parts = _kron_factors(x) or _blocks(x)
    return bool(parts) and all(_is_triangular(p, lower) for p in parts)


def _cholesky_factor(x) -> bool:
    """Whether x is a Cholesky factor (triangular with a positive, or NaN, diagonal)."""
    x = _unspecified(x)
    if x.owner is None:
        return False
    if isinstance(_core_op(x.owner.op), Cholesky):
        return True
    if any((y := f(x)) is not None for f in (_transposed, _padded, _squeezed)):
        return _cholesky_factor(y)
    parts = _kron_factors(x) or _blocks(x)
    return bool(parts) and all(_cholesky_factor(p) for p in parts)


def _same_block_shape(blocks) -> int | None:
    """The common static size s of (…, s, s) blocks with one batch layout, if there is one."""
    sizes = {blk.type.shape[-1] for blk in blocks} | {blk.type.shape[-2] for blk in blocks}
    layouts = {blk.type.broadcastable[:-2] for blk in blocks}
    if len(blocks) > 1 and len(sizes) == 1 and None not in sizes and len(layouts) == 1:
        return sizes.pop()
    return None


# --- structured forms (None when x has no structure) ------------------------------------------


def _structured_cholesky(x, lower: bool):
    if factors := _kron_factors(x):
        return _kron(*(_cholesky(f, lower) for f in factors))
    if blocks := _blocks(x):
        if _stackable(blocks):
            # One batched Cholesky of the stacked blocks, cut back into blocks: the solves and
            # the log-determinant below take the stack itself (`_stacked`), so the graph, and
            # the gradient taken of it, hold one batched Op per step instead of one per block.
            L = Blockwise(_MaskedCholesky(lower=lower))(pt.stack(blocks, axis=0))
            return block_diag(*(L[i] for i in range(len(blocks))))
        return block_diag(*(_cholesky(blk, lower) for blk in blocks))
    return None


class _MaskedCholesky(Cholesky):
    """PyTensor's Cholesky with the same reverse-mode gradient (Murray 2016, arXiv:1602.07527),
    written with triangular and diagonal masks instead of ``diag(diagonal(·))``.

    Batched by Blockwise (the stacked blocks of a block-diagonal matrix), PyTensor's gradient
    vectorizes each ``diag(diagonal(·))`` into a Python loop of AllocDiag, one call per block
    (measured: a third of the value-and-gradient time of a 30-block MvNormal); masks vectorize
    into Elemwise products.
    """

    def pullback(self, inputs, outputs, gradients):
        [dz] = gradients
        [L] = outputs
        if not self.lower:
            L, dz = L.T, dz.T
        n = L.shape[-1]
        eye = pt.eye(n, dtype=L.dtype)
        lower = pt.tri(n, dtype=L.dtype)
        P = L.T @ dz
        phi = P * lower - 0.5 * P * eye  # the lower triangle, its diagonal halved
        upper_solve = SolveTriangular(lower=False, b_ndim=2)
        S = upper_solve(L.T, upper_solve(L.T, phi.T).T)  # L⁻ᵀ Φ L⁻¹
        mask = lower if self.lower else lower.T
        return [(S + S.T) * mask - S * eye]


def _stackable(blocks) -> bool:
    """Unbatched blocks of one static size that have no structure of their own (a Kronecker
    block keeps its factored Cholesky)."""
    return (
        _same_block_shape(blocks) is not None
        and all(blk.ndim == 2 for blk in blocks)
        and not any(_kron_factors(blk) or _blocks(blk) for blk in blocks)
    )


def _stacked(blocks):
    """The (…, k, s, s) stack of equal blocks: the tensor they were cut from when they are
    ``S[0], …, S[k−1]`` of one (k, s, s) S (or their transposes), else a new stack."""
    if (base := _cut_from(blocks)) is not None:
        return base
    transposed = [_transposed(blk) for blk in blocks]
    if all(t is not None for t in transposed) and (base := _cut_from(transposed)) is not None:
        return base.mT
    return pt.stack(blocks, axis=-3)


def _cut_from(blocks):
    """S if `blocks` are S[0], …, S[k−1] of one (k, s, s) tensor S, else None."""
    base = None
    for i, blk in enumerate(blocks):
        node = _unspecified(blk).owner
        if node is None or not isinstance(node.op, Subtensor) or len(node.op.idx_list) != 1:
            return None
        if isinstance(node.op.idx_list[0], slice):
            return None
        source, index = node.inputs
        if base is None:
            base = source
        if source is not base or source.ndim != 3 or source.type.shape[0] != len(blocks):
            return None
        try:
            if int(pt.get_underlying_scalar_constant_value(index)) != i:
                return None
        except NotScalarConstantError:
            return None
    return base


def _cholesky(x, lower):
    structured = _structured_cholesky(x, lower)
    return pt.linalg.cholesky(x, lower=lower) if structured is None else structured


def _kron_solve(a, b, rhs, b_ndim, solve_factor):
    """Solve (a ⊗ b) x = rhs with two factor solves: X = a⁻¹ Y b⁻ᵀ on the (n, m) reshapes.

    With ``solve_factor = matmul`` the same steps give the product (a ⊗ b) rhs = vec(a Y bᵀ)."""
    n, m = a.shape[-1], b.shape[-1]
    y = rhs[..., None] if b_ndim == 1 else rhs
    if all(all(f.type.broadcastable[:-2]) for f in (a, b)):
        a, b = (f[(0,) * (f.ndim - 2)] for f in (a, b))  # batch axes of length 1 only: drop them
    if a.ndim == 2 and b.ndim == 2 and y.ndim > 2:
        # Unbatched factors, batched right-hand sides (e.g. a vectorized Jacobian): the batch
        # becomes more columns of one solve, not a Python loop of Blockwise solves.
        k = y.ndim - 2
        shape = [y.shape[i] for i in (k, k + 1, *range(k))]  # (N, c, *batch)
        columns = y.transpose(k, k + 1, *range(k)).reshape((shape[0], -1))
        x = _kron_solve(a, b, columns, 2, solve_factor)
        x = x.reshape(shape).transpose(*range(2, k + 2), 0, 1)
        return x[..., 0] if b_ndim == 1 else x
    c = y.shape[-1]
    z = solve_factor(a, y.reshape((*_batch(y, 2), n, m * c)))  # a⁻¹ along the n axis
    z = z.reshape((*_batch(z, 2), n, m, c))
    k = z.ndim - 3
    z = z.transpose(*range(k), k + 1, k, k + 2)  # (…, m, n, c)
    w = solve_factor(b, z.reshape((*_batch(z, 3), m, n * c)))  # b⁻¹ along the m axis
    w = w.reshape((*_batch(w, 2), m, n, c))
    k = w.ndim - 3
    x = w.transpose(*range(k), k + 1, k, k + 2).reshape((*_batch(w, 3), n * m, c))
    return x[..., 0] if b_ndim == 1 else x


def _block_solve(blocks, rhs, b_ndim, solve_block):
    """Solve block_diag(blocks) x = rhs block by block (one batched solve for equal blocks)."""
    y = rhs[..., None] if b_ndim == 1 else rhs
    s = _same_block_shape(blocks)
    if s is not None:
        k = len(blocks)
        stacked = _stacked(blocks)  # (…, k, s, s)
        x = solve_block(stacked, y.reshape((*_batch(y, 2), k, s, y.shape[-1])))
        x = x.reshape((*_batch(x, 3), k * s, x.shape[-1]))
    else:
        pieces, start = [], 0
        for blk in blocks:
            size = blk.shape[-1]
            pieces.append(solve_block(blk, y[..., start : start + size, :]))
            start = start + size
        x = pt.concatenate(pieces, axis=-2)
    return x[..., 0] if b_ndim == 1 else x


def _structured_slogdet(x):
    """(sign, log|det x|) through the factors of x, or None."""
    if factors := _kron_factors(x):
        (sa, la), (sb, lb) = (_slogdet(f) for f in factors)
        n, m = (f.shape[-1].astype(la.dtype) for f in factors)
        return sa**m * sb**n, m * la + n * lb
    if blocks := _blocks(x):
        parts = [_slogdet(blk) for blk in blocks]
        return pt.mul(*(p[0] for p in parts)), pt.add(*(p[1] for p in parts))
    return None


def _slogdet(x):
    structured = _structured_slogdet(x)
    # pt.linalg.slogdet is the differentiable sign(det), log|det| pair; compiled, it becomes
    # SLogDet (PyTensor's specialization, or ours below for batched matrices).
    return pt.linalg.slogdet(x) if structured is None else structured


def _structured_sum_log_diag(x):
    """Σ log diag(x) over the last axis through the factors of x, or None.

    For x = P ⊗ Q, diag x = diag P ⊗ diag Q, so Σ log diag x = m Σ log diag P + n Σ log diag Q —
    equal only where diag P, diag Q > 0: taken only when P and Q are Cholesky factors (a failed
    factor is NaN either way). For block-diagonal x, the sum of the blocks' sums (always)."""
    if x.owner is not None and isinstance(op := _core_op(x.owner.op), Cholesky):
        structured = _structured_cholesky(x.owner.inputs[0], op.lower)
        return None if structured is None else _sum_log_diag(structured)
    if (y := _transposed(x)) is not None:
        return _structured_sum_log_diag(y)
    if (factors := _kron_factors(x)) and all(_cholesky_factor(f) for f in factors):
        sp, sq = (_sum_log_diag(f) for f in factors)
        n, m = (f.shape[-1].astype(sp.dtype) for f in factors)
        return m * sp + n * sq
    if blocks := _blocks(x):
        if (base := _cut_from(blocks)) is not None:
            # the diagonal as a masked sum: its gradient is Elemwise, where the gradient of
            # ExtractDiag on a stack is a Python loop of AllocDiag
            diagonal = (base * pt.eye(base.shape[-1], dtype=base.dtype)).sum(axis=-1)
            return pt.log(diagonal).sum()
        return pt.add(*(_sum_log_diag(blk) for blk in blocks))
    return None


def _sum_log_diag(x):
    structured = _structured_sum_log_diag(x)
    if structured is None:
        return pt.log(pt.diagonal(x, axis1=-2, axis2=-1)).sum(axis=-1)
    return structured


def _kron(a, b):
    """The Kronecker product of the last two axes of a and b, batched over the others
    (``pt.linalg.kron`` of 3-d tensors is the 3-d Kronecker product, not a batch of them)."""
    if a.ndim == 2 and b.ndim == 2:
        return pt.linalg.kron(a, b)
    a_core, b_core = pt.matrix(dtype=a.dtype), pt.matrix(dtype=b.dtype)
    return vectorize_graph(pt.linalg.kron(a_core, b_core), {a_core: a, b_core: b})


def _batch(x, core_ndim):
    return [x.shape[i] for i in range(x.ndim - core_ndim)]


def _like(old, new):
    """`new` with `old`'s dtype and static shape, so that it can replace `old`."""
    new = pt.as_tensor_variable(new)
    if new.dtype != old.dtype:
        new = new.astype(old.dtype)
    if new.ndim != old.ndim:
        new = pt.broadcast_to(new, old.shape)
    if not old.type.is_super(new.type):
        new = pt.specify_shape(new, old.type.shape)
    return new


# --- node rewriters ---------------------------------------------------------------------------


@node_rewriter([Cholesky, Blockwise])
def structured_cholesky(fgraph, node):
    """cholesky(A ⊗ B) = cholesky(A) ⊗ cholesky(B); cholesky(block_diag(Aᵢ)) =
    block_diag(cholesky(Aᵢ))."""
    if not enabled():
        return None
    op = _core_op(node.op)
    if not isinstance(op, Cholesky):
        return None
    new = _structured_cholesky(node.inputs[0], op.lower)
    return None if new is None else [_like(node.outputs[0], new)]


@node_rewriter([SolveTriangular, Solve, CholeskySolve, Blockwise])
def structured_solve(fgraph, node):
    """solve(A ⊗ B, b) by the vec trick; solve(block_diag(Aᵢ), b) block by block."""
    if not enabled():
        return None
    op = _core_op(node.op)
    if not isinstance(op, SolveTriangular | Solve | CholeskySolve):
        return None
    a, rhs = node.inputs
    b_ndim = op.b_ndim
    if isinstance(op, SolveTriangular):
        factor_solve = lambda f, r: pt.linalg.solve_triangular(  # noqa: E731
            f, r, lower=op.lower, unit_diagonal=op.unit_diagonal, b_ndim=2
        )
    elif isinstance(op, CholeskySolve):
        factor_solve = lambda f, r: pt.linalg.cho_solve((f, op.lower), r, b_ndim=2)  # noqa: E731
    else:
        factor_solve = lambda f, r: pt.linalg.solve(  # noqa: E731
            f, r, assume_a=op.assume_a, lower=op.lower, b_ndim=2
        )

    if factors := _kron_factors(a):
        if isinstance(op, SolveTriangular | CholeskySolve):
            # tril(A ⊗ B) is the product of the factors' triangles only when they are triangular;
            # a unit diagonal of A ⊗ B does not make the factors' diagonals one.
            if getattr(op, "unit_diagonal", False):
                return None
            if not all(_is_triangular(f, op.lower) for f in factors):
                return None
        else:
            # A ⊗ B symmetric (positive definite) does not make A and B so (take −A ⊗ −B);
            # the factors are small, a general LU costs little.
            factor_solve = lambda f, r: pt.linalg.solve(f, r, assume_a="gen", b_ndim=2)  # noqa: E731
        new = _kron_solve(*factors, rhs, b_ndim, factor_solve)
    elif blocks := _blocks(a):
        # Diagonal blocks of a triangular / symmetric / positive definite matrix are so too.
        new = _block_solve(blocks, rhs, b_ndim, factor_solve)
    else:
        return None
    return [_like(node.outputs[0], new)]


@node_rewriter([SLogDet, Blockwise])
def structured_slogdet(fgraph, node):
    """slogdet(A ⊗ B) = (sign(A)ᵐ sign(B)ⁿ, m log|A| + n log|B|); slogdet(block_diag(Aᵢ)) =
    (Π sign(Aᵢ), Σ log|Aᵢ|)."""
    if not enabled():
        return None
    if not isinstance(_core_op(node.op), SLogDet):
        return None
    new = _structured_slogdet(node.inputs[0])
    if new is None:
        return None
    return [_like(old, v) for old, v in zip(node.outputs, new, strict=True)]


def _det_input(var):
    """x if var = det(x), else None."""
    if var.owner is not None and isinstance(_core_op(var.owner.op), Det):
        return var.owner.inputs[0]
    return None


def _scalar_op(node):
    return node.op.scalar_op if isinstance(node.op, Elemwise) else None


@node_rewriter([Elemwise])
def structured_log_det(fgraph, node):
    """log(det(x)), log(abs(det(x))) and sign(det(x)) of a Kronecker or block-diagonal x
    through the factors' log-determinants."""
    if not enabled():
        return None
    scalar_op = _scalar_op(node)
    if isinstance(scalar_op, Log):
        [inner] = node.inputs
        if inner.owner is not None and isinstance(_scalar_op(inner.owner), Abs):
            x, want = _det_input(inner.owner.inputs[0]), "log_abs"
        else:
            x, want = _det_input(inner), "log"
    elif isinstance(scalar_op, Sign):
        x, want = _det_input(node.inputs[0]), "sign"
    else:
        return None
    if x is None or (pair := _structured_slogdet(x)) is None:
        return None
    sign, logabs = pair
    # log det of a matrix with negative determinant is NaN, as for the dense log(det(x)).
    new = {"sign": sign, "log_abs": logabs, "log": pt.where(pt.eq(sign, -1), np.nan, logabs)}
    return [_like(node.outputs[0], new[want])]


@node_rewriter([Sum])
def structured_sum_log_diag(fgraph, node):
    """Σ log diag(L) over the last axis of a Kronecker / block-diagonal Cholesky factor L
    (the log-determinant as PyMC's MvNormal writes it) through the factors."""
    if not enabled():
        return None
    [logs] = node.inputs
    if logs.owner is None or not isinstance(_scalar_op(logs.owner), Log):
        return None
    [diag] = logs.owner.inputs
    if diag.owner is None or not isinstance(diag.owner.op, ExtractDiag):
        return None
    op = diag.owner.op
    [x] = diag.owner.inputs
    if op.offset != 0 or {op.axis1, op.axis2} != {x.ndim - 2, x.ndim - 1}:
        return None
    axes = tuple(range(diag.ndim)) if node.op.axis is None else tuple(node.op.axis)
    if diag.ndim - 1 not in axes:
        return None
    new = _structured_sum_log_diag(x)
    if new is None:
        return None
    if other := tuple(a for a in axes if a != diag.ndim - 1):
        new = pt.broadcast_to(new, x.shape[:-2]).sum(axis=other)
    return [_like(node.outputs[0], new)]


@node_rewriter([DimShuffle])
def structured_transpose(fgraph, node):
    """(A ⊗ B)ᵀ = Aᵀ ⊗ Bᵀ; block_diag(Aᵢ)ᵀ = block_diag(Aᵢᵀ)."""
    if not enabled():
        return None
    y = _transposed(node.outputs[0])
    if y is None:
        return None
    if factors := _kron_factors(y):
        return [_like(node.outputs[0], _kron(*(f.mT for f in factors)))]
    if blocks := _blocks(y):
        return [_like(node.outputs[0], block_diag(*(blk.mT for blk in blocks)))]
    return None


@node_rewriter([Dot, Blockwise])
def structured_matmul(fgraph, node):
    """(A ⊗ B) M = vec(A X Bᵀ) column by column, and M (A ⊗ B) = ((Aᵀ ⊗ Bᵀ) Mᵀ)ᵀ: O(N(n + m))
    per column instead of O(N²) (the gradient of a Cholesky multiplies by Lᵀ)."""
    if not enabled():
        return None
    if not isinstance(_core_op(node.op), Dot) or any(i.ndim < 2 for i in node.inputs):
        return None
    left, right = node.inputs
    times = lambda f, r: f @ r  # noqa: E731
    left_factors, right_factors = _kron_factors_of(left), _kron_factors_of(right)
    if left_factors and right_factors and _conformable(left_factors, right_factors):
        # the mixed product (A ⊗ B)(C ⊗ D) = AC ⊗ BD, e.g. PyMC's cov = chol cholᵀ
        (a, b), (c, d) = left_factors, right_factors
        return [_like(node.outputs[0], _kron(a @ c, b @ d))]
    if factors := left_factors:
        new = _kron_solve(*factors, right, 2, times)
    elif factors := right_factors:
        new = _kron_solve(*(f.mT for f in factors), left.mT, 2, times).mT
    else:
        return None
    return [_like(node.outputs[0], new)]


def _kron_factors_of(x):
    """The factors of x = A ⊗ B or of x = (A ⊗ B)ᵀ = Aᵀ ⊗ Bᵀ (PyMC's chol cholᵀ)."""
    if factors := _kron_factors(x):
        return factors
    if (y := _transposed(x)) is not None and (factors := _kron_factors(y)):
        return tuple(f.mT for f in factors)
    return None


def _conformable(left_factors, right_factors) -> bool:
    """Whether A C and B D exist for (A ⊗ B)(C ⊗ D), from the static shapes."""
    return all(
        f.type.shape[-1] is not None and f.type.shape[-1] == g.type.shape[-2]
        for f, g in zip(left_factors, right_factors, strict=True)
    )


@node_rewriter([MatrixInverse, Blockwise])
def structured_inverse(fgraph, node):
    """(A ⊗ B)⁻¹ = A⁻¹ ⊗ B⁻¹; block_diag(Aᵢ)⁻¹ = block_diag(Aᵢ⁻¹) (PyMC's MvNormal with
    ``tau=`` inverts the precision)."""
    if not enabled() or not isinstance(_core_op(node.op), MatrixInverse):
        return None
    [x] = node.inputs
    if factors := _kron_factors(x):
        return [_like(node.outputs[0], _kron(*(pt.linalg.inv(f) for f in factors)))]
    if blocks := _blocks(x):
        return [_like(node.outputs[0], block_diag(*(pt.linalg.inv(blk) for blk in blocks)))]
    return None


@node_rewriter([Blockwise])
def one_matrix_many_columns(fgraph, node):
    """A batch of solves with one matrix (batch axes of A of length 1) and a batch of right-hand
    sides is one solve with more columns: ``solve(A, B[i])`` for all i = ``solve(A, [B[0] …])``.

    A vectorized Jacobian (the Laplace Hessian, the Newton system) solves with the prior's
    Cholesky factor once per direction; as a Blockwise that is a Python loop of small solves."""
    if not enabled():
        return None
    op = node.op.core_op
    if not isinstance(op, SolveTriangular | Solve | CholeskySolve) or op.b_ndim != 2:
        return None
    a, rhs = node.inputs
    k = rhs.ndim - 2
    if k == 0 or not all(a.type.broadcastable[:-2]):
        return None
    core_a = a[(0,) * (a.ndim - 2)]
    shape = [rhs.shape[i] for i in (k, k + 1, *range(k))]  # (m, c, *batch)
    columns = rhs.transpose(k, k + 1, *range(k)).reshape((shape[0], -1))
    x = op(core_a, columns)
    new = x.reshape(shape).transpose(*range(2, k + 2), 0, 1)
    return [_like(node.outputs[0], new)]


@node_rewriter([Blockwise])
def batched_slogdet(fgraph, node):
    """log|det|, log det and sign(det) of a batch of matrices with one batched SLogDet.

    PyTensor 2.38's ``slogdet_specialization`` builds ``SLogDet`` (core, 2-D only) for any
    ``det`` and fails on a batch; this runs first (stabilize) and leaves ``det`` to its other
    clients (e.g. a gradient)."""
    if not enabled():
        return None
    if not (isinstance(node.op.core_op, Det) and node.inputs[0].ndim > 2):
        return None
    [det_out] = node.outputs
    sign = logabs = None
    replacements = {}
    for client, _ in fgraph.clients[det_out]:
        if not isinstance(client.op, Elemwise):
            continue
        scalar_op = client.op.scalar_op
        if sign is None and isinstance(scalar_op, Log | Abs | Sign):
            sign, logabs = Blockwise(SLogDet())(node.inputs[0])
        if isinstance(scalar_op, Sign):
            replacements[client.outputs[0]] = sign
        elif isinstance(scalar_op, Log):
            replacements[client.outputs[0]] = pt.where(pt.eq(sign, -1), np.nan, logabs)
        elif isinstance(scalar_op, Abs):
            for client2, _ in fgraph.clients[client.outputs[0]]:
                if isinstance(client2.op, Elemwise) and isinstance(client2.op.scalar_op, Log):
                    replacements[client2.outputs[0]] = logabs
    return {old: _like(old, new) for old, new in replacements.items()} or None


@node_rewriter([ExtractDiag])
def structured_diagonal(fgraph, node):
    """diag(A ⊗ B) = diag A ⊗ diag B; diag(block_diag(Aᵢ)) = [diag A₁, …] (PyMC's
    positive-definiteness check reads the Cholesky factor's diagonal)."""
    if not enabled():
        return None
    op = node.op
    [x] = node.inputs
    if op.offset != 0 or x.ndim != 2:
        return None
    if factors := _kron_factors(x):
        a, b = (pt.diagonal(f) for f in factors)
        return [_like(node.outputs[0], pt.outer(a, b).ravel())]
    if blocks := _blocks(x):
        if all(blk.ndim == 2 for blk in blocks):
            return [_like(node.outputs[0], pt.concatenate([pt.diagonal(b) for b in blocks]))]
    return None


@node_rewriter([OpFromGraph])
def kronecker_cholesky_pullback(fgraph, node):
    """The gradient of cholesky(A ⊗ B) with respect to A and B through the factors.

    ``pt.grad`` of a density written with L = cholesky(A ⊗ B) — PyMC's MvNormal log density
    built before ``import pymc_optim`` — pulls the cotangent L̄ back through the dense Cholesky
    (O(N³)) to an (N, N) cotangent of A ⊗ B, then through ``kron`` to Ā and B̄. Since
    cholesky(A ⊗ B) = cholesky(A) ⊗ cholesky(B) for symmetric A and B, the same Ā and B̄ (in
    symmetric directions, as for the structured rewrites above) are L̄ pulled back through
    ``kron`` of the factors' Cholesky factors and then through the two small Choleskys. The
    dense pullback is recognised by rebuilding PyTensor's own (``L_op``) from L and each
    candidate L̄ and comparing graphs, so the rewrite runs before any other rewrite changes
    them."""
    if not enabled():
        return None
    *_, kron_out, cotangent = node.inputs if len(node.inputs) == 4 else (None, None)
    if kron_out is None or kron_out.owner is None:
        return None
    kron_node = kron_out.owner
    if not isinstance(kron_node.op, KroneckerProduct) or len(kron_node.inputs) != 2:
        return None
    a, b = kron_node.inputs
    if a.ndim != 2 or b.ndim != 2 or list(node.inputs[:2]) != [a, b]:
        return None
    if kron_node.op.L_op([a, b], [kron_out], [cotangent])[0].owner.op != node.op:
        return None  # not kron's pullback
    dz = _cholesky_cotangent(fgraph, kron_out, cotangent)
    if dz is None:
        return None
    factors = [pt.linalg.cholesky(f) for f in (a, b)]
    kron_of_factors = pt.linalg.kron(*factors)
    factor_cotangents = kron_of_factors.owner.op.L_op(factors, [kron_of_factors], [dz])
    grads = [
        f.owner.op.L_op([m], [f], [g])[0]
        for m, f, g in zip((a, b), factors, factor_cotangents, strict=True)
    ]
    return [_like(old, new) for old, new in zip(node.outputs, grads, strict=True)]


def _cholesky_cotangent(fgraph, x, cotangent):
    """L̄ if `cotangent` is PyTensor's pullback of L̄ through L = cholesky(x) (lower), else
    None. Each product Lᵀ M in the graph proposes its M (the pullback's first step is Lᵀ L̄)."""
    for chol_node, _ in fgraph.clients[x]:
        op = _core_op(chol_node.op)
        if not isinstance(op, Cholesky) or not op.lower:
            continue
        [L] = chol_node.outputs
        for transpose, _ in fgraph.clients[L]:
            if not (isinstance(transpose.op, DimShuffle) and transpose.op.is_matrix_transpose):
                continue
            for product, position in fgraph.clients[transpose.outputs[0]]:
                if position != 0 or len(product.inputs) != 2:
                    continue
                candidate = product.inputs[1]
                if candidate.type.ndim != 2:
                    continue
                rebuilt = chol_node.op.L_op(chol_node.inputs, chol_node.outputs, [candidate])[0]
                if equal_computations([rebuilt], [cotangent]):
                    return candidate
    return None


_REWRITERS = (
    structured_diagonal,
    structured_cholesky,
    structured_solve,
    structured_slogdet,
    structured_log_det,
    structured_sum_log_diag,
    structured_transpose,
    structured_matmul,
    structured_inverse,
    one_matrix_many_columns,
)


def _equilibrium():
    return EquilibriumGraphRewriter(_REWRITERS, max_use_ratio=config.optdb__max_use_ratio)


def _register():
    # Before canonicalize: log(det(A ⊗ B)) must be taken before PyTensor turns det(A ⊗ B) into
    # det(A)^m det(B)^n, and Σ log diag(cholesky(A ⊗ B)) before diag(A ⊗ B) becomes an outer.
    optdb.register(f"{TAG}_early", _equilibrium(), "fast_run", TAG, position=0.95)
    # Right after the first merge: the dense Cholesky pullback is recognised as PyTensor wrote
    # it, before "useless" (0.6) or our early pass change it.
    optdb.register(
        f"{TAG}_cholesky_pullback",
        dfs_rewriter(kronecker_cholesky_pullback, ignore_newtrees=True),
        "fast_run",
        TAG,
        position=0.05,
    )
    for phase in ("canonicalize", "stabilize", "specialize"):
        for rewriter in _REWRITERS:
            optdb[phase].register(f"{TAG}_{rewriter.__name__}", rewriter, "fast_run", TAG)
    # A fix of PyTensor, needed by the rewrites (batched factors) but not one of them.
    optdb["stabilize"].register("pmo_batched_slogdet", batched_slogdet, "fast_run", TAG)
    # model.logp(): every PyMC log density is factored before anyone differentiates it.
    from pymc.logprob.rewriting import logprob_rewrites_db

    logprob_rewrites_db.register(f"{TAG}_logp", _equilibrium(), "cleanup", TAG, position=6)
    _factor_pymc_log_densities()


def _factor_pymc_log_densities():
    """PyMC's MvNormal log density, factored as soon as PyMC builds it.

    ``pm.logp(pm.MvNormal.dist(cov=kron(A, B)), x)`` (inside a model or not), ``model.logp()``
    and so ``compile_logp``, ``compile_dlogp``, ``logp_dlogp_function`` and ``pm.sample`` all
    derive the density through PyMC's ``_logprob`` dispatch; wrapping PyMC's own MvNormal
    function there makes the returned graph pass through :func:`structure_linalg` before anyone
    differentiates it (compile-time rewrites alone act after ``pytensor.grad`` and leave the
    dense (N, N) Cholesky gradient in place). A graph without Kronecker or block-diagonal
    matrices comes back as the very same variables. Installed through the switch: after
    :func:`~pymc_optim.rewrites.switch.disable_rewrites` PyMC's dispatch holds PyMC's function."""
    from pymc.distributions.multivariate import MvNormalRV
    from pymc.logprob.abstract import _logprob

    pymc_logp = _logprob.dispatch(MvNormalRV)
    if getattr(pymc_logp, "_pmo_factored", False):
        return  # already wrapped (the module was reloaded)

    def factored_logp(op, values, *inputs, **kwargs):
        return structure_linalg(pymc_logp(op, values, *inputs, **kwargs))

    factored_logp._pmo_factored = True
    install(
        lambda: _logprob.register(MvNormalRV)(factored_logp),
        lambda: _logprob.register(MvNormalRV)(pymc_logp),
    )


_register()
