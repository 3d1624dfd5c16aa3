r"""Linear constraints A x = 0 on a Laplace-marginalized latent, by conditioning by kriging.

An intrinsic prior (an ICAR, an RW1/RW2) is proper only on a subspace {x : A x = 0} (INLA's
``constr=TRUE``: the field sums to zero on each connected component; for RW2 also the linear
trend). :func:`pymc_optim.marginalize_laplace` integrates such a latent over that subspace in
its N original coordinates, where H = Q + W keeps the sparsity of the prior's precision Q,
instead of in the N − k coordinates of the sampling transform, where H is dense.

With ℓ(x, θ) the joint log density (the prior's density being the one on the subspace), the
Laplace approximation on the subspace is

.. math::

    \log p(y \mid \theta) \approx \ell(x_c) + \tfrac{N-k}{2}\log 2\pi
        - \tfrac12 \log\det(V^\top H V), \qquad
    \log\det(V^\top H V) = \log\det H + \log\det(A H^{-1} A^\top) - \log\det(A A^\top),

for V an orthonormal basis of the subspace (a Schur-complement identity of the orthogonal
matrix [V, Aᵀ(AAᵀ)^{-1/2}]) and H = −∇²ℓ(x_c) the Hessian in all N coordinates (positive
definite: the likelihood's curvature makes Q + W regular). The constrained mode x_c solves the
KKT system ∇ℓ(x) = −Aᵀλ, A x = 0. For fixed λ, x(λ) = argmin −ℓ(x) − λᵀA x is an unconstrained
problem with the same Hessian H (the term is linear), so the solver and structure (sparse,
dense) of the unconstrained Laplace serve; the k multipliers solve A x(λ) = 0 by Newton, whose
Jacobian is A H⁻¹ Aᵀ. From λ = 0 (x(0) = x*, the unconstrained mode) the first step gives
exactly the kriging correction

.. math::

    x_c = x^* - H^{-1}A^\top (A H^{-1} A^\top)^{-1} A x^*,

which is the constrained mode for a Gaussian likelihood (one step: A x(λ) is linear in λ); for
other likelihoods the next steps repeat the correction at the new H until A x = 0 to the
tolerance. Both solves carry implicit derivatives, so the marginal's gradient in θ is exact.

That nested route (:func:`constrained_mode`) factorizes H in every inner step of every outer
step. With Newton (the Laplace default), :func:`kkt_mode` instead runs one Newton loop on the
KKT conditions in (x, λ) together: each iteration solves the bordered matrix [[H, Aᵀ], [A, 0]]
through one factorization of H and k extra triangular solves
(:class:`pymc_optim.linalg.bordered.BorderedStructure`), so an exact constraint costs about what
the unconstrained (or corner-constrained) field does.
Draws of N(x_c, H⁻¹) conditioned on A x = 0 are x − H⁻¹Aᵀ(AH⁻¹Aᵀ)⁻¹A x for x ~ N(x_c, H⁻¹)
(:func:`krige`). Each costs k solves with H's factor (k small: the columns of H⁻¹Aᵀ) and a
k × k dense Cholesky.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.bordered import BorderedStructure
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure

__all__ = ["constrained_logdet", "constrained_mode", "constraint_matrix", "kkt_mode", "krige"]


def constraint_matrix(transform) -> np.ndarray | None:
    """The (k, N) matrix A of a latent's linear constraint A x = 0, read off its transform
    (``constraint_matrix`` of :class:`~pymc_optim.distributions.gmrf.ComponentZeroSumTransform`
    and :class:`~pymc_optim.distributions.gmrf.NullSpaceTransform`), or None.

    Examples
    --------
    >>> from pymc_optim.distributions.gmrf import ICAR
    >>> from pymc_optim.model.constraints import constraint_matrix
    >>> import pymc as pm
    >>> with pm.Model() as model:
    ...     phi = ICAR("phi", edges=[(0, 1), (1, 2)])
    >>> constraint_matrix(model.rvs_to_transforms[phi]).tolist()
    [[1.0, 1.0, 1.0]]
    """
    matrix = getattr(transform, "constraint_matrix", None)
    return None if matrix is None else np.atleast_2d(np.asarray(matrix, dtype=np.float64))


def _solve_columns(structure: LinearStructure, hessian, columns) -> TensorVariable:
    """H⁻¹ B for the (d, k) constant B, with H's factor (sparse) or a dense solve."""
    columns = pt.as_tensor_variable(columns)
    if isinstance(structure, SparseStructure):
        return structure.pattern.solve(hessian, columns)
    if structure.kind == "dense":
        return pt.linalg.solve(hessian, columns, assume_a="pos")
    raise NotImplementedError(  # pragma: no cover - marginalize_laplace checks the structure
        f"kriging needs a dense or sparse Hessian; got {structure!r}"
    )


