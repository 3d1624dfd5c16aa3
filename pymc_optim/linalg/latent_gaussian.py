"""H = Q(θ) + W(x, θ): a Gaussian latent's prior precision plus the likelihood's curvature.

For a latent x with a Gaussian prior and observations whose log density is a sum of terms of
single elements of x (an element-wise likelihood of a linear predictor), the Hessian of
−log p(y, x | θ) is

    H = Q + W,   Q = the prior precision (constant in x),   W = diag(w(x, θ)),

so building H needs Q once per evaluation and w by one reverse pass, never the n reverse passes
of a general dense Hessian. Two forms, as in Rasmussen & Williams (2006, Alg. 3.1–3.2) and Stan's
embedded Laplace:

* ``"precision"``: Q is read off the prior (ICAR, CAR, AR(1), random walk, MvNormal with
  ``tau``): A = Q + diag(w) is formed densely and factorized by Cholesky.
  With ``basis=True`` the likelihood is element-wise in a linear predictor η = c + B x (an
  HSGP's basis, a design matrix) and its curvature part is the matrix Bᵀ diag(w) B.
* ``"covariance"``: the prior gives a covariance K (MvNormal with ``cov`` or ``chol``, a GP): K
  is never inverted. With S = W^½ and B = I + S K S (eigenvalues ≥ 1 whatever K's condition),

      (K⁻¹ + W)⁻¹ r = K r − K S B⁻¹ S K r,     log det(K⁻¹ + W) = log det B − log det K.

  This needs w ≥ 0 (a log-concave likelihood: Poisson, binomial, Gaussian);
  ``marginalize_laplace`` checks it at random points when choosing the form. The positive
  definiteness test and the draws use M = I + L_Kᵀ W L_K (K = L_K L_Kᵀ), which needs no sign
  of w: K⁻¹ + W = L_K⁻ᵀ M L_K⁻¹, and a draw of N(m, (K⁻¹ + W)⁻¹) is m + L_K L_M⁻ᵀ ε. The compact
  A is the (n + 1, n) array [K; wᵀ].

The covariance form's Laplace marginal (``marginalize_laplace``) factorizes B alone: its
Newton condition is G(z) = (z − μ) + K ∇(−log p(y | z)) = 0, whose Jacobian I + K W has the
same compact parts (`CovarianceConditionStructure`), and at the mode K⁻¹(z − μ) is the
likelihood's gradient. Two pieces with hand-written gradients keep that factorization single
and Cholesky gradients out of the graph: `logdet_b` (log det B, with ∂/∂K = W^½ B⁻¹ W^½ and
∂/∂w = diag((K⁻¹ + W)⁻¹) from B's factor) and `BCholesky` (B's factor from (K, w) in one Op,
shared by the log-determinant, its gradient and the implicit pullback's solve). K's factor
is needed only for latent draws (`sample_gaussian`). `covariance_solve` (K⁻¹ b differentiated
through K alone) is for graphs that do need K⁻¹. The Newton loop's numpy path calls LAPACK
directly.

The structure's `jacobian` builds A from two parts of the optimality condition
(``OptimalityCondition.parts``): the prior matrix (Q or K) and w, written on the solver's inner
variables; the residual F itself is not differentiated.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.compile.builders import OpFromGraph
from pytensor.conditional.op import ifelse
from pytensor.gradient import DisconnectedType, grad
from pytensor.graph.basic import Apply, Constant
from pytensor.graph.features import ReplaceValidate
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import GraphRewriter
from pytensor.graph.utils import InconsistencyError
from pytensor.tensor.basic import Join
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.linalg import Cholesky
from pytensor.tensor.variable import TensorVariable
from scipy.linalg import lapack, solve_triangular

from pymc_optim.linalg.structure import LinearStructure, _finite

__all__ = [
    "FORMS",
    "CovarianceConditionStructure",
    "LatentGaussianStructure",
    "covariance_solve",
    "logdet_b",
]

FORMS = ("precision", "covariance")

_potrf, _potrs, _potri = lapack.dpotrf, lapack.dpotrs, lapack.dpotri


@dataclass(frozen=True)
class LatentGaussianStructure(LinearStructure):
    """A = Q + diag(w) (``form="precision"``) or K⁻¹ + diag(w) with K kept (``"covariance"``).

    Parameters
    ----------
    form : {"precision", "covariance"}
        Whether the prior matrix part of A is the precision Q or the covariance K.
    basis : bool, default False
        With ``form="precision"``: the likelihood is element-wise in a linear predictor
        η = c + B x (a basis expansion, a design matrix), so its curvature part is the matrix
        Bᵀ diag(w) B, built by the caller, and A = Q + Bᵀ diag(w) B.

    Examples
    --------
    A covariance-form system solved without inverting K, against the dense (K⁻¹ + W)⁻¹ r:

    >>> import numpy as np
    >>> from pymc_optim.linalg.latent_gaussian import LatentGaussianStructure
    >>> K = np.array([[2.0, 0.5], [0.5, 1.0]]); w = np.array([0.3, 1.2]); r = np.array([1.0, -1.0])
    >>> structure = LatentGaussianStructure(form="covariance")
    >>> y = structure.solve_numpy(np.vstack([K, w]), r)
    >>> bool(np.allclose(y, np.linalg.solve(np.linalg.inv(K) + np.diag(w), r)))
    True
    """

    kind: str = "latent_gaussian"
    block_size: int | None = None
    form: str = "precision"
    basis: bool = False
    from_parts_alone: ClassVar[bool] = True

    def __post_init__(self):
        self._require_keywords(
            "latent_gaussian", "`form`", "LatentGaussianStructure(form='covariance')"
        )
        if self.form not in FORMS:
            raise ValueError(
                f"`form` must be one of {', '.join(map(repr, FORMS))}; got {self.form!r}."
            )
        if self.basis and self.form != "precision":
            raise ValueError(
                "`basis=True` needs `form='precision'` (A = Q + Bᵀ diag(w) B); got "
                f"form={self.form!r}."
            )

    @property
    def compact_ndim(self) -> int:
        return 2  # Q + diag(w), or [K; wᵀ]

    # --- symbolic ------------------------------------------------------------------------------
    def compact_parts(self, A):
        """(K, w) of the covariance form's compact A = [K; wᵀ] (the pieces themselves when A
        is the Join `jacobian` built)."""
        return _parts(A)

    def jacobian(self, F, xs, prior=None, curvature=None) -> TensorVariable:
        """Compact A from the prior part (Q or K, (n, n)) and the curvature w ((n,)), or, with
        `basis`, the likelihood's curvature matrix Bᵀ diag(w) B ((n, n))."""
        if prior is None or curvature is None:
            raise ValueError(
                "`LatentGaussianStructure.jacobian` builds A from its parts, the prior matrix and "
                "the likelihood curvature (`OptimalityCondition.parts`); got none. It is chosen "
                "by `marginalize_laplace`, not passed as `structure=` of a solver."
            )
        prior = prior.astype("float64")
        curvature = curvature.astype("float64")
        if self.basis:
            return prior + curvature
        if self.form == "precision":
            return prior + pt.eye(curvature.shape[0], dtype="float64") * curvature[None, :]
        return pt.concatenate([prior, curvature[None, :]], axis=0)

    def jacobian_at_solution(self, prior, curvature) -> TensorVariable:
        """Compact A from its parts at the solution (``OptimalityCondition.jacobian_at``): as
        `jacobian`, with Q + diag(w) formed by one `PlusDiagonal` Op, whose equal applications
        merge whatever rewrites do around them."""
        if self.form == "precision" and not self.basis:
            return plus_diagonal(prior, curvature)
        return self.jacobian(None, None, prior, curvature)

    def solve(self, A, rhs, *, transposed: bool = False, symmetric: bool = True):
        """A⁻¹ rhs (A is symmetric: `transposed` changes nothing); NaN where a Cholesky fails."""
        if self.form == "precision":
            return _cholesky_solve(pt.linalg.cholesky(A, on_error="nan"), rhs)
        K, w = _parts(A)
        s = pt.sqrt(w)
        t = K @ rhs
        v = _cholesky_solve(_symbolic_b_factor(A, K, w, s), s * t)
        return t - K @ (s * v)

    def logdet_positive_definite(self, A) -> TensorVariable:
        """log det A (NaN if A is not positive definite)."""
        if self.form == "precision":
            return _logdet_spd_op()(A.astype("float64"))
        K, w = _parts(A)
        return logdet_b(K, w) - _logdet_from_cholesky(pt.linalg.cholesky(K, on_error="nan"))

    def positive_definite(self, A) -> TensorVariable:
        """One boolean: A (Q + W, or K⁻¹ + W through M = I + L_Kᵀ W L_K) is positive definite."""
        if self.form == "precision":
            L = pt.linalg.cholesky(A, on_error="nan")
            return pt.all(_finite(L))[None]
        K, w = _parts(A)
        L_K = pt.linalg.cholesky(K, on_error="nan")
        # M ≥ I when w ≥ 0 (as `positive_definite_numpy` argues): factorized only otherwise
        M_positive = ifelse(
            pt.all(w >= 0),
            pt.as_tensor(np.array(True)),
            pt.all(_finite(pt.linalg.cholesky(_m_matrix(L_K, w), on_error="nan"))),
        )
        return (pt.all(_finite(L_K)) & M_positive)[None]

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        """mean + v with v ~ N(0, A⁻¹), from standard normal `noise`."""
        if self.form == "precision":
            L = pt.linalg.cholesky(precision)
            v = pt.linalg.solve_triangular(L.mT, noise[..., None], lower=False, b_ndim=2)
            return mean + v[..., 0]
        K, w = _parts(precision)
        L_K = pt.linalg.cholesky(K)
        L_M = pt.linalg.cholesky(_m_matrix(L_K, w))
        u = pt.linalg.solve_triangular(L_M.mT, noise[..., None], lower=False, b_ndim=2)[..., 0]
        return mean + L_K @ u

    # --- numerical (the Newton loops) ----------------------------------------------------------
    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """A⁻¹ rhs; raises numpy.linalg.LinAlgError when A (or B) is not positive definite.

        The Newton loop calls this once per step: LAPACK's ``potrf``/``potrs`` are called
        directly (scipy's ``cho_factor``/``cho_solve`` wrappers cost about as much again at
        n = 100), and B is formed in one array.
        """
        if self.form == "precision":
            return _cho_solve_numpy(_cholesky_numpy(A), rhs)
        K, w = A[:-1], A[-1]
        s, L = _b_factor_numpy(K, w)
        t = K @ rhs
        return t - K @ (s * _cho_solve_numpy(L, s * t))

    def solve_array(self, A, rhs, xp=np):
        """A⁻¹ rhs with numpy or jax.numpy (JAX: NaN where a Cholesky factorization fails)."""
        if xp is np:
            return self.solve_numpy(A, rhs)
        from jax.scipy.linalg import cho_solve

        if self.form == "precision":
            return cho_solve((xp.linalg.cholesky(A), True), rhs)
        K, w = A[:-1], A[-1]
        s, L = _b_factor_jax(K, w)
        t = K @ rhs
        return t - K @ (s * cho_solve((L, True), s * t))

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """Whether A − margin·I is positive definite. Covariance form: K⁻¹ + W − margin·I =
        L_K⁻ᵀ M L_K⁻¹ with M = I + L_Kᵀ (W − margin·I) L_K; when w − margin ≥ 0, M ≥ I is
        positive definite whenever L_K exists, so one factorization (of K) decides, as in the
        graph form."""
        try:
            if self.form == "precision":
                _cholesky_numpy(A - margin * np.eye(A.shape[-1]) if margin else A)
            else:
                K, w = A[:-1], A[-1] - margin
                L_K = _cholesky_numpy(K)
                if not np.all(w >= 0):
                    L = np.tril(L_K)
                    M = L.T @ (w[:, None] * L)
                    M.flat[:: len(w) + 1] += 1.0
                    _cholesky_numpy(M, overwrite=True)
        except np.linalg.LinAlgError:
            return np.array([False])
        return np.array([True])


