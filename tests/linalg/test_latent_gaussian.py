"""`pymc_optim.linalg.latent_gaussian`: H = Q + W and K⁻¹ + W (K kept) against dense algebra.

Tolerances: the operator and numpy compute the same quantities with different factorizations
(B = I + W^½ K W^½ against K⁻¹ + W) of 5 × 5 matrices with condition numbers ≲ 1e2, so they
agree to rounding (~1e-14); 1e-10 leaves a wide margin and would still catch any wrong term.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

from pymc_optim.backends.numba_latent_gaussian import NUMBA_LOOPS_MAX
from pymc_optim.linalg.latent_gaussian import (
    BCholesky,
    CovarianceConditionStructure,
    LatentGaussianStructure,
    cholesky_inverse,
    covariance_solve,
    logdet_b,
    lower_solve,
    plus_diagonal,
)

N = 5


@pytest.fixture
def case():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((N, N))
    return a @ a.T + N * np.eye(N), rng.uniform(0.1, 3.0, N), rng.standard_normal(N)


def _compact(form, prior, w):
    structure = LatentGaussianStructure(form=form)
    return structure.jacobian(None, None, pt.as_tensor(prior), pt.as_tensor(w))


def _dense(form, prior, w):
    return (prior if form == "precision" else np.linalg.inv(prior)) + np.diag(w)


@pytest.mark.parametrize("form", ["precision", "covariance"])
def test_solve_logdet_and_sampling_match_dense_algebra(form, case):
    jax = pytest.importorskip("jax")
    # float64 in JAX, as PyTensor's JAX backend sets it on import (this test may run first)
    pytest.importorskip("pytensor.link.jax.dispatch")
    prior, w, rhs = case
    structure = LatentGaussianStructure(form=form)
    H = _dense(form, prior, w)
    A = _compact(form, prior, w)
    A_value = A.eval()
    expected = np.linalg.solve(H, rhs)
    assert_allclose(structure.solve(A, pt.as_tensor(rhs)).eval(), expected, rtol=1e-10)
    assert_allclose(structure.solve_numpy(A_value, rhs), expected, rtol=1e-10)
    jax_solve = structure.solve_array(jax.numpy.asarray(A_value), jax.numpy.asarray(rhs), jax.numpy)
    assert_allclose(np.asarray(jax_solve), expected, rtol=1e-10)
    assert_allclose(
        structure.logdet_positive_definite(A).eval(), np.linalg.slogdet(H)[1], rtol=1e-12
    )
    # the draw is linear in the noise, mean + M ε: its covariance M Mᵀ must be H⁻¹
    noise = pt.vector("noise")
    draw = structure.sample_gaussian(pt.zeros(N), A, noise)
    M = np.stack([draw.eval({noise: e}) for e in np.eye(N)], axis=1)
    assert_allclose(M @ M.T, np.linalg.inv(H), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
@pytest.mark.parametrize("form", ["precision", "covariance"])
def test_positive_definite_agrees_with_the_eigenvalues(form, mode, case):
    """The Newton curvature test, numpy and compiled graph alike, on a positive definite H and
    on one made indefinite by a negative curvature entry (w_0 below −1/(K⁻¹)⁻¹_00's scale)."""
    if mode is not None:
        pytest.importorskip(mode.lower())
    prior, w, _ = case
    structure = LatentGaussianStructure(form=form)
    A_in = pt.matrix("A", dtype="float64")
    fn = pytensor.function([A_in], structure.positive_definite(A_in), mode=mode)
    truths = []
    for w_case in (w, np.concatenate([[-50.0], w[1:]])):
        truth = np.linalg.eigvalsh(_dense(form, prior, w_case)).min() > 0
        truths.append(truth)
        A_value = _compact(form, prior, w_case).eval()
        assert structure.positive_definite_numpy(A_value).tolist() == [truth]
        assert np.asarray(fn(A_value)).tolist() == [truth]
    assert truths == [True, False]  # the premise: one of each
    nan = _compact(form, prior, np.full(N, np.nan)).eval()
    assert structure.positive_definite_numpy(nan).tolist() == [False]
    assert np.asarray(fn(nan)).tolist() == [False]


def test_covariance_form_refuses_negative_curvature_in_its_solve(case):
    prior, w, rhs = case
    A = _compact("covariance", prior, -w).eval()
    with pytest.raises(np.linalg.LinAlgError, match="negative likelihood curvature"):
        LatentGaussianStructure(form="covariance").solve_numpy(A, rhs)


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_covariance_condition_solves_i_plus_kw_without_factorizing_k(case, mode):
    """A = I + K W, the Jacobian of (z − μ) + K∇(−log p(y | z)): its solves (and the
    transposed one the implicit pullback makes), log det and positive-definiteness test against
    dense algebra, symbolic in each backend and numerical (numpy, JAX), on the Join
    `jacobian` builds and on a plain [K; wᵀ] array (the numba loop's A)."""
    if mode is not None:
        pytest.importorskip(mode.lower())
    jax = pytest.importorskip("jax")
    pytest.importorskip("pytensor.link.jax.dispatch")
    K, w, rhs = case
    structure = CovarianceConditionStructure()
    jacobian = np.eye(N) + K * w  # I + K W
    joined = structure.jacobian_at_solution(pt.as_tensor(K), pt.as_tensor(w))
    # (JAX needs B's size, I's, static; the numba loop's A has none)
    plain = pt.matrix("A", dtype="float64", shape=(N + 1, N) if mode == "JAX" else (None, None))
    r = pt.vector("r", dtype="float64")
    for A, inputs in [(joined, [r]), (plain, [plain, r])]:
        outputs = [
            structure.solve(A, r, transposed=False, symmetric=False),
            structure.solve(A, r, transposed=True, symmetric=False),
            structure.logdet_positive_definite(A),
            structure.positive_definite(A),
        ]
        fn = pytensor.function(inputs, outputs, mode=mode)
        args = [np.vstack([K, w]), rhs] if A is plain else [rhs]
        solved, solved_t, logdet, positive = fn(*args)
        assert_allclose(solved, np.linalg.solve(jacobian, rhs), rtol=1e-10)
        assert_allclose(solved_t, np.linalg.solve(jacobian.T, rhs), rtol=1e-10)
        assert_allclose(logdet, np.linalg.slogdet(jacobian)[1], rtol=1e-12)
        assert positive.tolist() == [True]
        names = [type(node.op).__name__ for node in fn.maker.fgraph.toposort()]
        assert "Cholesky" not in names or A is plain  # (plain A: B's factor written out)
    A_value = np.vstack([K, w])
    assert_allclose(structure.solve_numpy(A_value, rhs), np.linalg.solve(jacobian, rhs), rtol=1e-10)
    jax_solve = structure.solve_array(jax.numpy.asarray(A_value), jax.numpy.asarray(rhs), jax.numpy)
    assert_allclose(np.asarray(jax_solve), np.linalg.solve(jacobian, rhs), rtol=1e-10)
    assert structure.positive_definite_numpy(A_value).tolist() == [True]
    negative = np.vstack([K, -w])
    assert structure.positive_definite_numpy(negative).tolist() == [False]
    assert fn(negative, rhs)[3].tolist() == [False]
    with pytest.raises(np.linalg.LinAlgError, match="negative likelihood curvature"):
        structure.solve_numpy(negative, rhs)


def test_unknown_form_raises():
    with pytest.raises(ValueError, match="`form` must be one of 'precision', 'covariance'"):
        LatentGaussianStructure(form="banded")


def test_form_given_by_position_raises():
    with pytest.raises(ValueError, match="takes `form` by keyword.*got kind='covariance'"):
        LatentGaussianStructure("covariance")


def test_jacobian_without_parts_raises():
    with pytest.raises(ValueError, match="builds A from its parts"):
        LatentGaussianStructure().jacobian(pt.vector("F"), [pt.vector("x")])


def _central_difference(f, x, step=1e-6):
    """∂f/∂x entry by entry (x an array): truncation ~step² ≈ 1e-12, rounding ~1e-16/step ≈
    1e-10 for these O(1) functions of 5 × 5 matrices, hence the 1e-7 tolerance below."""
    out = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[index] = step
        out[index] = (f(x + e) - f(x - e)) / (2 * step)
    return out


def test_logdet_b_and_its_hand_written_gradient_match_dense_algebra(case):
    K, w, _ = case
    Kv, wv = pt.matrix("K"), pt.vector("w")
    value = logdet_b(Kv, wv)
    fn = pytensor.function([Kv, wv], [value, *pytensor.grad(value, [Kv, wv])])
    got, dK, dw = fn(K, w)

    def dense(K, w):
        return np.linalg.slogdet(np.eye(N) + np.sqrt(w)[:, None] * K * np.sqrt(w))[1]

    assert_allclose(got, dense(K, w), rtol=1e-12)
    assert_allclose(got, np.linalg.slogdet(_dense("covariance", K, w))[1] + np.linalg.slogdet(K)[1])
    # ∂/∂K_ij of log det(I + S K S) for K's entries taken one by one (not symmetrized)
    assert_allclose(dK, _central_difference(lambda k: dense(k, w), K), atol=1e-7)
    assert_allclose(dw, _central_difference(lambda v: dense(K, v), w), atol=1e-7)
    assert_allclose(dw, np.diag(np.linalg.inv(_dense("covariance", K, w))), rtol=1e-10)
    # negative curvature: B = I + W^½ K W^½ undefined, NaN (not an error)
    assert np.isnan(fn(K, -w)[0])


def test_covariance_solve_is_differentiated_through_k_alone(case):
    K, _, b = case
    Kv, bv = pt.matrix("K"), pt.vector("b")
    L = pt.linalg.cholesky(Kv)
    value = (bv * covariance_solve(Kv, L, bv)).sum()
    fn = pytensor.function([Kv, bv], [value, *pytensor.grad(value, [Kv, bv])])
    got, dK, db = fn(K, b)
    alpha = np.linalg.solve(K, b)
    assert_allclose(got, b @ alpha, rtol=1e-12)
    assert_allclose(dK, -np.outer(alpha, alpha), rtol=1e-10)
    assert_allclose(db, 2 * alpha, rtol=1e-10)
    # the hand-written gradient replaces the Cholesky gradient: no triangular solve is left
    ops = [type(node.op).__name__ for node in fn.maker.fgraph.toposort()]
    assert "SolveTriangular" not in ops and ops.count("Cholesky") == 1


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_b_cholesky_factorizes_b_and_is_differentiable(case, mode):
    if mode is not None:
        pytest.importorskip(mode.lower())
    K, w, _ = case
    Kv, wv = pt.matrix("K"), pt.vector("w")
    L = BCholesky()(Kv, wv)
    B = np.eye(N) + np.sqrt(w)[:, None] * K * np.sqrt(w)
    with warnings.catch_warnings():
        # numba's object-mode fallback warns: BCholesky must compile natively
        warnings.filterwarnings("error", message=".*object mode.*BCholesky")
        fn = pytensor.function([Kv, wv], L, mode=mode)
        assert_allclose(fn(K, w), np.linalg.cholesky(B), rtol=1e-12, atol=1e-14)
    assert np.all(np.isnan(fn(K, -w)))
    assert np.all(np.isnan(fn(K, np.where(np.arange(N) == 0, np.nan, w))))
    # B indefinite (K with a negative eigenvalue of −2, so I + K has one of −1): all NaN
    assert np.all(np.isnan(fn(np.diag(np.r_[-2.0, np.ones(N - 1)]), np.ones(N))))
    # its gradient is that of the written-out factorization
    cost = (L * np.arange(N * N).reshape(N, N)).sum()
    written = pt.linalg.cholesky(pt.eye(N) + pt.sqrt(wv)[:, None] * Kv * pt.sqrt(wv)[None, :])
    expected = (written * np.arange(N * N).reshape(N, N)).sum()
    got = pytensor.function([Kv, wv], pytensor.grad(cost, [Kv, wv]))(K, w)
    want = pytensor.function([Kv, wv], pytensor.grad(expected, [Kv, wv]))(K, w)
    for g, e in zip(got, want, strict=True):
        assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_cholesky_inverse_is_the_inverse_and_is_differentiable(case, mode):
    if mode is not None:
        pytest.importorskip(mode.lower())
    K, _, _ = case
    L = np.linalg.cholesky(K)
    Lv = pt.matrix("L")
    X = cholesky_inverse(Lv)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*object mode.*CholeskyInverse")
        fn = pytensor.function([Lv], X, mode=mode)
        assert_allclose(fn(L), np.linalg.inv(K), rtol=1e-12, atol=1e-14)
        # a Fortran-ordered factor (LAPACK's own layout) gives the same
        assert_allclose(fn(np.asfortranarray(L)), np.linalg.inv(K), rtol=1e-12, atol=1e-14)
    if mode is None:  # NaN for a non-finite factor (the other backends propagate it)
        assert np.all(np.isnan(fn(np.where(np.eye(N, dtype=bool), np.nan, L))))
    # its gradient is that of the written-out inverse of L Lᵀ
    weights = np.arange(N * N).reshape(N, N) / N
    got = pytensor.function([Lv], pytensor.grad((X * weights).sum(), Lv))(L)
    written = pt.linalg.inv(Lv @ Lv.T)
    want = pytensor.function([Lv], pytensor.grad((written * weights).sum(), Lv))(L)
    assert_allclose(got, np.tril(want), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 7, NUMBA_LOOPS_MAX, NUMBA_LOOPS_MAX + 1])