def _logdet_pd(matrix) -> TensorVariable:
    return 2.0 * pt.log(pt.diagonal(pt.linalg.cholesky(matrix))).sum()


def constrained_logdet(structure: LinearStructure, hessian, A: np.ndarray) -> TensorVariable:
    """log det(VᵀHV) = log det H + log det(AH⁻¹Aᵀ) − log det(AAᵀ): the log-determinant of H
    restricted to {A x = 0} (V an orthonormal basis of it), with k solves by H's factor.

    Examples
    --------
    >>> import numpy as np, pytensor.tensor as pt
    >>> from pymc_optim.linalg.structure import LinearStructure
    >>> from pymc_optim.model.constraints import constrained_logdet
    >>> H = np.array([[2.0, 0.5, 0.0], [0.5, 3.0, 0.4], [0.0, 0.4, 1.5]])
    >>> A = np.ones((1, 3))
    >>> V = np.linalg.svd(A)[2][1:].T  # orthonormal basis of {sum x = 0}
    >>> value = constrained_logdet(LinearStructure("dense"), pt.as_tensor(H), A).eval()
    >>> bool(np.isclose(value, np.linalg.slogdet(V.T @ H @ V)[1]))
    True
    """
    A = np.asarray(A, dtype=np.float64)
    schur = pt.as_tensor(A) @ _solve_columns(structure, hessian, A.T)
    return (
        structure.logdet_positive_definite(hessian)
        + _logdet_pd(0.5 * (schur + schur.T))
        - float(np.linalg.slogdet(A @ A.T)[1])
    )


def krige(structure: LinearStructure, hessian, A: np.ndarray, x) -> TensorVariable:
    """x − H⁻¹Aᵀ(AH⁻¹Aᵀ)⁻¹A x: conditioning by kriging on A x = 0 (x of shape (d,)).

    For x ~ N(m, H⁻¹) the result is distributed as x conditioned on A x = 0; for x the
    unconstrained mode of a Gaussian problem it is the constrained mode.

    Examples
    --------
    >>> import numpy as np, pytensor.tensor as pt
    >>> from pymc_optim.linalg.structure import LinearStructure
    >>> from pymc_optim.model.constraints import krige
    >>> H = np.array([[2.0, 0.5], [0.5, 3.0]])
    >>> x = krige(LinearStructure("dense"), pt.as_tensor(H), np.ones((1, 2)), np.array([1.0, 2.0]))
    >>> bool(abs(x.eval().sum()) < 1e-12)
    True
    """
    A = np.asarray(A, dtype=np.float64)
    columns = _solve_columns(structure, hessian, A.T)  # H⁻¹Aᵀ, (d, k)
    schur = pt.as_tensor(A) @ columns
    x = pt.as_tensor_variable(x)
    weights = pt.linalg.solve(0.5 * (schur + schur.T), pt.as_tensor(A) @ x, assume_a="pos")
    return x - columns @ weights


