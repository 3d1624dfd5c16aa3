"""The equality-constrained KKT matrix with a diagonal or block-diagonal Hessian block, solved
by the Schur complement on the constraints (Newton-KKT of `pymc_optim.problems.constrained`).

With z = (x, λ), the rows
F = (∇ₓL, c) of L = f − λᵀc have the Jacobian

    A = [[H, −Jᵀ],        H = ∇²ₓL (n × n, symmetric),
         [J,   0 ]],      J = ∂c/∂x (m × n),

bordered by the constraint Jacobian whatever H is. When the structural reading
(:func:`pymc_optim.linalg.detect.hessian_structure`, on L with the multipliers held as
parameters) proves H diagonal or block-diagonal, :class:`KKTStructure` solves A by the Schur
complement on the constraints:

    Y = H⁻¹ [r₁, Jᵀ]  (the structure's solve, n × (1 + m)),   S = J H⁻¹ Jᵀ  (m × m),
    Δλ = S⁻¹ (r₂ − J H⁻¹ r₁),   Δx = H⁻¹ r₁ + H⁻¹ Jᵀ Δλ,

O(n b² m + m³) instead of O((n + m)³), and A is built with b + m reverse passes instead of
n + m. Aᵀ = D A D with D = diag(I, −I) (H symmetric), so the transposed solve of the implicit
gradient is the same solve with the sign of the constraint rows flipped. The Schur complement
needs H itself nonsingular, which the KKT conditions do not (H need only be positive definite on
the null space of J; e.g. an objective linear in some elements of x): where the Schur result is
not finite the solve falls back to the dense KKT matrix, assembled from the compact form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import jacobian
from pytensor.tensor.basic import Join
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.structure import LinearStructure, UnlessFinite, _FailSafeSolve

__all__ = ["KKTStructure"]


@dataclass(frozen=True)
class KKTStructure(LinearStructure):
    """The equality-constrained KKT matrix with a diagonal or block-diagonal Hessian block H,
    solved by the Schur complement on the constraints (module Notes).

    The compact A is the (b + m, n) array ``[Hc; J]``: J = ∂c/∂x, and row j of Hc holds entry j
    of every row's block of H (``Hc[j, r] = H[r, b·(r // b) + j]``, b = 1 for a diagonal H).

    Parameters
    ----------
    hessian : LinearStructure
        The layout of H: ``"diagonal"`` or ``"block_diagonal"``.

    Examples
    --------
    min ½Σ h_i x_i² − Σ x_i subject to Σ x_i = 1, one Newton step from 0, against the dense KKT
    matrix:

    >>> import numpy as np
    >>> from pymc_optim.linalg.structure import LinearStructure
    >>> from pymc_optim.linalg.kkt import KKTStructure
    >>> h, J = np.array([1.0, 2.0, 4.0]), np.ones((1, 3))
    >>> structure = KKTStructure(hessian=LinearStructure("diagonal"))
    >>> rhs = np.array([1.0, 1.0, 1.0, 1.0])
    >>> dense = np.block([[np.diag(h), -J.T], [J, np.zeros((1, 1))]])
    >>> step = structure.solve_numpy(np.vstack([h, J]), rhs)
    >>> bool(np.allclose(step, np.linalg.solve(dense, rhs)))
    True
    """

    kind: str = "kkt"
    block_size: int | None = None
    hessian: LinearStructure = LinearStructure("diagonal")

    def __post_init__(self):
        self._require_keywords(
            "kkt", "`hessian`", 'KKTStructure(hessian=LinearStructure("diagonal"))'
        )
        if self.hessian.kind not in ("diagonal", "block_diagonal"):
            raise ValueError(
                "`hessian` must be a diagonal or block-diagonal LinearStructure (a dense "
                f"Hessian block gains nothing from the Schur complement); got {self.hessian!r}."
            )

    @property
    def hessian_rows(self) -> int:
        """b: the rows of the compact A holding H (1 for a diagonal H)."""
        return 1 if self.hessian.kind == "diagonal" else self.hessian.block_size

    @property
    def compact_ndim(self) -> int:
        return 2

    # --- symbolic ------------------------------------------------------------------------------
    def jacobian(self, F, xs, gradient=None, constraints=None) -> TensorVariable:
        """Compact A from ∇ₓL and the flat constraints c (the condition's `parts`)."""
        if gradient is None or constraints is None:
            raise ValueError(
                "`KKTStructure.jacobian` builds A from its parts, ∇ₓL and the constraints "
                "(`OptimalityCondition.parts`); got none. It is chosen by `minimize` with "
                "`constraints` and `method='newton'`."
            )
        x = xs[0]
        H = self.hessian.jacobian(gradient, [x])
        b = self.hessian_rows
        Hc = H[None, :] if b == 1 else H.transpose(2, 0, 1).reshape((b, -1))
        J = _constraint_jacobian(constraints, x)
        return pt.concatenate([Hc, J.astype(Hc.dtype)], axis=0)

    def solve(self, A, rhs, *, transposed: bool, symmetric: bool = False) -> TensorVariable:
        """A⁻¹ rhs (or A⁻ᵀ rhs) by the Schur complement; the dense KKT solve where it is not
        finite (H singular), evaluated only then (`UnlessFinite`)."""
        b = self.hessian_rows
        n = A.shape[1]
        Hc, J = A[:b], A[b:]
        r1, r2 = rhs[:n], rhs[n:]
        if transposed:  # Aᵀ = D A D, D = diag(I, −I)
            r2 = -r2
        if b == 1:
            Y = pt.concatenate([r1[:, None], J.T], axis=1) / Hc[0][:, None]
        else:
            blocks = Hc.reshape((b, -1, b)).transpose(1, 2, 0)
            R = pt.concatenate([r1[:, None], J.T], axis=1).reshape((-1, b, J.shape[0] + 1))
            Y = Blockwise(_BlockSolve(assume_a="gen", b_ndim=2))(blocks, R)
            Y = Y.reshape((n, J.shape[0] + 1))
        y1, Yj = Y[:, 0], Y[:, 1:]
        S = J @ Yj
        t = r2 - J @ y1
        dl = _BlockSolve(assume_a="gen", b_ndim=2)(S, t[:, None])[:, 0]
        dx = y1 + Yj @ dl
        schur = pt.concatenate([dx, -dl if transposed else dl])
        return UnlessFinite(self, transposed)(schur, A, rhs)

    def dense_matrix(self, A, xp=np):
        """The (n + m, n + m) KKT matrix [[H, −Jᵀ], [J, 0]] from the compact A, with the array
        module `xp` (numpy or jax.numpy): only for the fallback of a singular H."""
        b = self.hessian_rows
        n, m = A.shape[1], A.shape[0] - b
        rows = np.broadcast_to(np.arange(n)[None, :], (b, n))
        cols = (np.arange(n) // b * b)[None, :] + np.arange(b)[:, None]
        H = xp.zeros((n, n), dtype=A.dtype)
        H = H.at[rows, cols].set(A[:b]) if xp is not np else _set(H, rows, cols, A[:b])
        J = A[b:]
        return xp.concatenate(
            [
                xp.concatenate([H, -J.T], axis=1),
                xp.concatenate([J, xp.zeros((m, m), dtype=A.dtype)], axis=1),
            ],
            axis=0,
        )

    def positive_definite(self, A) -> TensorVariable:
        """The KKT matrix is indefinite and Newton-KKT is root finding (no curvature test at a
        minimum): one flag, always True. Kept so that the backends can compile the test."""
        return pt.ones((1,), dtype="bool")

    def logdet_positive_definite(self, A) -> TensorVariable:
        raise TypeError("The KKT matrix is indefinite: it has no Cholesky log-determinant.")

    def sample_gaussian(self, mean, precision, noise) -> TensorVariable:
        raise TypeError("The KKT matrix is indefinite: it is not a Gaussian precision.")

    # --- numerical (the Newton loops) ----------------------------------------------------------
    def solve_numpy(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """A⁻¹ rhs; the dense KKT solve where H is singular; raises numpy.linalg.LinAlgError when
        the KKT matrix itself is."""
        try:
            with np.errstate(divide="raise", invalid="raise", over="raise"):
                out = self._schur_solve(A, rhs, np)
            if np.all(np.isfinite(out)):
                return out
        except (np.linalg.LinAlgError, FloatingPointError):
            pass
        return np.linalg.solve(self.dense_matrix(A, np), rhs)

    def solve_array(self, A, rhs, xp=np):
        """A⁻¹ rhs with numpy or jax.numpy (JAX: the dense solve under ``lax.cond`` where the
        Schur result is not finite; NaN where the KKT matrix is singular)."""
        if xp is np:
            return self.solve_numpy(A, rhs)
        import jax

        out = self._schur_solve(A, rhs, xp)
        return jax.lax.cond(
            xp.all(xp.isfinite(out)),
            lambda: out,
            lambda: xp.linalg.solve(self.dense_matrix(A, xp), rhs),
        )

    def _schur_solve(self, A, rhs, xp):
        """The KKT system [[H, −Jᵀ], [J, 0]] (x, λ) = (r₁, r₂) by the Schur complement on the
        constraints, H solved by its structure (array module `xp`; not finite where H is
        singular)."""
        b = self.hessian_rows
        n = A.shape[1]
        Hc, J = A[:b], A[b:]
        r1, r2 = rhs[:n], rhs[n:]
        R = xp.concatenate([r1[:, None], J.T], axis=1)
        if b == 1:
            Y = R / Hc[0][:, None]
        else:
            blocks = Hc.reshape(b, -1, b).transpose(1, 2, 0)
            Y = xp.linalg.solve(blocks, R.reshape(-1, b, R.shape[1])).reshape(R.shape)
        y1, Yj = Y[:, 0], Y[:, 1:]
        dl = xp.linalg.solve(J @ Yj, r2 - J @ y1)
        return xp.concatenate([y1 + Yj @ dl, dl])

    def positive_definite_numpy(self, A: np.ndarray, margin: float = 0.0) -> np.ndarray:
        """True (see `positive_definite`)."""
        return np.array([True])


def _constraint_jacobian(constraints, x) -> TensorVariable:
    """∂c/∂x (m × n), the rows of each concatenated piece of c by their own reverse passes:
    through the concatenation they would start from a Split of an identity, which PyTensor 3.3's
    rewrites mis-broadcast once the solve is vectorized ("Runtime broadcasting not allowed")."""
    owner = constraints.owner
    pieces = owner.inputs if owner is not None and isinstance(owner.op, Join) else [constraints]
    rows = [jacobian(c, x, vectorize=True).reshape((c.shape[0], x.size)) for c in pieces]
    return rows[0] if len(rows) == 1 else pt.concatenate(rows, axis=0)


class _BlockSolve(_FailSafeSolve):
    """A general solve of one small block by numpy's LAPACK wrapper (NaN where the block is
    singular), for the G blocks of a block-diagonal H and the m × m Schur complement: Blockwise
    calls it once per block, and scipy's `solve` spends far longer in its input checks than a
    small block's LAPACK call. The numba and JAX implementations are those of `Solve`."""

    def perform(self, node, inputs, outputs):
        a, b = inputs
        try:
            x = np.linalg.solve(a, b)
        except np.linalg.LinAlgError:
            x = np.full(b.shape, np.nan)
        outputs[0][0] = x.astype(node.outputs[0].type.dtype, copy=False)


def _set(H, rows, cols, values):
    H[rows, cols] = values
    return H