@dataclass(frozen=True)
class CovarianceConditionStructure(LinearStructure):
    """A = I + K W: the Jacobian of the covariance form's Newton condition written without K⁻¹.

    For a latent z ~ N(μ, K) and w = diag ∇²(−log p(y | z)), the mode solves
    G(z) = (z − μ) + K ∇(−log p(y | z)) = 0, K times the objective's gradient (the iteration of
    Rasmussen & Williams 2006, Alg. 3.1, in f). Neither G, its Jacobian I + K W, nor the
    solves need K⁻¹: with S = W^½ and B = I + S K S,

        (I + K W)⁻¹ r = r − K S B⁻¹ S r,    (I + W K)⁻¹ r = r − S B⁻¹ S K r,

    and det(I + K W) = det B. The compact A is [K; wᵀ], the layout of
    ``LatentGaussianStructure(form="covariance")``, whose H = K⁻¹ + W has the same parts: the
    Laplace marginal's log-determinant and the implicit pullback's solve share B's factor.
    Needs w ≥ 0 (B's factor is NaN otherwise); "positive definite" means B is, which makes the
    root of G the minimum. Chosen by `marginalize_laplace`, not passed as `structure=`.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_optim.linalg.latent_gaussian import CovarianceConditionStructure
    >>> K = np.array([[2.0, 0.5], [0.5, 1.0]]); w = np.array([0.3, 1.2]); r = np.array([1.0, -1.0])
    >>> y = CovarianceConditionStructure().solve_numpy(np.vstack([K, w]), r)
    >>> bool(np.allclose(y, np.linalg.solve(np.eye(2) + K * w, r)))
    True
    """

    kind: str = "covariance_condition"
    block_size: int | None = None
    from_parts_alone: ClassVar[bool] = True

    def __post_init__(self):
        self._require_keywords(
            "covariance_condition", "no fields", "CovarianceConditionStructure()"
        )

    @property
    def compact_ndim(self) -> int:
        return 2  # [K; wᵀ]

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F, xs, prior=None, curvature=None) -> TensorVariable:
        """[K; wᵀ] from the prior covariance K and the curvature w (F itself is not used)."""
        return _COVARIANCE.jacobian(F, xs, prior, curvature)

    def jacobian_at_solution(self, prior, curvature) -> TensorVariable:
        return _COVARIANCE.jacobian(None, None, prior, curvature)

    def solve(self, A, rhs, *, transposed: bool = False, symmetric: bool = False):
        """(I + K W)⁻¹ rhs, or (I + W K)⁻¹ rhs with `transposed`; NaN where B's factor fails."""
        K, w = _parts(A)
        s = pt.sqrt(w)
        factor = _symbolic_b_factor(A, K, w, s)
        if transposed:
            return rhs - s * _cholesky_solve(factor, s * (K @ rhs))
        return rhs - K @ (s * _cholesky_solve(factor, s * rhs))

    def logdet_positive_definite(self, A) -> TensorVariable:
        """log det(I + K W) = log det B (NaN if B is not positive definite)."""
        return logdet_b(*_parts(A))

    def positive_definite(self, A) -> TensorVariable:
        """One boolean: B = I + W^½ K W^½ is positive definite (w ≥ 0 and its factor exists)."""
        K, w = _parts(A)
        return pt.all(_finite(_symbolic_b_factor(A, K, w, pt.sqrt(w))))[None]

    # --- numerical (the Newton loops) ----------------------------------------------------------
    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """(I + K W)⁻¹ rhs; raises numpy.linalg.LinAlgError when B is not positive definite."""
        K, w = A[:-1], A[-1]
        s, L = _b_factor_numpy(K, w)
        return rhs - K @ (s * _cho_solve_numpy(L, s * rhs))

    def solve_array(self, A, rhs, xp=np):
        """(I + K W)⁻¹ rhs with numpy or jax.numpy (JAX: NaN where B's factor fails)."""
        if xp is np:
            return self.solve_numpy(A, rhs)
        from jax.scipy.linalg import cho_solve

        K, w = A[:-1], A[-1]
        s, L = _b_factor_jax(K, w)
        return rhs - K @ (s * cho_solve((L, True), s * rhs))

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """Whether B = I + W^½ K W^½ is positive definite: the condition (I + K W) x = r of the
        covariance-form Newton solve is not a minimum's Hessian, so no margin applies."""
        if margin:
            raise ValueError(
                "`margin` does not apply to the covariance-form condition I + K W (not a "
                f"Hessian); got margin={margin}. Test `LatentGaussianStructure` instead."
            )
        try:
            _b_factor_numpy(A[:-1], A[-1])
        except np.linalg.LinAlgError:
            return np.array([False])
        return np.array([True])