def test_numba_cholesky_inverse_matches_lapack_on_both_sides_of_its_loop_limit(n):
    """Under numba, (L Lᵀ)⁻¹ is computed by loops up to NUMBA_LOOPS_MAX and by potrs
    above; both are the inverse to rounding (a few ulps times n for this well-conditioned A)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(n)
    M = rng.normal(size=(n, n))
    A = M @ M.T / max(n, 1) + np.eye(n)
    Lv = pt.matrix("L")
    fn = pytensor.function([Lv], cholesky_inverse(Lv), mode="NUMBA")
    L = np.linalg.cholesky(A)
    assert_allclose(fn(L), np.linalg.inv(A), rtol=0, atol=1e-12)
    assert_allclose(fn(np.asfortranarray(L)), np.linalg.inv(A), rtol=0, atol=1e-12)
    if n:
        assert np.all(np.isnan(fn(np.where(np.eye(n, dtype=bool), np.inf, L))))


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_lower_solve_is_the_triangular_solve_and_is_differentiable(case, mode):
    if mode is not None:
        pytest.importorskip(mode.lower())
    K, _, _ = case
    L = np.linalg.cholesky(K)
    M = np.arange(N * 3, dtype=float).reshape(N, 3) - 4.0
    Lv, Mv = pt.matrix("L"), pt.matrix("M")
    X = lower_solve(Lv, Mv)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*object mode.*LowerSolve")
        fn = pytensor.function([Lv, Mv], X, mode=mode)
        assert_allclose(fn(L, M), np.linalg.solve(L, M), rtol=1e-12, atol=1e-13)
        assert_allclose(fn(np.asfortranarray(L), M), np.linalg.solve(L, M), rtol=1e-12, atol=1e-13)
    weights = np.arange(N * 3).reshape(N, 3) / N
    written = pt.linalg.solve_triangular(Lv, Mv, lower=True, b_ndim=2)
    got = pytensor.function([Lv, Mv], pytensor.grad((X * weights).sum(), [Lv, Mv]))(L, M)
    want = pytensor.function([Lv, Mv], pytensor.grad((written * weights).sum(), [Lv, Mv]))(L, M)
    assert_allclose(got[0], np.tril(want[0]), rtol=1e-10, atol=1e-12)
    assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 7, NUMBA_LOOPS_MAX, NUMBA_LOOPS_MAX + 1])
def test_numba_lower_solve_matches_lapack_on_both_sides_of_its_loop_limit(n):
    pytest.importorskip("numba")
    rng = np.random.default_rng(n)
    A = rng.normal(size=(n, n))
    L = np.linalg.cholesky(A @ A.T / n + np.eye(n))
    M = rng.normal(size=(n, 4))
    Lv, Mv = pt.matrix("L"), pt.matrix("M")
    fn = pytensor.function([Lv, Mv], lower_solve(Lv, Mv), mode="NUMBA")
    assert_allclose(fn(L, M), np.linalg.solve(L, M), rtol=0, atol=1e-11)


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_plus_diagonal_adds_w_to_the_diagonal_and_is_differentiable(case, mode):
    if mode is not None:
        pytest.importorskip(mode.lower())
    K, w, _ = case
    K_before = K.copy()
    Kv, wv = pt.matrix("K"), pt.vector("w")
    A = plus_diagonal(Kv, wv)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*object mode.*PlusDiagonal")
        fn = pytensor.function([Kv, wv], A, mode=mode)
        assert_allclose(fn(K, w), K + np.diag(w), rtol=0, atol=0)
    assert_allclose(K, K_before, rtol=0, atol=0)  # the input is not modified in place
    weights = np.arange(N * N).reshape(N, N)
    got = pytensor.function([Kv, wv], pytensor.grad((A * weights).sum(), [Kv, wv]))(K, w)
    assert_allclose(got[0], weights)
    assert_allclose(got[1], np.diagonal(weights))
