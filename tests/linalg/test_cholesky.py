"""The numba sparse Cholesky kernels: the supernodal factorization against the simplicial one."""

import numpy as np
import pytest
import scipy.sparse as sp

from pymc_optim.linalg import _cholesky


def spd_pattern(n, density, seed):
    """A random sparse SPD matrix (diagonally dominant), lower-triangle COO entries."""
    rng = np.random.default_rng(seed)
    A = sp.random(n, n, density=density, random_state=rng, format="coo")
    A = A + A.T
    A = A + sp.diags(np.asarray(abs(A).sum(axis=1)).ravel() + rng.uniform(0.5, 2.0, n))
    lower = sp.tril(A).tocoo()
    return lower.row, lower.col, lower.data, A.toarray()


def grid(m):
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    eye = sp.identity(m)
    A = 1.7 * (sp.kron(eye, path) + sp.kron(path, eye)) + 0.3 * sp.identity(m * m)
    lower = sp.tril(A).tocoo()
    return lower.row, lower.col, lower.data, A.toarray()


CASES = {
    "n=1": grid(1),
    "grid 5x5": grid(5),
    "grid 30x30": grid(30),
    "random n=200": spd_pattern(200, 0.02, 0),
    "random dense-ish n=60": spd_pattern(60, 0.3, 1),
}


@pytest.mark.parametrize(
    "lapack_min", [1, _cholesky.LAPACK_MIN, 2**62], ids=["potrf", "auto-potrf", "loop-diag"]
)
@pytest.mark.parametrize("gemm_min", [0, _cholesky.GEMM_MIN, 2**62], ids=["gemm", "auto", "loops"])
@pytest.mark.parametrize("case", list(CASES))
def test_supernodal_factor_equals_the_simplicial_factor_and_lapack(case, gemm_min, lapack_min):
    """Both kernels give L of C = P A Pᵀ in the same block layout; the supernodal one through
    matrix products (gemm), loops, or the default mix for the updates, and LAPACK potrf/trsm or
    loops for the diagonal blocks. Agreement to rounding: both are backward-stable Cholesky
    factorizations of well-conditioned matrices."""
    rows, cols, values, dense = CASES[case]
    n = dense.shape[0]
    symbolic = _cholesky.analyse(rows, cols, n)
    simplicial, failed_simplicial = _cholesky.factorize_simplicial(symbolic, values)
    s = symbolic
    x = np.bincount(s.x_map, weights=values, minlength=int(s.sn_xptr[-1]))
    failed = _cholesky._numeric_supernodal(
        s.sn_start, s.sn_xptr, s.col_to_sn, s.sn_rowptr, s.sn_rows, x, gemm_min, lapack_min
    )
    assert failed == failed_simplicial == -1
    np.testing.assert_allclose(x, simplicial, rtol=1e-12, atol=1e-13)
    lx, _ = _cholesky.factorize(symbolic, values)
    L = np.zeros((n, n))
    L[s.l_indices, np.repeat(np.arange(n), np.diff(s.l_indptr))] = lx[s.l_to_x]
    permuted = dense[np.ix_(s.perm, s.perm)]
    np.testing.assert_allclose(L, np.linalg.cholesky(permuted), rtol=1e-10, atol=1e-12)
    if n > 1:
        assert s.sn_start.size - 1 < n or case == "n=1"  # some columns share a supernode


@pytest.mark.parametrize("lapack_min", [1, 2**62], ids=["potrf", "loop-diag"])
@pytest.mark.parametrize("case", ["grid 5x5", "random n=200", "random dense-ish n=60"])
def test_supernodal_factor_reports_the_simplicial_failing_pivot(case, lapack_min, monkeypatch):
    """An indefinite matrix: both kernels stop at the same pivot (the first non-positive one),
    the diagonal blocks by LAPACK or loops; a NaN is a failure too."""
    monkeypatch.setattr(_cholesky, "LAPACK_MIN", lapack_min)
    rows, cols, values, _ = CASES[case]
    n = int(rows.max()) + 1
    symbolic = _cholesky.analyse(rows, cols, n)
    shifted = values - 3.0 * np.where(rows == cols, np.abs(values).max(), 0.0) * (
        np.arange(values.size) % 2
    )
    _, failed = _cholesky.factorize(symbolic, shifted)
    _, failed_simplicial = _cholesky.factorize_simplicial(symbolic, shifted)
    assert failed >= 0 and failed == failed_simplicial
    nan_values = values.copy()
    nan_values[-1] = np.nan
    assert _cholesky.factorize(symbolic, nan_values)[1] >= 0