_COVARIANCE = LatentGaussianStructure(form="covariance")


def _symbolic_b_factor(A, K, w, s):
    """B's lower factor: the `BCholesky` Op when A is the Join `jacobian` built (equal nodes
    merge), else (e.g. the numba loop's plain A) the factor of B written out."""
    if _parts(A, joined_only=True) is None:
        return pt.linalg.cholesky(_b_matrix(K, s), on_error="nan")
    return _b_cholesky(K, w)


def _b_factor_numpy(K: np.ndarray, w: np.ndarray):
    """(s, L): s = √w and the lower factor L of B = I + S K S, formed in one array; raises
    numpy.linalg.LinAlgError when w < 0 somewhere or B is not positive definite."""
    if not np.all(w >= 0):
        raise np.linalg.LinAlgError("negative likelihood curvature: B = I + SKS undefined")
    s = np.sqrt(w)
    B = s[:, None] * K * s
    B.flat[:: len(s) + 1] += 1.0
    return s, _cholesky_numpy(B, overwrite=True)


def _b_factor_jax(K, w):
    """(s, L) as `_b_factor_numpy`, with jax.numpy (L NaN where the factorization fails)."""
    import jax.numpy as jnp

    s = jnp.sqrt(w)
    return s, jnp.linalg.cholesky(jnp.eye(s.shape[0], dtype=K.dtype) + s[:, None] * K * s)