def constrained_mode(objective, z, x0, A: np.ndarray, *, solve):
    """argmin over {A z = 0} of `objective` (a scalar graph of the vector `z`): the KKT point
    by Newton on the k multipliers λ of A z(λ) = 0, z(λ) = argmin objective − λᵀ A z.

    `solve(objective, z, x0)` returns ``(z_star, success)`` of the unconstrained problem (the
    caller's solver and Hessian structure). Returns ``(z_c, success)``, both differentiable in
    the parameters of `objective` through the two solves' implicit derivatives.

    Examples
    --------
    The minimum of ½ zᵀ diag(1, 2, 4) z − Σ z subject to Σ z = 0 (one kriging step):

    >>> import numpy as np, pytensor.tensor as pt
    >>> from pymc_optim import minimize
    >>> from pymc_optim.model.constraints import constrained_mode
    >>> h = np.array([1.0, 2.0, 4.0])
    >>> z = pt.vector("z", shape=(3,))
    >>> solve = lambda f, x, x0: minimize(f, x, x0=x0, method="newton", structure="dense")
    >>> z_c, ok = constrained_mode(0.5 * (h * z**2).sum() - z.sum(), z, np.zeros(3),
    ...                            np.ones((1, 3)), solve=solve)
    >>> exact = 1 / h - (1 / h) * (1 / h).sum() / (1 / h).sum()  # z = (1 + λ)/h, Σz = 0
    >>> bool(np.allclose(z_c.eval(), exact)), bool(ok.eval())
    (True, True)
    """
    from pymc_optim.problems.root import root

    A = np.asarray(A, dtype=np.float64)
    k = A.shape[0]
    multipliers = pt.vector("constraint_multipliers", dtype=z.dtype, shape=(k,))
    z_of, success_of = solve(objective - multipliers @ (pt.as_tensor(A) @ z), z, x0)
    lam, lam_success = root(
        pt.as_tensor(A) @ z_of,
        multipliers,
        x0=np.zeros(k, dtype=z.dtype),
        method="newton",
        # one k × k block: its rows are k reverse passes through the inner solve (a dense
        # structure's vectorized Jacobian of a solver Op does not fit in memory for k > 1)
        structure="block_diagonal",
        block_size=k,
    )
    z_c, success = graph_replace([z_of, success_of], {multipliers: lam}, strict=False)
    return z_c, pt.all(success) & pt.all(lam_success)


def kkt_mode(objective, z, x0, A: np.ndarray, structure: LinearStructure, optimizer_kwargs=None):
    """argmin over {A z = 0} of `objective` by Newton on its KKT conditions in (z, λ),
    ∇objective(z) + Aᵀλ = 0 and A z = 0: each iteration one factorization of H, the Hessian in
    `structure` (sparse or dense), and k extra columns (`BorderedStructure`), where
    `constrained_mode` nests a solve of z(λ) in each of its steps in λ.

    Returns ``(z_c, success)``, differentiable in the parameters of `objective` through the
    root's implicit derivative (the KKT matrix's solve).

    Examples
    --------
    >>> import numpy as np, pytensor.tensor as pt
    >>> from pymc_optim.linalg.structure import LinearStructure
    >>> from pymc_optim.model.constraints import kkt_mode

    The minimum of ½ zᵀ diag(h) z − cᵀz subject to Σ z = 0, z = (c − λ) / h with
    λ = Σ(c/h) / Σ(1/h):

    >>> h, c = np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 3.0])
    >>> z = pt.vector("z", shape=(3,))
    >>> z_c, ok = kkt_mode(0.5 * (h * z**2).sum() - (c * z).sum(), z, np.zeros(3),
    ...                    np.ones((1, 3)), LinearStructure("dense"))
    >>> lam = (c / h).sum() / (1 / h).sum()
    >>> bool(np.allclose(z_c.eval(), (c - lam) / h)), bool(ok.eval())
    (True, True)
    """
    from pymc_optim.problems.root import root

    A = np.asarray(A, dtype=np.float64)
    k = A.shape[0]
    multipliers = pt.vector("constraint_multipliers", dtype=z.dtype, shape=(k,))
    B = pt.as_tensor(A.astype(z.dtype))
    (z_c, _), success = root(
        [grad(objective, z) + B.T @ multipliers, B @ z],
        [z, multipliers],
        x0=[x0, np.zeros(k, dtype=z.dtype)],
        method="newton",
        structure=BorderedStructure(hessian=structure, border=A),
        optimizer_kwargs=optimizer_kwargs,
    )
    return z_c, success
