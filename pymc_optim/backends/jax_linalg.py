"""JAX implementations of the linear-algebra Ops of `pymc_optim.linalg` and of the KKT system's
fallback solve; the sparse factorizations refuse JAX at compile time, naming what runs them.

Imported by `pymc_optim.backends.jax`, when PyTensor first imports its JAX dispatch.
"""

from __future__ import annotations

from pytensor.link.jax.dispatch import jax_funcify

from pymc_optim.linalg.latent_gaussian import BCholesky, CholeskyInverse, LowerSolve, PlusDiagonal
from pymc_optim.linalg.sparse import (
    SelectedInverseOp,
    SparseFactorSolveOp,
    SparseLogdetOp,
    SparseSolveOp,
)
from pymc_optim.linalg.sparse_lu import SparseLUSolveOp
from pymc_optim.linalg.structure import UnlessFinite

__all__: list[str] = []


# --- the latent-Gaussian Ops --------------------------------------------------------------------
@jax_funcify.register(BCholesky)
def _jax_b_cholesky(op, **kwargs):
    import jax.numpy as jnp

    def b_cholesky(K, w):
        s = jnp.sqrt(w)
        L = jnp.linalg.cholesky(jnp.eye(K.shape[0], dtype=K.dtype) + s[:, None] * K * s)
        # all NaN when it fails, as under the default backend (JAX fills the lower part)
        return jnp.where(jnp.all(jnp.isfinite(L)), L, jnp.nan)

    return b_cholesky


@jax_funcify.register(PlusDiagonal)
def _jax_plus_diagonal(op, **kwargs):
    import jax.numpy as jnp

    def plus_diagonal(Q, w):
        index = jnp.arange(w.shape[0])
        return Q.at[index, index].add(w)

    return plus_diagonal


@jax_funcify.register(CholeskyInverse)
def _jax_cholesky_inverse(op, **kwargs):
    import jax.numpy as jnp
    from jax.scipy.linalg import cho_solve

    def cholesky_inverse(L):
        return cho_solve((L, True), jnp.eye(L.shape[0], dtype=L.dtype))

    return cholesky_inverse


@jax_funcify.register(LowerSolve)
def _jax_lower_solve(op, **kwargs):
    from jax.scipy.linalg import solve_triangular as jax_solve_triangular

    def lower_solve(L, M):
        return jax_solve_triangular(L, M, lower=True)

    return lower_solve


# --- the sparse factorizations: refused -----------------------------------------------------------
def _refuse_sparse_cholesky(op, **kwargs):
    raise NotImplementedError(
        f"{type(op).__name__} (sparse Cholesky) has no JAX implementation; compile with "
        "PyTensor's default C backend or mode='NUMBA', or, for a Laplace marginal under JAX, "
        "pass `hessian_structure='dense'` to marginalize_laplace."
    )


for _op_class in (SparseLogdetOp, SelectedInverseOp, SparseSolveOp, SparseFactorSolveOp):
    jax_funcify.register(_op_class)(_refuse_sparse_cholesky)


@jax_funcify.register(SparseLUSolveOp)
def _refuse_sparse_lu(op, **kwargs):
    raise NotImplementedError(
        "SparseLUSolveOp (sparse LU) has no JAX implementation; compile with PyTensor's "
        "default C backend or mode='NUMBA' (object mode), or pass `structure='dense'`, "
        "which JAX runs."
    )


# --- the KKT system's solve: the dense solve under ``lax.cond`` ----------------------------------
@jax_funcify.register(UnlessFinite)
def _unless_finite_jax(op, node=None, **kwargs):
    import jax
    import jax.numpy as jnp

    def unless_finite(schur, A, rhs):
        def dense():
            matrix = op.structure.dense_matrix(A, jnp)
            return jnp.linalg.solve(matrix.T if op.transposed else matrix, rhs)

        return jax.lax.cond(jnp.all(jnp.isfinite(schur)), lambda: schur, dense)

    return unless_finite