def _b_matrix(K, s):
    """B = I + S K S with S = diag(s)."""
    return pt.eye(K.shape[0], dtype=K.dtype) + s[:, None] * K * s[None, :]


def _m_matrix(L_K, w):
    """M = I + L_Kᵀ W L_K."""
    return pt.eye(L_K.shape[0], dtype=L_K.dtype) + L_K.mT @ (w[:, None] * L_K)


def _cholesky_solve(L, rhs):
    """(L Lᵀ)⁻¹ rhs: one LAPACK ``potrs`` (NaN where L is)."""
    return pt.linalg.cho_solve((L, True), rhs, b_ndim=1)


def _b_cholesky(K, w):
    """The lower Cholesky factor of B = I + W^½ K W^½ (NaN if it fails or w < 0)."""
    return _B_CHOLESKY(K, w)


class BCholesky(Op):
    """L = cholesky(I + W^½ K W^½) from (K, w) in one Op: NaN where w < 0 or B is not positive
    definite. The log-determinant, its gradient and the implicit pullback's solve each ask for
    it; as one Op with no parameters, equal nodes merge (written out, B's graphs were
    rewritten into copies that no merge joined, and B was factorized two or three times per
    evaluation). Under the default backend it forms B in one array and calls LAPACK's
    ``potrf``; under JAX, ``jnp.linalg.cholesky``. Differentiable (through B's Cholesky)."""

    __props__ = ()

    def make_node(self, K, w):
        K = pt.as_tensor_variable(K).astype("float64")
        w = pt.as_tensor_variable(w).astype("float64")
        if K.type.ndim != 2 or w.type.ndim != 1:
            raise TypeError(f"BCholesky takes a matrix K and a vector w; got {K.type}, {w.type}.")
        return Apply(self, [K, w], [pt.matrix(dtype="float64", shape=K.type.shape)])

    def perform(self, node, inputs, output_storage):
        K, w = inputs
        n = w.shape[0]
        with np.errstate(invalid="ignore"):
            if np.all(w >= 0):  # False for NaN
                s = np.sqrt(w)
                B = s[:, None] * K * s
                B.flat[:: n + 1] += 1.0
                L, info = _potrf(B.T, lower=1, clean=1, overwrite_a=1)
                if info == 0 and np.all(np.isfinite(np.diagonal(L))):
                    output_storage[0][0] = L
                    return
        output_storage[0][0] = np.full((n, n), np.nan)

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        K, w = inputs
        B = _b_matrix(K, pt.sqrt(w))
        (B_bar,) = Cholesky(lower=True).pullback([B], outputs, output_grads)
        return grad(None, [K, w], known_grads={B: B_bar})


