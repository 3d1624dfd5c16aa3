"""The sparse Cholesky Ops run natively under numba and agree with their numpy `perform`."""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

pytest.importorskip("numba")

from pymc_optim.linalg.sparse import SparseFactorSolveOp, SparsePattern  # noqa: E402

# kernels in different orders of summation (numpy's pairwise sums, the loops' sequential ones)
RTOL = 1e-10


def grid_pattern(m=6, seed=0):
    """A 2-d grid's precision τ·L + diag(w) with a few long-range couplings (supernodes of
    several widths): its pattern and values."""
    rng = np.random.default_rng(seed)
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    eye = sp.identity(m)
    H = 1.7 * (sp.kron(eye, path) + sp.kron(path, eye)) + sp.diags(rng.uniform(0.5, 2.0, m * m))
    i, j = rng.integers(0, m * m, 8), rng.integers(0, m * m, 8)
    keep = i != j
    far = sp.coo_matrix((np.full(keep.sum(), -0.1), (i[keep], j[keep])), shape=H.shape)
    H = H + far + far.T + sp.diags(0.2 * np.bincount(i[keep], minlength=m * m))
    H = H + sp.diags(0.2 * np.bincount(j[keep], minlength=m * m))
    return SparsePattern.from_scipy(sp.csr_array(H))


def compile_both(inputs, outputs):
    """The outputs' functions in the default mode and in NUMBA; numba's object-mode warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_fn = pytensor.function(inputs, outputs, mode="NUMBA")
    object_mode = [str(w.message) for w in caught if "object mode" in str(w.message)]
    return pytensor.function(inputs, outputs), numba_fn, object_mode


def test_every_sparse_op_is_native_and_agrees_with_perform():
    """log det and its gradient (the selected inverse), solves with one and several right-hand
    sides and their gradients, draws and their adjoint: no object mode, the numpy results; a
    matrix that is not positive definite gives NaN as in `perform`."""
    pattern, values = grid_pattern()
    n = pattern.n
    v, b, B, z = pt.vector("v"), pt.vector("b"), pt.matrix("B"), pt.vector("z")
    logdet = pattern.logdet(v)
    x = pattern.solve(v, b)
    X = pattern.solve(v, B)
    loss = logdet + (x * pt.arange(n)).sum() + (X**2).sum()
    draw = pattern.sample(v, pt.zeros(n), z)
    adjoint = SparseFactorSolveOp(pattern, transposed=False)(v, z)
    outputs = [logdet, x, X, draw, adjoint, *pytensor.grad(loss, [v, b, B])]
    default, numba_fn, object_mode = compile_both([v, b, B, z], outputs)
    assert not object_mode, object_mode
    rng = np.random.default_rng(1)
    arguments = [values, rng.normal(size=n), rng.normal(size=(n, 3)), rng.normal(size=n)]
    # values, other values, the first again (the factor cache must follow the values)
    for vals in (values, 1.5 * values, values):
        arguments[0] = vals
        for got, want in zip(numba_fn(*arguments), default(*arguments), strict=True):
            assert_allclose(got, want, rtol=RTOL, atol=1e-13)
    # the last factor is kept per thread, with its values: [filled, failed pivot,
    # factorizations, values, L]; one factorization per new values, shared by every Op
    from pymc_optim.backends import numba_runtime, numba_sparse

    header = numba_sparse._CACHE_HEADER
    kept = [
        buffer
        for buffers in numba_runtime._BUFFERS.values()
        for buffer in buffers.values()
        if buffer.size == header + pattern.nnz + pattern._analysis().sn_xptr[-1]
    ]
    assert len(kept) == 1 and kept[0][0] == 1.0 and kept[0][1] == -1
    assert numba_sparse.factorizations(pattern) == kept[0][2] == 3
    assert_allclose(kept[0][header : header + pattern.nnz], values, rtol=0)
    arguments[0] = -values  # not positive definite
    for got, want in zip(numba_fn(*arguments), default(*arguments), strict=True):
        assert np.isnan(got).all() and np.isnan(want).all()


def test_a_batch_of_matrices_is_native_and_agrees_with_perform():
    """(B, nnz) values (a native batch of sparse problems): one factorization per matrix, the
    numpy results, NaN for the one that is not positive definite."""
    pattern, values = grid_pattern(m=4, seed=2)
    V, R = pt.matrix("V"), pt.matrix("R")
    outputs = [
        pattern.logdet(V),
        pattern.selected_inverse(V),
        pattern.solve(V, R),
        pattern.sample(V, pt.zeros_like(R), R),
    ]
    default, numba_fn, object_mode = compile_both([V, R], outputs)
    assert not object_mode, object_mode
    batch = np.stack([values, 2.0 * values, -values])
    rhs = np.random.default_rng(3).normal(size=(3, pattern.n))
    for got, want in zip(numba_fn(batch, rhs), default(batch, rhs), strict=True):
        assert_allclose(got[:2], want[:2], rtol=RTOL, atol=1e-13)
        assert np.isnan(got[2]).all() and np.isnan(want[2]).all()
