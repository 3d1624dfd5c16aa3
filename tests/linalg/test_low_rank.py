"""Sparse plus low rank, H = S + Jᵀ C J (pymc_optim.linalg.low_rank): the structure against the
dense oracle, its detection on the graphs users write, and the solvers and Laplace marginals
that use it."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim import PymcOptimWarning
from pymc_optim.linalg.detect import SPARSE_MIN_SIZE, sparse_hessian_structure
from pymc_optim.linalg.low_rank import LowRankUpdateStructure, low_rank_hessian_structure
from pymc_optim.linalg.sparse import SparseStructure

# Backward-stable Cholesky and LU computations of matrices with condition numbers ≲ 10³ (the
# soft penalty's C adds one large eigenvalue along J, which the lemma handles exactly): ~1e-12
# relative to LAPACK's dense results; 1e-8 leaves four orders of margin.
RTOL = 1e-8


def chain_structure(n, loadings):
    edges = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    return LowRankUpdateStructure(sparse=SparseStructure.from_edges(edges, n), loadings=loadings)


def compact(structure, seed=0, C=None):
    """A in compact form: S diagonally dominant on the chain pattern, C positive definite."""
    rng = np.random.default_rng(seed)
    pattern = structure.sparse.pattern
    S = np.where(pattern.rows == pattern.cols, 3.0, -1.0) + 0.1 * rng.random(pattern.nnz)
    if C is None:
        B = rng.normal(size=(structure.rank, structure.rank))
        C = B @ B.T + 0.5 * np.eye(structure.rank)
    return np.concatenate([S, np.ravel(C)])


@pytest.fixture(params=[1, 3], ids=lambda k: f"k={k}")
def problem(request):
    n, k = 40, request.param
    loadings = np.vstack([np.ones(n), np.random.default_rng(k).normal(size=(k - 1, n))])
    structure = chain_structure(n, loadings)
    A = compact(structure)
    return structure, A, structure.dense_matrix(A)


def test_solve_logdet_and_gradient_match_the_dense_matrix(problem):
    structure, A, H = problem
    rhs = np.random.default_rng(5).normal(size=(H.shape[0], 2))
    a, b, B = pt.dvector("A"), pt.dvector("b"), pt.dmatrix("B")
    logdet = structure.logdet_positive_definite(a)
    f = pytensor.function(
        [a, b, B],
        [
            structure.solve(a, b, transposed=False, symmetric=True),
            structure.solve(a, B, transposed=False, symmetric=True),
            logdet,
            pytensor.grad(logdet, a),
        ],
    )
    x, X, value, gradient = f(A, rhs[:, 0], rhs)
    np.testing.assert_allclose(x, np.linalg.solve(H, rhs[:, 0]), rtol=RTOL)
    np.testing.assert_allclose(X, np.linalg.solve(H, rhs), rtol=RTOL)
    np.testing.assert_allclose(structure.solve_numpy(A, rhs), X, rtol=RTOL)
    np.testing.assert_allclose(value, np.linalg.slogdet(H)[1], rtol=RTOL)
    # d log det H = tr(H⁻¹ dH): S's entries on both symmetric positions, C through J
    H_inv = np.linalg.inv(H)
    pattern, J = structure.sparse.pattern, structure.loadings
    weight = np.where(pattern.rows == pattern.cols, 1.0, 2.0)
    expected = np.concatenate(
        [weight * H_inv[pattern.rows, pattern.cols], (J @ H_inv @ J.T).ravel()]
    )
    np.testing.assert_allclose(gradient, expected, rtol=RTOL)
    np.testing.assert_allclose(structure.matvec_numpy(A, rhs[:, 0]), H @ rhs[:, 0], rtol=RTOL)


def test_positive_definite_tests_agree_with_the_eigenvalues(problem):
    structure, A, H = problem
    a = pt.dvector("A")
    test = pytensor.function([a], structure.positive_definite(a))
    k = structure.rank
    indefinite = compact(structure, C=-50.0 * np.eye(k))  # S + Jᵀ C J with a negative direction
    assert np.linalg.eigvalsh(structure.dense_matrix(indefinite)).min() < 0
    assert test(A).tolist() == [True] and structure.positive_definite_numpy(A).tolist() == [True]
    assert test(indefinite).tolist() == [False]
    assert structure.positive_definite_numpy(indefinite).tolist() == [False]
    # a margin: H − τI positive definite iff τ is below the smallest eigenvalue
    smallest = np.linalg.eigvalsh(H).min()
    assert structure.positive_definite_numpy(A, margin=0.9 * smallest).tolist() == [True]
    assert structure.positive_definite_numpy(A, margin=1.1 * smallest).tolist() == [False]


def test_draws_are_a_linear_map_with_covariance_h_inverse(problem):
    structure, A, H = problem
    n = H.shape[0]
    a, mean, noise = pt.dvector("A"), pt.dvector("mean"), pt.dmatrix("noise")
    draw = pytensor.function([a, mean, noise], structure.sample_gaussian(mean, a, noise))
    T = draw(A, np.zeros(n), np.eye(n))  # draw = mean + T ε
    np.testing.assert_allclose(T @ T.T, np.linalg.inv(H), rtol=1e-7, atol=1e-12)
    one = pt.dvector("one")
    epsilon = np.random.default_rng(2).normal(size=n)
    single = pytensor.function([a, mean, one], structure.sample_gaussian(mean, a, one))
    np.testing.assert_allclose(single(A, np.ones(n), epsilon), 1.0 + T @ epsilon, rtol=RTOL)


def test_structures_compare_by_pattern_and_loadings():
    J = np.ones((1, 30))
    assert chain_structure(30, J) == chain_structure(30, J.copy())
    assert hash(chain_structure(30, J)) == hash(chain_structure(30, J.copy()))
    assert chain_structure(30, J) != chain_structure(30, 2.0 * J)
    assert "rank=1" in repr(chain_structure(30, J))
    with pytest.raises(ValueError, match=r"`loadings` must have shape \(k, 30\)"):
        chain_structure(30, np.ones((1, 29)))
    with pytest.raises(TypeError, match="`sparse` must be a SparseStructure"):
        LowRankUpdateStructure(sparse=None, loadings=J)


# --- detection on the graphs users write ---------------------------------------------------
N = SPARSE_MIN_SIZE + 44  # 300: "auto" looks for sparse layouts from SPARSE_MIN_SIZE on


def chain_objective(extra):
    x = pt.vector("x", shape=(N,))
    counts = np.arange(N) % 4
    objective = 0.5 * ((x[1:] - x[:-1]) ** 2).sum() + (pt.exp(x) - counts * x).sum()
    return x, objective + extra(x)


def detect(objective, x):
    return sparse_hessian_structure(objective, [x], [N])


@pytest.mark.parametrize(
    "extra, loadings",
    [
        (lambda x: 0.5 * (x.sum() / (0.001 * N)) ** 2, [np.ones(N)]),  # pm.ICAR's soft penalty
        (lambda x: 3.0 * x.mean() ** 2, [np.ones(N)]),
        (lambda x: pt.exp(pt.dot(np.linspace(0, 1, N), x) / N), [np.linspace(0, 1, N)]),
        (
            lambda x: x[:150].sum() ** 2 + x[150:].sum() ** 2,
            [np.r_[np.ones(150), np.zeros(150)], np.r_[np.zeros(150), np.ones(150)]],
        ),
    ],
    ids=["soft_sum_to_zero", "mean", "weighted", "two_halves"],
)
def test_auto_cuts_the_sums_of_x_and_keeps_the_rest_sparse(extra, loadings):
    x, objective = chain_objective(extra)
    found = detect(objective, x)
    assert isinstance(found, LowRankUpdateStructure)
    assert found.sparse.pattern.nnz == 2 * N - 1  # the chain: S is the cut graph's Hessian
    J = found.loadings
    assert found.rank == len(loadings)
    for row in loadings:  # each expected row is one of J's rows
        assert min(np.abs(J - row).max(axis=1)) < 1e-12


def test_terms_not_separable_in_the_sum_or_linear_in_it_are_not_cut():
    # h(Σx) g(x): ∂²/∂x∂r ≠ 0, no such split; the plain reading then finds H dense
    x, objective = chain_objective(lambda x: x.sum() ** 2 * (x**2).sum())
    assert detect(objective, x) is None
    assert low_rank_hessian_structure(objective, [x], [N], 10**6) is None
    # a term linear in Σx has no curvature: the chain's plain sparse structure
    x, objective = chain_objective(lambda x: 0.3 * x.sum())
    found = detect(objective, x)
    assert type(found) is SparseStructure


def test_more_sums_than_the_limit_warn_and_are_not_split():
    def penalties(x):  # one soft penalty per block of 30: ten sums
        return sum(x[30 * i : 30 * (i + 1)].sum() ** 2 for i in range(10))

    x, objective = chain_objective(penalties)
    with pytest.warns(PymcOptimWarning, match=r"through 10 sums of it.*at most 8"):
        assert low_rank_hessian_structure(objective, [x], [N], 10**6) is None


def test_a_structure_found_on_another_graph_is_refused():
    x, objective = chain_objective(lambda x: x.sum() ** 2)
    other = chain_structure(N, np.linspace(1, 2, N)[None, :])
    F = pytensor.grad(objective, x)
    with pytest.raises(ValueError, match="was not found with"):
        other.jacobian(F, [x])


# --- solvers -------------------------------------------------------------------------------
def soft_chain_problem():
    x, tau = pt.vector("x", shape=(N,)), pt.scalar("tau")
    counts = np.arange(N) % 4
    objective = 0.5 * tau * ((x[1:] - x[:-1]) ** 2).sum() + (pt.exp(x) - counts * x).sum()
    objective = objective + 0.5 * (x.sum() / (0.01 * N)) ** 2
    return x, tau, objective


def dense_reference(tau):
    """The minimizer by scipy on the dense objective, and H there."""
    counts = np.arange(N) % 4
    c = 1.0 / (0.01 * N) ** 2
    D = np.diff(np.eye(N), axis=0)

    def gradient(x):
        return tau * D.T @ (D @ x) + np.exp(x) - counts + c * x.sum()

    def hessian(x):
        return tau * D.T @ D + np.diag(np.exp(x)) + c

    x = np.zeros(N)
    for _ in range(50):
        x = x - np.linalg.solve(hessian(x), gradient(x))
    return x, hessian(x)


@pytest.mark.parametrize("method", ["newton", "trust-exact", "BFGS"])
def test_minimize_auto_solves_with_the_split_and_differentiates(method):
    x, tau, objective = soft_chain_problem()
    options = {"hess": True} if method == "trust-exact" else {}
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(N), method=method, **options)
    if method == "newton":
        assert isinstance(x_star.owner.op.condition.structure, LowRankUpdateStructure)
    loss = (x_star**2).sum()
    f = pytensor.function([tau], [x_star, success, pytensor.grad(loss, tau)])
    xs, ok, g = f(1.3)
    reference, H = dense_reference(1.3)
    assert ok
    tolerance = RTOL if method == "newton" else 1e-4  # scipy's quasi-Newton stops at gtol
    np.testing.assert_allclose(xs, reference, rtol=tolerance, atol=1e-10)
    # dx*/dτ = −H⁻¹ ∂F/∂τ = −H⁻¹ Dᵀ D x*
    D = np.diff(np.eye(N), axis=0)
    expected = 2 * xs @ -np.linalg.solve(H, D.T @ (D @ xs))
    np.testing.assert_allclose(g, expected, rtol=1e-6 if method != "newton" else RTOL)


@pytest.mark.slow
def test_newton_with_the_split_runs_natively_under_numba():
    x, tau, objective = soft_chain_problem()
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(N), method="newton")
    loss = (x_star**2).sum()
    f = pytensor.function([tau], [x_star, success, pytensor.grad(loss, tau)], mode="NUMBA")
    c = pytensor.function([tau], [x_star, success, pytensor.grad(loss, tau)])
    for got, expected in zip(f(0.7), c(0.7), strict=True):
        np.testing.assert_allclose(got, expected, rtol=RTOL)


# --- Laplace marginals -----------------------------------------------------------------------
# the models and the independent scipy.sparse reference are the benchmark's
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_low_rank  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("form", ["pm.ICAR", "CustomDist"])
def test_icar_with_the_soft_sum_to_zero_is_sparse_plus_rank_one(form):
    side = 18  # 324 areas
    model, edges, counts = bench_low_rank.icar_poisson_model(side, form)
    with warnings.catch_warnings():
        # a CustomDist's prior is not known to be Gaussian (this one is)
        warnings.filterwarnings("ignore", "The prior of `phi`", PymcOptimWarning)
        marginal = pmo.marginalize_laplace(model, "phi")
        dense = pmo.marginalize_laplace(model, "phi", hessian_structure="dense")
    structure = pmo.laplace_info(marginal).structure
    assert isinstance(structure, LowRankUpdateStructure) and structure.rank == 1
    assert structure.sparse.pattern.nnz == side * side + len(edges)
    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    ops = {type(node.op).__name__ for node in dlogp.f.maker.fgraph.apply_nodes}
    assert {"SelectedInverseOp", "SparseSolveOp"} <= ops
    logp_dense, dlogp_dense = dense.compile_logp(), dense.compile_dlogp()
    for b, log_sigma in [(0.9, -0.5), (1.2, 0.3)]:
        point = {"b": b, "sigma_log__": log_sigma}
        np.testing.assert_allclose(logp(point), logp_dense(point), rtol=RTOL)
        np.testing.assert_allclose(dlogp(point), dlogp_dense(point), rtol=1e-7)
        if form == "CustomDist":
            # the marginal of φ alone (the priors of b and σ and σ's Jacobian taken off)
            priors = (
                pm.logp(pm.Normal.dist(1.0, 1.0), b).eval()
                + pm.logp(pm.HalfNormal.dist(1.0), np.exp(log_sigma)).eval()
                + log_sigma
            )
            reference = bench_low_rank.scipy_sparse_marginal(edges, counts, b, np.exp(log_sigma))
            np.testing.assert_allclose(logp(point) - priors, reference, rtol=RTOL)