_B_CHOLESKY = BCholesky()


class PlusDiagonal(Op):
    """Q + diag(w) in one Op (a copy of Q with w added to its diagonal). Written out, as
    Q + eye(n)·w, the Laplace marginal's A at the solution and the implicit pullback's A went
    through different rewrites and were factorized once each; as one Op with no parameters,
    equal nodes merge. Its gradient is (Ḡ, diag(Ḡ))."""

    __props__ = ()

    def make_node(self, Q, w):
        Q = pt.as_tensor_variable(Q).astype("float64")
        w = pt.as_tensor_variable(w).astype("float64")
        if Q.type.ndim != 2 or w.type.ndim != 1:
            raise TypeError(
                f"PlusDiagonal takes a matrix Q and a vector w; got {Q.type}, {w.type}."
            )
        return Apply(self, [Q, w], [pt.matrix(dtype="float64", shape=Q.type.shape)])

    def perform(self, node, inputs, output_storage):
        Q, w = inputs
        A = np.array(Q, dtype=np.float64, order="C")
        A.flat[:: A.shape[0] + 1] += w
        output_storage[0][0] = A

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        (G,) = output_grads
        return [G, pt.diagonal(G)]


_PLUS_DIAGONAL = PlusDiagonal()


def plus_diagonal(Q, w) -> TensorVariable:
    """Q + diag(w) as one `PlusDiagonal` node."""
    return _PLUS_DIAGONAL(Q, w)


class MergeCopiedParts(GraphRewriter):
    """The work on A done once: an application of `PlusDiagonal` or `BCholesky`, or of any Op
    to what one of them computes (a factorization, a solve), is replaced by an earlier one of
    the same Op whose inputs are the same graphs (`_same_graphs`), and so are those inputs.

    The marginal's value, its gradient (PyMC clones the two apart) and the implicit pullback
    each expand their own copy of the parts at the solution (`OptimalityCondition.jacobian_at`).
    PyTensor's merge pass can leave such copies apart: a node queued to merge with another is
    not looked at again when a merge of its inputs (constants, or a copy upstream) changes
    them, and the queued merge is then dropped. A (or B's factor) was then formed and
    factorized once per copy.
    """

    def add_requirements(self, fgraph):
        fgraph.attach_feature(ReplaceValidate())

    def apply(self, fgraph):
        if not any(isinstance(n.op, PlusDiagonal | BCholesky) for n in fgraph.apply_nodes):
            return
        kept: dict = {}  # Op -> the nodes of it kept
        derived: set = set()  # the variables A or B's factor enter
        for node in fgraph.toposort():
            if node not in fgraph.apply_nodes:
                continue  # replaced by its twin
            if not (
                isinstance(node.op, PlusDiagonal | BCholesky)
                or any(x in derived for x in node.inputs)
            ):
                continue
            same_op = kept.setdefault(node.op, [])
            twin = next((k for k in same_op if _same_graphs(node.inputs, k.inputs)), None)
            if twin is not None:
                # (of two equal graphs neither holds the other: the replacement makes no cycle)
                pairs = [*zip(node.inputs, twin.inputs, strict=True)]
                pairs = [(x, y) for x, y in pairs if x is not y]
                pairs += list(zip(node.outputs, twin.outputs, strict=True))
                try:
                    fgraph.replace_all_validate(pairs, reason="merge_copied_parts")
                    continue
                except InconsistencyError:
                    pass
            same_op.append(node)
            derived.update(node.outputs)


