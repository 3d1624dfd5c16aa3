"""The KKT matrix of linear equality constraints (pymc_optim.linalg.bordered): its Schur
complement solve through H's factor against the dense KKT matrix, for a sparse and a dense H."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from pymc_optim.linalg.bordered import BorderedStructure
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure

# Backward-stable Cholesky and LU solves of matrices with condition numbers ≲ 10³: ~1e-13
# relative to LAPACK's dense KKT solve; 1e-9 leaves four orders of margin.
RTOL = 1e-9

N = 30


def sparse_case(k):
    edges = np.stack([np.arange(N - 1), np.arange(1, N)], axis=1)
    hessian = SparseStructure.from_edges(edges, N)
    pattern = hessian.pattern
    rng = np.random.default_rng(k)
    A = np.where(pattern.rows == pattern.cols, 3.0, -1.0) + 0.1 * rng.random(pattern.nnz)
    return hessian, A


def dense_case(k):
    rng = np.random.default_rng(k)
    M = rng.normal(size=(N, N))
    return LinearStructure("dense"), M @ M.T + N * np.eye(N)


@pytest.fixture(
    params=[(sparse_case, 1), (sparse_case, 3), (dense_case, 1), (dense_case, 3)],
    ids=["sparse-k1", "sparse-k3", "dense-k1", "dense-k3"],
)
def problem(request):
    case, k = request.param
    hessian, A = case(k)
    border = np.vstack([np.ones(N), np.random.default_rng(10 + k).normal(size=(k - 1, N))])
    structure = BorderedStructure(hessian=hessian, border=border)
    return structure, A, structure.dense_matrix(A)


def test_solves_match_the_dense_kkt_matrix(problem):
    structure, A, K = problem
    rhs = np.random.default_rng(5).normal(size=K.shape[0])
    expected = np.linalg.solve(K, rhs)
    a = pt.tensor("A", shape=(None,) * structure.compact_ndim)
    b = pt.dvector("b")
    f = pytensor.function(
        [a, b],
        [
            structure.solve(a, b, transposed=False, symmetric=False),
            structure.solve(a, b, transposed=True, symmetric=False),
        ],
    )
    solved, solved_transposed = f(A, rhs)
    np.testing.assert_allclose(solved, expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())
    # K is symmetric: its transposed solve is the same solve
    np.testing.assert_allclose(solved_transposed, solved, rtol=RTOL)
    np.testing.assert_allclose(
        structure.solve_numpy(A, rhs), expected, rtol=RTOL, atol=RTOL * np.abs(expected).max()
    )


def test_the_solution_satisfies_the_constraints_exactly(problem):
    structure, A, _ = problem
    rhs = np.concatenate([np.random.default_rng(2).normal(size=N), np.zeros(structure.k)])
    u = structure.solve_numpy(A, rhs)[:N]
    np.testing.assert_allclose(structure.border @ u, 0.0, atol=1e-12 * np.abs(u).max())


def test_positive_definite_is_the_hessian_test(problem):
    structure, A, _ = problem
    assert bool(np.all(structure.positive_definite_numpy(A)))
    negated = -A
    assert not bool(np.all(structure.positive_definite_numpy(negated)))


def test_indefinite_matrix_has_no_logdet_or_draws(problem):
    structure, A, _ = problem
    with pytest.raises(NotImplementedError, match="indefinite"):
        structure.logdet_positive_definite(pt.as_tensor(A))
    with pytest.raises(NotImplementedError, match="indefinite"):
        structure.sample_gaussian(pt.zeros(N), pt.as_tensor(A), pt.zeros(N))


@pytest.mark.parametrize(
    "hessian, border, error, match",
    [
        (LinearStructure("diagonal"), np.ones((1, N)), TypeError, "`hessian` must be"),
        (LinearStructure("dense"), np.ones((N, N)), ValueError, r"shape \(k, n\)"),
        (LinearStructure("dense"), np.ones((2, N)), ValueError, "full row rank"),
    ],
)
def test_bad_input_is_refused(hessian, border, error, match):
    with pytest.raises(error, match=match):
        BorderedStructure(hessian=hessian, border=border)


def test_equality_and_hash_follow_the_hessian_and_border():
    hessian, _ = sparse_case(1)
    one = BorderedStructure(hessian=hessian, border=np.ones((1, N)))
    same = BorderedStructure(hessian=hessian, border=np.ones((1, N)))
    other = BorderedStructure(hessian=hessian, border=np.arange(N, dtype=float)[None])
    assert one == same and hash(one) == hash(same)
    assert one != other