@pytest.mark.parametrize("lapack_min", [1, 2**62], ids=["potri", "loop-diag"])
@pytest.mark.parametrize("gemm_min", [0, 2**62], ids=["gemm", "loops"])
@pytest.mark.parametrize("case", list(CASES))
def test_supernodal_selected_inverse_equals_the_dense_inverse_and_the_column_recurrences(
    case, gemm_min, lapack_min, monkeypatch
):
    """(A⁻¹)_ij on A's pattern from the supernodal kernel, through matrix products or loops,
    its diagonal blocks through LAPACK or loops, against numpy's dense inverse and the column
    (simplicial) recurrences. Agreement to rounding: these matrices are diagonally dominant
    (condition number below ~10³), so 1e-10 relative to the largest entry leaves orders of
    magnitude of margin."""
    rows, cols, values, dense = CASES[case]
    n = dense.shape[0]
    symbolic = _cholesky.analyse(rows, cols, n)
    lx, failed = _cholesky.factorize(symbolic, values)
    assert failed == -1
    monkeypatch.setattr(_cholesky, "GEMM_MIN", gemm_min)
    monkeypatch.setattr(_cholesky, "LAPACK_MIN", lapack_min)
    z = _cholesky.selected_inverse(symbolic, lx)
    exact = np.linalg.inv(dense)[rows, cols]
    scale = np.abs(exact).max()
    np.testing.assert_allclose(z, exact, rtol=1e-10, atol=1e-10 * scale)
    reference = _cholesky.selected_inverse_simplicial(symbolic, lx)
    np.testing.assert_allclose(z, reference, rtol=1e-10, atol=1e-10 * scale)


@pytest.mark.parametrize("lapack_min", [1, 2**62], ids=["potrf", "loop-diag"])
@pytest.mark.parametrize("case", ["grid 30x30", "random n=200"])
def test_relaxed_supernodes_merge_blocks_and_keep_their_padding_zero(case, lapack_min):
    """Relaxed amalgamation gives fewer supernodes than the fundamental ones on the same
    ordering; the entries it adds to the blocks (outside L's pattern) stay exactly zero in
    the factorization (each is a sum of products with a structural zero), and L is the same."""
    rows, cols, values, dense = CASES[case]
    n = dense.shape[0]
    relaxed = _cholesky.analyse(rows, cols, n)
    fundamental = _cholesky.analyse(rows, cols, n, relax=False)
    np.testing.assert_array_equal(relaxed.perm, fundamental.perm)
    assert relaxed.sn_start.size < fundamental.sn_start.size
    assert relaxed.sn_xptr[-1] > relaxed.factor_nnz  # explicit zeros were added
    x = np.bincount(relaxed.x_map, weights=values, minlength=int(relaxed.sn_xptr[-1]))
    s = relaxed
    assert (
        _cholesky._numeric_supernodal(
            s.sn_start, s.sn_xptr, s.col_to_sn, s.sn_rowptr, s.sn_rows, x, 0, lapack_min
        )
        == -1
    )
    padding = np.ones(x.size, dtype=bool)
    padding[s.l_to_x] = False
    assert np.all(x[padding] == 0.0)
    lx, _ = _cholesky.factorize(fundamental, values)
    np.testing.assert_allclose(x[s.l_to_x], lx[fundamental.l_to_x], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", list(CASES))
def test_block_solves_logdet_and_draws_match_dense_algebra(case):
    """solve, logdet, sample (Pᵀ L⁻ᵀ z) and forward_permuted (L⁻¹ P u) on the block layout,
    against numpy with the dense factor of P A Pᵀ; one and three right-hand sides. Rounding
    only (well-conditioned matrices): 1e-10 relative."""
    rows, cols, values, dense = CASES[case]
    n = dense.shape[0]
    s = _cholesky.analyse(rows, cols, n)
    x, failed = _cholesky.factorize(s, values)
    assert failed == -1
    L = np.linalg.cholesky(dense[np.ix_(s.perm, s.perm)])
    rng = np.random.default_rng(3)
    assert np.isclose(_cholesky.logdet(s, x), np.linalg.slogdet(dense)[1], rtol=1e-12)
    for shape in [(n,), (n, 3)]:
        b = rng.normal(size=shape)
        np.testing.assert_allclose(
            _cholesky.solve(s, x, b), np.linalg.solve(dense, b), rtol=1e-10, atol=1e-12
        )
        draw = np.empty_like(b)
        draw[s.perm] = np.linalg.solve(L.T, b)
        np.testing.assert_allclose(_cholesky.sample(s, x, b), draw, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(
            _cholesky.forward_permuted(s, x, b), np.linalg.solve(L, b[s.perm]), rtol=1e-10,
            atol=1e-12,
        )  # fmt: skip


def test_kernels_make_their_blas_calls_on_one_thread_and_restore_the_setting():
    """The factorization, solves, draws and selected inverse set the calling thread's OpenBLAS
    thread count to 1 while they run, and give back the count they found."""
    set_threads = _cholesky.SET_BLAS_THREADS
    if set_threads is None:
        pytest.skip("scipy's BLAS has no openblas_set_num_threads_local")
    seen = []
    wrapped = _cholesky._one_blas_thread(lambda: seen.append(set_threads(1)))
    before = set_threads(3)
    try:
        wrapped()
        assert seen == [1]
        assert set_threads(3) == 3
    finally:
        set_threads(before)
    for name in ("factorize", "solve", "sample", "forward_permuted", "selected_inverse"):
        assert getattr(_cholesky, name).__wrapped__.__name__ == name