# after the first merge passes (each copy's common parts are then one node), before canonicalize;
# and again before elemwise fusion: canonicalize and specialize can make copies equal that
# the merge feature then leaves apart, and fusion would compute both in one fused node
optdb.register(
    "pmo_merge_copied_parts", MergeCopiedParts(), "fast_run", "fast_compile", position=0.7
)
optdb.register(
    "pmo_merge_copied_parts_unfused", MergeCopiedParts(), "fast_run", "fast_compile", position=47.5
)


def _same_graphs(xs, ys) -> bool:
    """Whether each of `xs` is computed as the matching one of `ys`: the same variable, equal
    constants, or the same output of nodes with equal Ops whose inputs are so."""
    if len(xs) != len(ys):
        return False
    stack, seen = list(zip(xs, ys, strict=True)), set()
    while stack:
        x, y = stack.pop()
        if x is y or (x, y) in seen:
            continue
        seen.add((x, y))
        if x.type != y.type:
            return False
        if isinstance(x, Constant) or isinstance(y, Constant):
            if not (isinstance(x, Constant) and x.equals(y)):
                return False
            continue
        a, b = x.owner, y.owner
        if (
            a is None
            or b is None
            or a.op != b.op
            or len(a.inputs) != len(b.inputs)
            or a.outputs.index(x) != b.outputs.index(y)
        ):
            return False
        stack.extend(zip(a.inputs, b.inputs, strict=True))
    return True


class CholeskyInverse(Op):
    """X = (L Lᵀ)⁻¹ from the lower Cholesky factor L, by LAPACK's ``potri`` (n³/3 + n³/3
    flops, against 2n³ for ``potrs`` with the identity); all NaN where L is not finite. Its
    gradient: with M = X Ḡᵀ X, L̄ = tril(−(M + Mᵀ) L)."""

    __props__ = ()

    def make_node(self, L):
        L = pt.as_tensor_variable(L).astype("float64")
        if L.type.ndim != 2:
            raise TypeError(f"CholeskyInverse takes a matrix L; got {L.type}.")
        return Apply(self, [L], [pt.matrix(dtype="float64", shape=L.type.shape)])

    def perform(self, node, inputs, output_storage):
        (L,) = inputs
        n = L.shape[0]
        if n and np.all(np.isfinite(L)):
            # potri reads the lower triangle of a Fortran-ordered factor: Lᵀ of a C-ordered L
            # is that array (the upper triangle in C order), read as upper
            a = L.T if L.flags.c_contiguous else np.asfortranarray(L)
            lower = int(not L.flags.c_contiguous)
            X, info = _potri(a, lower=lower, overwrite_c=0)
            if info == 0:
                X = np.tril(X) if lower else np.triu(X)
                X = X + X.T - np.diag(np.diagonal(X))
                output_storage[0][0] = np.ascontiguousarray(X)
                return
        output_storage[0][0] = np.full((n, n), np.nan)

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        (L,) = inputs
        (X,) = outputs
        (G,) = output_grads
        M = X @ G.mT @ X
        return [pt.tril(-(M + M.mT) @ L)]


_CHOLESKY_INVERSE = CholeskyInverse()


def cholesky_inverse(L) -> TensorVariable:
    """(L Lᵀ)⁻¹ from a lower Cholesky factor L (`CholeskyInverse`)."""
    return _CHOLESKY_INVERSE(L)


class LowerSolve(Op):
    """X = L⁻¹ M for a lower-triangular L and a matrix M, by ``trsm``; under numba by
    `_lower_solve_loops` up to n = NUMBA_LOOPS_MAX (PyTensor's triangular solve goes
    through OpenBLAS's threads, which slowed it many-fold on a busy machine). Its gradient:
    M̄ = L⁻ᵀ X̄, L̄ = −tril(M̄ Xᵀ)."""

    __props__ = ()

    def make_node(self, L, M):
        L = pt.as_tensor_variable(L).astype("float64")
        M = pt.as_tensor_variable(M).astype("float64")
        if L.type.ndim != 2 or M.type.ndim != 2:
            raise TypeError(f"LowerSolve takes two matrices L and M; got {L.type}, {M.type}.")
        return Apply(self, [L, M], [pt.matrix(dtype="float64", shape=M.type.shape)])

    def perform(self, node, inputs, output_storage):
        L, M = inputs
        output_storage[0][0] = solve_triangular(L, M, lower=True, check_finite=False)

    def infer_shape(self, node, shapes):
        return [shapes[1]]

    def pullback(self, inputs, outputs, output_grads):
        L, _ = inputs
        (X,) = outputs
        (G,) = output_grads
        M_bar = pt.linalg.solve_triangular(L.mT, G, lower=False, b_ndim=2)
        return [-pt.tril(M_bar @ X.mT), M_bar]


