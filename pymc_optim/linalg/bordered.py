"""The KKT matrix of linear equality constraints, K = [[H, Bᵀ], [B, 0]], solved through H's
factor: the Newton system of min f(x) subject to B x = c, in (x, λ).

H is the Hessian of f in x (sparse or dense, its own structure), B a constant (k, n) matrix of
k ≪ n constraints. A solve of K [u; v] = [f; g] is the Schur complement: with Y = H⁻¹ [f, Bᵀ]
(one solve of k + 1 columns by H's factor) and the k × k G = B H⁻¹ Bᵀ,

    v = G⁻¹ (B H⁻¹ f − g),      u = H⁻¹ f − H⁻¹ Bᵀ v,

so a Newton iteration on the constrained problem costs one factorization of H, like an
unconstrained one (the k extra columns are triangular solves). K is symmetric: its transposed
solves are the same. K is indefinite (k negative eigenvalues): no log-determinant or draws (a
Laplace marginal takes those of H on {B x = 0}: `pymc_optim.model.constraints`); its
positive-definiteness test is H's, the curvature test of a constrained minimum.

`pymc_optim.linalg.kkt.KKTStructure` is the same system for constraints that
depend on x (their Jacobian part of A, the sign convention of L = f − λᵀc) with a diagonal or
block-diagonal H; this one takes a sparse or dense H and a constant border.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure

__all__ = ["BorderedStructure"]


@dataclass(frozen=True, eq=False)
class BorderedStructure(LinearStructure):
    """K = [[H, Bᵀ], [B, 0]] on the controls (x, λ): H in `hessian`'s structure (sparse or
    dense) built from the first n equations' derivatives in x, B the constant (k, n) `border`.

    A in compact form is H's. Built by the Laplace marginal of a latent with a linear
    constraint (its constrained mode in one Newton loop), not by hand.
    """

    kind: str = "bordered"
    block_size: int | None = None
    hessian: LinearStructure | None = None
    border: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.hessian, LinearStructure) or not (
            isinstance(self.hessian, SparseStructure) or self.hessian.kind == "dense"
        ):
            raise TypeError(
                f"`hessian` must be a SparseStructure or the dense structure; got {self.hessian!r}."
            )
        B = np.array(self.border, dtype=np.float64, ndmin=2)
        if B.ndim != 2 or B.shape[0] == 0 or B.shape[0] >= B.shape[1]:
            raise ValueError(f"`border` must have shape (k, n) with 1 ≤ k < n; got {B.shape}.")
        if np.linalg.matrix_rank(B) < B.shape[0]:
            raise ValueError("`border` must have full row rank (independent constraints).")
        B.setflags(write=False)
        object.__setattr__(self, "border", B)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.hessian == self.hessian
            and np.array_equal(other.border, self.border)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.hessian, self.border.shape, self.border.tobytes()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(hessian={self.hessian!r}, constraints={self.k})"

    @property
    def k(self) -> int:
        """The number of constraints."""
        return int(self.border.shape[0])

    @property
    def n(self) -> int:
        """The size of x."""
        return int(self.border.shape[1])

    @property
    def compact_ndim(self) -> int:
        return self.hessian.compact_ndim

    def stacked(self) -> None:
        """No stacked form: a batch of these problems is solved one problem at a time."""
        return None

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F: TensorVariable, xs) -> TensorVariable:
        """H from the first n equations' derivatives in x (the constraint rows are B)."""
        x = list(xs)[0]
        return self.hessian.jacobian(pt.as_tensor_variable(F).ravel()[: self.n], [x])

    def _solve_h(self, H, columns) -> TensorVariable:
        if isinstance(self.hessian, SparseStructure):
            return self.hessian.pattern.solve(H, columns)
        return pt.linalg.solve(H, columns, assume_a="sym")

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool) -> TensorVariable:
        rhs = pt.as_tensor_variable(rhs)
        f, g = rhs[: self.n], rhs[self.n :]
        B = pt.constant(self.border)
        Y = self._solve_h(A, pt.concatenate([f[:, None], B.T], axis=1))
        y, W = Y[:, 0], Y[:, 1:]
        G = pt.dot(B, W)
        v = pt.linalg.solve(0.5 * (G + G.T), pt.dot(B, y) - g, assume_a="sym")
        return pt.concatenate([y - pt.dot(W, v), v])

    def logdet_positive_definite(self, A) -> TensorVariable:
        raise NotImplementedError("The KKT matrix is indefinite: it has no log-determinant here.")

    def positive_definite(self, A) -> TensorVariable:
        """Whether H is positive definite: the curvature test of a constrained minimum (H
        positive definite on {B x = 0}), sufficient where it holds; K itself is indefinite."""
        return self.hessian.positive_definite(A)

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        raise NotImplementedError("The KKT matrix is indefinite: no Gaussian has it as precision.")

    # --- numerical -----------------------------------------------------------------------------
    def solve_array(self, A, rhs, xp=np):
        """The solve with an array module `xp` (numpy or jax.numpy) for a dense H."""
        f, g = rhs[: self.n], rhs[self.n :]
        B = xp.asarray(self.border)
        Y = xp.linalg.solve(A, xp.concatenate([f[:, None], B.T], axis=1))
        return self._from_columns(Y, g, xp)

    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        if not isinstance(self.hessian, SparseStructure):
            return self.solve_array(np.asarray(A), np.asarray(rhs, dtype=np.float64))
        rhs = np.asarray(rhs, dtype=np.float64)
        columns = np.column_stack([rhs[: self.n], self.border.T])
        return self._from_columns(self.hessian.solve_numpy(A, columns), rhs[self.n :], np)

    def _from_columns(self, Y, g, xp):
        """[u; v] from Y = H⁻¹ [f, Bᵀ] and g."""
        B = xp.asarray(self.border)
        y, W = Y[:, 0], Y[:, 1:]
        G = B @ W
        v = xp.linalg.solve(0.5 * (G + G.T), B @ y - g)
        return xp.concatenate([y - W @ v, v])

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """`positive_definite` with numpy (of H − margin·I)."""
        return self.hessian.positive_definite_numpy(A, margin=margin)

    def dense_matrix(self, A, xp=np):
        """K as an (n + k, n + k) array (tests and small problems)."""
        if isinstance(self.hessian, SparseStructure):
            H = self.hessian.pattern.to_dense(A).eval()
        else:
            H = np.asarray(A)
        B = self.border
        k = self.k
        return np.block([[H, B.T], [B, np.zeros((k, k))]])