_LOWER_SOLVE = LowerSolve()


def lower_solve(L, M) -> TensorVariable:
    """L⁻¹ M for a lower-triangular L and a matrix M (`LowerSolve`)."""
    return _LOWER_SOLVE(L, M)


def covariance_solve(K, L, b):
    """K⁻¹ b from the lower Cholesky factor L of K, differentiated as a function of K alone.

    The gradient is written by hand, b̄ = K⁻¹ḡ and K̄ = −(K⁻¹ḡ)(K⁻¹b)ᵀ, one more solve with
    L: differentiating the two triangular solves would send the gradient through L, whose
    Cholesky gradient costs two triangular solves with n right-hand sides and a matrix product.
    `L` must be ``cholesky(K)``; it receives no gradient (K's carries it). First derivatives
    are exact; derivatives of this gradient miss the dependence of L on K.

    Parameters
    ----------
    K : (n, n) TensorVariable
        A symmetric positive definite matrix (a Gaussian prior's covariance).
    L : (n, n) TensorVariable
        ``pt.linalg.cholesky(K)``, lower.
    b : (n,) TensorVariable

    Returns
    -------
    (n,) TensorVariable

    Examples
    --------
    >>> import numpy as np, pytensor, pytensor.tensor as pt
    >>> from pymc_optim.linalg.latent_gaussian import covariance_solve
    >>> K, b = pt.matrix("K"), pt.vector("b")
    >>> value = (b * covariance_solve(K, pt.linalg.cholesky(K), b)).sum()
    >>> fn = pytensor.function([K, b], pytensor.grad(value, K))
    >>> K0 = np.array([[2.0, 0.5], [0.5, 1.0]]); b0 = np.array([1.0, -1.0])
    >>> a = np.linalg.solve(K0, b0)
    >>> bool(np.allclose(fn(K0, b0), -np.outer(a, a)))
    True
    """
    return _covariance_solve_op()(
        pt.as_tensor_variable(K).astype("float64"),
        pt.as_tensor_variable(L).astype("float64"),
        pt.as_tensor_variable(b).astype("float64"),
    )


def logdet_b(K, w):
    """log det B, B = I + W^½ K W^½ (= log det(K⁻¹ + W) + log det K), NaN where w < 0 or B
    is not positive definite; differentiated by hand from one factorization of B.

    With R = W^½ B⁻¹ W^½ = (K + W⁻¹)⁻¹: ∂/∂K = R and ∂/∂w = diag((K⁻¹ + W)⁻¹) =
    diag(K − K R K) (Rasmussen & Williams 2006, Alg. 5.1), so the gradient needs B⁻¹ (LAPACK's
    ``potri`` by `CholeskyInverse`, on the factor the value used) and, for diag(K R K) =
    diag(Vᵀ V) with V = L_B⁻¹ W^½ K, one triangular solve with n right-hand sides (half the
    flops of the product K R), not the gradient of the Cholesky factorization.

    Parameters
    ----------
    K : (n, n) TensorVariable
        A symmetric covariance matrix.
    w : (n,) TensorVariable
        The likelihood's curvature, ≥ 0.

    Returns
    -------
    scalar TensorVariable

    Examples
    --------
    >>> import numpy as np, pytensor, pytensor.tensor as pt
    >>> from pymc_optim.linalg.latent_gaussian import logdet_b
    >>> K, w = pt.matrix("K"), pt.vector("w")
    >>> fn = pytensor.function([K, w], [logdet_b(K, w), *pytensor.grad(logdet_b(K, w), [K, w])])
    >>> K0 = np.array([[2.0, 0.5], [0.5, 1.0]]); w0 = np.array([0.3, 1.2])
    >>> value, dK, dw = fn(K0, w0)
    >>> H = np.linalg.inv(K0) + np.diag(w0)
    >>> bool(np.isclose(value, np.linalg.slogdet(H)[1] + np.linalg.slogdet(K0)[1]))
    True
    >>> bool(np.allclose(dw, np.diag(np.linalg.inv(H))))
    True
    """
    return _logdet_b_op()(
        pt.as_tensor_variable(K).astype("float64"), pt.as_tensor_variable(w).astype("float64")
    )


@functools.cache
def _covariance_solve_op() -> OpFromGraph:
    """One Op for every graph (equal nodes merge); inlined at compile time, so its solves
    merge with the gradient's."""
    K, L, b = pt.matrix("K", dtype="float64"), pt.matrix("L", dtype="float64"), pt.vector("b")

    def pullback(inputs, outputs, output_grads):
        _, L, _ = inputs
        beta = _cholesky_solve(L, output_grads[0])
        return [-pt.outer(beta, outputs[0]), DisconnectedType()(), beta]

    op = OpFromGraph(
        [K, L, b],
        [_cholesky_solve(L, b)],
        inline=True,
        pullback=pullback,
        connection_pattern=[[True], [False], [True]],
        name="covariance_solve",
    )
    # L's gradient flows through K: a solver Op on this graph sends L no (zero) gradient
    op.differentiated_elsewhere = (1,)
    return op


@functools.cache
def _logdet_b_op() -> OpFromGraph:
    K, w = pt.matrix("K", dtype="float64"), pt.vector("w", dtype="float64")

    def pullback(inputs, outputs, output_grads):
        K, w = inputs
        (g,) = output_grads
        s = pt.sqrt(w)
        L = _b_cholesky(K, w)
        B_inv = cholesky_inverse(L)
        R = s[:, None] * B_inv * s[None, :]
        # diag(K R K) = diag(Vᵀ V), V = L⁻¹ S K: one triangular solve with n right-hand sides
        # (n³ flops) instead of the product K R (2n³)
        V = lower_solve(L, s[:, None] * K)
        return [g * R, g * (pt.diagonal(K) - (V * V).sum(axis=0))]

    return OpFromGraph(
        [K, w],
        [_logdet_from_cholesky(_b_cholesky(K, w))],
        inline=True,
        pullback=pullback,
        name="logdet_b",
    )


@functools.cache
def _logdet_spd_op() -> OpFromGraph:
    """log det A of a symmetric positive definite A (NaN if its Cholesky fails), with the
    gradient written by hand: ∂/∂A = A⁻¹, by `CholeskyInverse` (LAPACK ``potri``, 2n³/3 flops)
    on the factor the value used. Differentiated through the factorization, PyTensor's Cholesky
    gradient costs two triangular solves with n right-hand sides and a matrix product (4n³).
    A⁻¹ is symmetric: the gradient along symmetric A(θ), as Q + W is."""
    A = pt.matrix("A", dtype="float64")

    def pullback(inputs, outputs, output_grads):
        (A,) = inputs
        L = pt.linalg.cholesky(A, on_error="nan")
        return [output_grads[0] * cholesky_inverse(L)]

    return OpFromGraph(
        [A],
        [_logdet_from_cholesky(pt.linalg.cholesky(A, on_error="nan"))],
        inline=True,
        pullback=pullback,
        name="logdet_spd",
    )


def _logdet_from_cholesky(L):
    return 2.0 * pt.log(pt.diagonal(L, axis1=-2, axis2=-1)).sum()


def _parts(A, *, joined_only: bool = False):
    """(K, w) of the compact A = [K; wᵀ]. When A is the Join `jacobian` built, its pieces
    themselves: a slice of the Join would be a new matrix to the graph, so K's Cholesky (and
    B's) would be computed again next to the prior's, and differentiated again."""
    owner = A.owner
    # (the Join's axis is a property of the Op, not an input)
    if owner is not None and isinstance(owner.op, Join) and len(owner.inputs) == 2:
        K, row = owner.inputs
        row_owner = row.owner
        if (
            owner.op.axis == 0
            and K.type.ndim == 2
            and row_owner is not None
            and isinstance(row_owner.op, DimShuffle)
            and tuple(row_owner.op.new_order) == ("x", 0)
        ):
            return K, row_owner.inputs[0]
    return None if joined_only else (A[:-1], A[-1])


def _cholesky_numpy(A: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
    """The lower Cholesky factor of the symmetric A (its upper triangle left unspecified, as
    ``potrs`` ignores it); LinAlgError when A is not positive definite or not finite. With
    `overwrite`, A's storage may be reused. A C-ordered A is passed as its transpose, the same
    symmetric matrix in Fortran order, so LAPACK needs no copy."""
    a = A.T if A.flags.c_contiguous else A
    L, info = _potrf(a, lower=1, clean=0, overwrite_a=int(overwrite))
    # a NaN or an infinity in A reaches L's diagonal (every entry of row i enters L_ii)
    if info != 0 or not np.all(np.isfinite(np.diagonal(L))):
        raise np.linalg.LinAlgError("not positive definite")
    return L


def _cho_solve_numpy(L: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    x, info = _potrs(L, rhs, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"potrs failed (info={info})")
    return x
