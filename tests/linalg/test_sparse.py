"""Sparse SPD Ops (pymc_optim.linalg.sparse) against dense numpy / PyTensor references."""

import pickle

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.sparse as sp
from pytensor.graph.replace import graph_replace

import pymc_optim as pmo
from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.sparse import (
    SelectedInverseOp,
    SparseFactorSolveOp,
    SparseLogdetOp,
    SparsePattern,
    SparseSolveOp,
    SparseStructure,
)

# Values, solves and the selected inverse are backward-stable Cholesky computations of
# well-conditioned matrices (condition number ≲ 10³ here): agreement with LAPACK to ~1e-12
# relative; 1e-8 is the requirement and leaves four orders of margin.
RTOL = 1e-8


def grid_precision(m, seed=0, extra_edges=0):
    """τ·L_grid + diag(w) (m × m grid, n = m²) plus random long-range couplings: full COO."""
    rng = np.random.default_rng(seed)
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    eye = sp.identity(m)
    H = 1.7 * (sp.kron(eye, path) + sp.kron(path, eye)) + sp.diags(rng.uniform(0.5, 2.0, m * m))
    if extra_edges:
        i = rng.integers(0, m * m, extra_edges)
        j = rng.integers(0, m * m, extra_edges)
        keep = i != j
        w = sp.coo_matrix((np.full(keep.sum(), -0.1), (i[keep], j[keep])), shape=H.shape)
        H = H + w + w.T + sp.diags(0.2 * np.bincount(i[keep], minlength=m * m))
        H = H + sp.diags(0.2 * np.bincount(j[keep], minlength=m * m))
    return sp.coo_matrix(H)


def lower_entries(H, duplicate=True):
    """Lower-triangle (rows, cols, values) of H, one off-diagonal entry split in two."""
    lower = sp.tril(H).tocoo()
    rows, cols, values = lower.row, lower.col, lower.data.copy()
    if duplicate and rows.size > 1:
        e = np.flatnonzero(rows != cols)[0]
        values[e] *= 0.25
        rows, cols = np.append(rows, rows[e]), np.append(cols, cols[e])
        values = np.append(values, 3 * values[e])
    return rows, cols, values


@pytest.fixture(scope="module", params=[1, 3, 20, 44], ids=lambda m: f"n={m * m}")
def problem(request):
    m = request.param
    H = grid_precision(m, seed=m, extra_edges=m)
    rows, cols, values = lower_entries(H)
    return SparsePattern(rows, cols, m * m), values, H.toarray()


def test_logdet_solve_selected_inverse_match_dense(problem):
    pattern, values, dense = problem
    v = pt.vector("v")
    b = pt.matrix("b")
    f = pytensor.function(
        [v, b],
        [pattern.logdet(v), pattern.solve(v, b), pattern.solve(v, b[:, 0])]
        + [pattern.selected_inverse(v)],
    )
    rhs = np.random.default_rng(1).normal(size=(pattern.n, 3))
    logdet, x, x0, selected = f(values, rhs)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(dense)[1], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(x, np.linalg.solve(dense, rhs), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(x0, x[:, 0], rtol=1e-14)
    inverse = np.linalg.inv(dense)
    np.testing.assert_allclose(selected, inverse[pattern.rows, pattern.cols], rtol=RTOL, atol=1e-13)


def test_logdet_gradient_matches_dense_pytensor(problem):
    pattern, values, _ = problem
    v = pt.vector("v")
    sparse_grad = pytensor.grad(pattern.logdet(v), v)
    dense_grad = pytensor.grad(pt.linalg.slogdet(pattern.to_dense(v))[1], v)
    f = pytensor.function([v], [sparse_grad, dense_grad])
    got, expected = f(values)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
    # The fast path: no dense decomposition, inverse or determinant in the compiled gradient.
    ops = {
        type(node.op).__name__
        for node in pytensor.function([v], sparse_grad).maker.fgraph.apply_nodes
    }
    assert "SelectedInverseOp" in ops
    assert not ops & {"MatrixInverse", "Det", "SLogDet", "Cholesky", "Solve"}


@pytest.mark.parametrize("m", [1, 3, 20], ids=lambda m: f"n={m * m}")
def test_solve_gradient_matches_dense_pytensor(m):
    # The dense reference's gradient (two dense solves per cotangent) is what limits n here.
    rows, cols, values = lower_entries(grid_precision(m, seed=m, extra_edges=m))
    pattern = SparsePattern(rows, cols, m * m)
    rng = np.random.default_rng(2)
    v, b = pt.vector("v"), pt.matrix("b")
    weights = rng.normal(size=(pattern.n, 2))
    sparse_loss = (weights * pattern.solve(v, b)).sum() + (pattern.solve(v, b[:, 0]) ** 2).sum()
    dense = pattern.to_dense(v)
    dense_loss = (weights * pt.linalg.solve(dense, b, assume_a="pos")).sum() + (
        pt.linalg.solve(dense, b[:, 0], assume_a="pos") ** 2
    ).sum()
    f = pytensor.function(
        [v, b], pytensor.grad(sparse_loss, [v, b]) + pytensor.grad(dense_loss, [v, b])
    )
    gv, gb, dv, db = f(values, rng.normal(size=(pattern.n, 2)))
    np.testing.assert_allclose(gv, dv, rtol=RTOL, atol=1e-11)
    np.testing.assert_allclose(gb, db, rtol=RTOL, atol=1e-11)


def test_gradients_match_central_finite_differences():
    H = grid_precision(12, seed=5, extra_edges=10)
    rows, cols, values = lower_entries(H)
    pattern = SparsePattern(rows, cols)
    rng = np.random.default_rng(3)
    b_value = rng.normal(size=pattern.n)
    v, b = pt.vector("v"), pt.vector("b")
    x = pattern.solve(v, b)
    loss = pattern.logdet(v) + (x * pt.sin(x)).sum()
    f = pytensor.function([v, b], loss)
    g = pytensor.function([v, b], pytensor.grad(loss, [v, b]))
    gv, gb = g(values, b_value)
    # Central differences along random directions: truncation O(h²) ≈ 1e-10 and rounding
    # eps·|f|/h ≈ 1e-16·1e2/1e-5 = 1e-9, so 1e-6 relative is far above both.
    h = 1e-5
    for _ in range(3):
        dv, db = rng.normal(size=values.size), rng.normal(size=pattern.n)
        fd = (f(values + h * dv, b_value + h * db) - f(values - h * dv, b_value - h * db)) / (2 * h)
        np.testing.assert_allclose(gv @ dv + gb @ db, fd, rtol=1e-6)


def test_solve_second_derivative_is_a_graph():
    """The solve's pullback is built of graph Ops, so it can be differentiated again."""
    H = grid_precision(4, seed=1)
    pattern, values = SparsePattern.from_scipy(H)
    v, b = pt.vector("v"), pt.vector("b")
    loss = (pattern.solve(v, b) ** 2).sum()
    hess_b = pytensor.gradient.hessian(loss, b)
    dense_inverse = np.linalg.inv(H.toarray())
    got = pytensor.function([v, b], hess_b)(values, np.ones(pattern.n))
    np.testing.assert_allclose(got, 2 * dense_inverse @ dense_inverse, rtol=RTOL, atol=1e-13)


def test_sample_has_covariance_inverse_and_adjoint_gradient():
    H = grid_precision(6, seed=2, extra_edges=4)
    pattern, values = SparsePattern.from_scipy(H)
    v, mean, z = pt.vector("v"), pt.vector("mean"), pt.matrix("z")
    draw = pattern.sample(v, mean, z)
    f = pytensor.function([v, mean, z], draw)
    mu = np.arange(pattern.n, dtype=float)
    # z = I gives the columns of the factor M = Pᵀ L⁻ᵀ, exactly: M Mᵀ must be H⁻¹ (no Monte
    # Carlo), and mean is added to every column.
    M = f(values, mu, np.eye(pattern.n)) - mu[:, None]
    np.testing.assert_allclose(M @ M.T, np.linalg.inv(H.toarray()), rtol=RTOL, atol=1e-13)
    # Reparametrized draws: d(Σ w ⊙ draw)/dz = Mᵀ w, d/dmean = row sums of w.
    w = np.random.default_rng(0).normal(size=(pattern.n, pattern.n))
    gz, gmean = pytensor.function([v, mean, z], pytensor.grad((w * draw).sum(), [z, mean]))(
        values, mu, np.eye(pattern.n)
    )
    np.testing.assert_allclose(gz, M.T @ w, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(gmean, w.sum(axis=1), rtol=1e-14)


def test_not_positive_definite_gives_nan():
    pattern = SparsePattern([0, 1, 1], [0, 0, 1])
    v = pt.vector("v")
    f = pytensor.function([v], [pattern.logdet(v), pattern.solve(v, pt.ones(2))])
    logdet, x = f(np.array([1.0, 2.0, 1.0]))  # [[1, 2], [2, 1]] has eigenvalue -1
    assert np.isnan(logdet) and np.isnan(x).all()
    logdet, x = f(np.array([2.0, 1.0, 2.0]))  # and the next call recovers
    np.testing.assert_allclose(logdet, np.log(3.0), rtol=1e-14)


def test_value_and_gradient_factorize_once(monkeypatch):
    H = grid_precision(5, seed=4)
    pattern, values = SparsePattern.from_scipy(H)
    calls = []
    original = _cholesky.factorize
    monkeypatch.setattr(_cholesky, "factorize", lambda s, x: calls.append(1) or original(s, x))
    v = pt.vector("v")
    logdet = pattern.logdet(v)
    f = pytensor.function([v], [logdet, pytensor.grad(logdet, v)])
    f(values)
    f(values)  # same values: the factor is reused
    f(values * 2)
    assert len(calls) == 2


def test_pattern_pickles_and_equal_patterns_merge():
    H = grid_precision(4, seed=3)
    pattern, values = SparsePattern.from_scipy(H)
    clone = pickle.loads(pickle.dumps(pattern))
    assert clone == pattern and hash(clone) == hash(pattern)
    v = pt.vector("v")
    f = pickle.loads(pickle.dumps(pytensor.function([v], clone.logdet(v) + pattern.logdet(v))))
    np.testing.assert_allclose(f(values), 2 * np.linalg.slogdet(H.toarray())[1], rtol=RTOL)
    assert SparseLogdetOp(clone) == SparseLogdetOp(pattern)


def test_numba_mode_runs_and_jax_refuses():
    H = grid_precision(3, seed=3)
    pattern, values = SparsePattern.from_scipy(H)
    v = pt.vector("v")
    logdet = pattern.logdet(v)
    f = pytensor.function([v], [logdet, pytensor.grad(logdet, v)], mode="NUMBA")
    np.testing.assert_allclose(f(values)[0], np.linalg.slogdet(H.toarray())[1], rtol=RTOL)
    pytest.importorskip("jax")
    with pytest.raises(NotImplementedError, match="no JAX implementation.*default C backend"):
        pytensor.function([v], logdet, mode="JAX")


def test_from_scipy_reads_values_and_keeps_zero_diagonal_structurally():
    H = sp.csr_array(np.array([[2.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]))
    pattern, values = SparsePattern.from_scipy(H)
    dense = pytensor.function([], pattern.to_dense(values))()
    np.testing.assert_array_equal(dense, H.toarray())
    assert pattern.nnz == 4


@pytest.mark.parametrize(
    "rows, cols, n, error, match",
    [
        (
            [0, 0, 1],
            [0, 1, 1],
            None,
            ValueError,
            r"lower triangle \(rows >= cols\).*e\.g\. \(0, 1\)",
        ),
        ([0, 1], [0, 0], None, ValueError, r"every diagonal entry.*1 of 2 are missing.*\(1, 1\)"),
        ([0, 5], [0, 0], 3, ValueError, r"must lie in \[0, n\) = \[0, 3\)"),
        ([0, 1], [0], None, ValueError, r"same length; got 2 and 1"),
        ([0.0, 1.0], [0.0, 1.0], None, TypeError, r"`rows` must be a 1-d array of integer"),
    ],
)
def test_bad_pattern_errors(rows, cols, n, error, match):
    with pytest.raises(error, match=match):
        SparsePattern(rows, cols, n)


def test_bad_matrix_and_values_errors():
    with pytest.raises(ValueError, match=r"`matrix` must be symmetric; max \|M - Mᵀ\| is 1"):
        SparsePattern.from_scipy(sp.csr_array(np.array([[2.0, 1.0], [0.0, 2.0]])))
    with pytest.raises(TypeError, match=r"`matrix` must be a scipy.sparse matrix.*ndarray"):
        SparsePattern.from_scipy(np.eye(2))
    pattern = SparsePattern([0, 1], [0, 1])
    with pytest.raises(ValueError, match=r"`values` must have length 2.*static length 3"):
        pattern.logdet(pt.zeros(3))
    with pytest.raises(ValueError, match=r"`values` must be a vector.*or a \(B, 2\) batch.*3-d"):
        pattern.logdet(pt.tensor3("v"))
    with pytest.raises(ValueError, match=r"`b` must have shape \(B, n\) for a batch.*1-d"):
        pattern.solve(pt.matrix("v"), pt.vector("b"))
    with pytest.raises(ValueError, match=r"`b` must have 2 rows.*static shape \(3,\)"):
        pattern.solve(pt.vector("v"), pt.zeros(3))
    f = pytensor.function([v := pt.vector("v")], pattern.logdet(v))
    with pytest.raises(
        ValueError, match=r"one entry per pattern entry, shape \(2,\); got shape \(3,\)"
    ):
        f(np.ones(3))
    with pytest.raises(TypeError, match="`pattern` must be a SparsePattern"):
        SparseSolveOp("not a pattern")
    assert SelectedInverseOp(pattern) != SparseFactorSolveOp(pattern)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setattr(_cholesky, "numba", None)
    with pytest.raises(
        ImportError, match=r"optional extra `sparse`.*pip install 'pymc-optim\[sparse\]'"
    ):
        SparsePattern([0], [0])


# --- SparseStructure: the sparse layout of A in the graph-native solvers and the Laplace ------


def grid_edges(m):
    index = np.arange(m * m).reshape(m, m)
    right = np.column_stack([index[:, :-1].ravel(), index[:, 1:].ravel()])
    down = np.column_stack([index[:-1, :].ravel(), index[1:, :].ravel()])
    return np.concatenate([right, down])


def test_coloring_separates_columns_sharing_a_row():
    H = grid_precision(9, seed=1, extra_edges=30)
    pattern, _ = SparsePattern.from_scipy(H)
    structure = SparseStructure(pattern=pattern)
    dense = H.toarray() != 0
    colors = structure._colors
    for g in range(structure.n_colors):
        # Structurally orthogonal: every row meets at most one column of colour g.
        assert dense[:, colors == g].sum(axis=1).max() <= 1


def test_sparse_structure_newton_matches_dense():
    m = 6
    edges = grid_edges(m)
    structure = SparseStructure.from_edges(edges)
    x, tau = pt.vector("x"), pt.scalar("tau")
    counts = np.arange(m * m) % 3
    i, j = edges[:, 0], edges[:, 1]
    objective = 0.5 * tau * ((x[i] - x[j]) ** 2).sum() + 0.05 * (x**2).sum()
    objective = objective + (pt.exp(x) - counts * x).sum()
    x_sparse, ok = pmo.minimize(
        objective, x, x0=np.zeros(m * m), method="newton", structure=structure
    )
    x_dense, _ = pmo.minimize(objective, x, x0=np.zeros(m * m), method="newton")
    loss_sparse, loss_dense = (x_sparse**2).sum(), (x_dense**2).sum()
    f = pytensor.function(
        [tau],
        [x_sparse, x_dense, pytensor.grad(loss_sparse, tau), pytensor.grad(loss_dense, tau), ok],
    )
    xs, xd, gs, gd, success = f(1.3)
    assert success
    np.testing.assert_allclose(xs, xd, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(gs, gd, rtol=RTOL)
    grad_ops = {
        type(node.op).__name__
        for node in pytensor.function(
            [tau], pytensor.grad(loss_sparse, tau)
        ).maker.fgraph.apply_nodes
    }
    assert "SparseSolveOp" in grad_ops


def gmrf_poisson_model(m, seed=0):
    from pymc_optim.distributions.gmrf import GMRF

    edges = grid_edges(m)
    n = m * m
    W = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    W = W + W.T
    Q = sp.diags(np.asarray(W.sum(axis=1)).ravel()) - W + 0.1 * sp.identity(n)
    counts = np.random.default_rng(seed).poisson(2.0, size=n)
    with pm.Model() as model:
        tau = pm.Gamma("tau", 2.0, 1.0)
        b = pm.Normal("b", 0.0, 2.0)
        x = GMRF("x", precision=Q, tau=tau)
        pm.Poisson("y", mu=pt.exp(b + x), observed=counts)
    return model, edges


@pytest.mark.slow
def test_marginalize_laplace_sparse_matches_dense_and_recovers_latent():
    model, edges = gmrf_poisson_model(6)
    structure = SparseStructure.from_edges(edges)
    sparse_model = pmo.marginalize_laplace(model, "x", hessian_structure=structure)
    dense_model = pmo.marginalize_laplace(model, "x", hessian_structure="dense")
    logp_sparse, logp_dense = sparse_model.compile_logp(), dense_model.compile_logp()
    dlogp, dlogp_dense = sparse_model.compile_dlogp(), dense_model.compile_dlogp()
    rng = np.random.default_rng(1)
    for _ in range(2):
        point = {"tau_log__": rng.normal(scale=0.5), "b": rng.normal(scale=0.5)}
        np.testing.assert_allclose(logp_sparse(point), logp_dense(point), rtol=RTOL)
        np.testing.assert_allclose(dlogp(point), dlogp_dense(point), rtol=RTOL)
    ops = {type(node.op).__name__ for node in dlogp.f.maker.fgraph.apply_nodes}
    assert {"SelectedInverseOp", "SparseSolveOp"} <= ops
    assert not ops & {"Cholesky", "MatrixInverse", "Solve", "SLogDet"}
    import arviz as az

    posterior = {"tau": np.full((1, 3), 1.2), "b": np.full((1, 3), 0.4)}
    idata = pmo.recover_latent(
        sparse_model, az.from_dict({"posterior": posterior}), random_seed=3, progressbar=False
    )
    assert idata.posterior["x"].shape == (1, 3, 36)


def test_sparse_structure_numeric_helpers_and_errors():
    H = grid_precision(4, seed=6)
    pattern, values = SparsePattern.from_scipy(H)
    structure = SparseStructure(pattern=pattern)
    v = np.random.default_rng(0).normal(size=pattern.n)
    np.testing.assert_allclose(structure.matvec_numpy(values, v), H @ v, rtol=1e-13)
    np.testing.assert_allclose(
        structure.solve_numpy(values, v), np.linalg.solve(H.toarray(), v), rtol=RTOL
    )
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        structure.solve_numpy(-values, v)
    with pytest.raises(
        NotImplementedError, match="for a non-symmetric Jacobian use `structure='dense'`"
    ):
        structure.solve(pt.vector("a"), pt.vector("b"), transposed=True, symmetric=False)
    with pytest.raises(TypeError, match="`pattern` must be a SparsePattern.*got NoneType"):
        SparseStructure()
    with pytest.raises(ValueError, match=r"`edges` must be an integer array of shape \(E, 2\)"):
        SparseStructure.from_edges(np.zeros((3, 3)))
    assert pickle.loads(pickle.dumps(structure)) == structure


def test_default_install_without_numba_imports_and_names_the_extra():
    """Without numba (the default install) the package imports; a sparse structure names the
    extra. Run in a fresh interpreter where importing numba fails."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import pymc_optim, pymc_optim.linalg.sparse\n"
        "from pymc_optim.distributions.gmrf import ICAR\n"
        "try:\n"
        "    ICAR.dist(edges=[(0, 1), (1, 2)])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'pymc-optim[sparse]'" in result.stdout


# --- the sparse pattern read off the graph (detect.sparse_hessian_structure) -----------------


def _true_pattern(objective, x, n, seed=0):
    """The nonzero pattern of the exact Hessian at two random points (lower triangle)."""
    f = pytensor.function([x], pytensor.gradient.hessian(objective, x))
    rng = np.random.default_rng(seed)
    found = np.zeros((n, n), dtype=bool)
    for _ in range(2):
        found |= f(rng.uniform(0.5, 1.5, n)) != 0
    return found | np.eye(n, dtype=bool)


def _read_pattern(objective, x, n):
    from pymc_optim.linalg import _hessian_sparsity

    rows, cols = _hessian_sparsity.hessian_pattern(objective, [x], [n], max_nnz=n * n)
    dense = np.zeros((n, n), dtype=bool)
    dense[rows, cols] = dense[cols, rows] = True
    return dense


def _pattern_cases():
    n = 12
    rng = np.random.default_rng(4)
    edges = np.array([(0, 3), (3, 7), (7, 11), (2, 5), (5, 9), (1, 10)])
    i, j = edges[:, 0], edges[:, 1]
    M = np.where(rng.uniform(size=(5, n)) < 0.3, rng.normal(size=(5, n)), 0.0)
    Msym = np.zeros((n, n))
    Msym[i, j] = Msym[j, i] = 1.0
    index = np.array([4, 4, 8, 0])
    icar_edges = pt.eq(pt.tril(Msym.astype("int64")), 1).nonzero()
    return n, {
        "edge differences": lambda x: ((x[i] - x[j]) ** 2).sum() + pt.exp(x).sum(),
        "constant matrix product": lambda x: pt.log1p(pt.dot(M, x) ** 2).sum(),
        "quadratic form x·(W x)": lambda x: (x * pt.dot(Msym, x)).sum() + (x**3).sum(),
        "matrix-shaped x and a row sum": lambda x: pt.sin(x.reshape((3, 4)).sum(axis=1)).sum(),
        "increments at repeated indices": lambda x: (
            pt.zeros(5)[[0, 1, 1, 2]].inc(x[index]) ** 2
        ).sum(),
        "set into a copy and a join": lambda x: (
            pt.concatenate([pt.set_subtensor(x[2:5], x[:3] * x[9:]), x[:2]]) ** 3
        ).sum(),
        "product of two gathered copies": lambda x: (x[i] * x[j] * x[::-1][i]).sum(),
        "split pieces": lambda x: (
            (pt.split(x, [5, 7], n_splits=2)[0] ** 2).sum()
            + pt.exp(pt.split(x, [5, 7], n_splits=2)[1]).sum()
        ),
        "division by an x-dependent denominator": lambda x: (x[:6] / (1 + x[6:] ** 2)).sum(),
        "max reduction": lambda x: pt.max(x[:4] * 2.0) + (x[4:] ** 2).sum(),
        # pm.ICAR's edge list: the lower triangle of a constant integer W (a cast inside tril)
        "edges read off a constant adjacency": lambda x: (
            ((x[icar_edges[0]] - x[icar_edges[1]]) ** 2).sum() + pt.exp(x).sum()
        ),
    }


@pytest.mark.parametrize("case", list(_pattern_cases()[1]))
def test_read_pattern_equals_the_hessians_pattern(case):
    """The structural pattern holds every nonzero of the exact Hessian and, for these graphs,
    nothing else (a superset that was not tight would make the factor denser, never wrong)."""
    n, cases = _pattern_cases()
    x = pt.vector("x", shape=(n,))
    objective = cases[case](x)
    read, true = _read_pattern(objective, x, n), _true_pattern(objective, x, n)
    assert not (true & ~read).any(), "an entry of the Hessian is missing from the pattern"
    if case == "max reduction":  # max couples its arguments structurally; a superset here
        assert read[:4, :4].all()
        return
    np.testing.assert_array_equal(read, true)


def test_constant_indices_are_computed_without_compiling(monkeypatch):
    """A constant of the graph (pm.ICAR's edge list from tril(W)) is computed Op by Op, a cast
    by numpy: PyTensor's own cast of an (n, n) constant loops in Python, seconds at n = 5,000."""
    import pytensor

    from pymc_optim.linalg import _hessian_sparsity

    W = np.zeros((6, 6), dtype="int64")
    W[[0, 1, 2, 4], [1, 2, 5, 5]] = 1
    W = W + W.T
    node1, node2 = pt.eq(pt.tril(pt.as_tensor(W)), 1).nonzero()

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled a function to compute a constant")

    monkeypatch.setattr(pytensor, "function", no_compiling)
    expected = np.nonzero(np.tril(W) == 1)
    np.testing.assert_array_equal(_hessian_sparsity._constant_value(node1), expected[0])
    np.testing.assert_array_equal(_hessian_sparsity._constant_value(node2), expected[1])


def test_read_pattern_gives_up_on_unknown_ops_and_on_dense_hessians():
    from pymc_optim.linalg import _hessian_sparsity

    x = pt.vector("x", shape=(300,))
    # a rank-one term (a soft sum-to-zero penalty) makes every pair interact: over budget
    dense = ((x[1:] - x[:-1]) ** 2).sum() + x.sum() ** 2
    assert _hessian_sparsity.hessian_pattern(dense, [x], [300], max_nnz=3000) is None
    unknown = (pt.cumsum(x) ** 2).sum()  # CumOp is not followed
    assert _hessian_sparsity.hessian_pattern(unknown, [x], [300], max_nnz=10**6) is None
    chain = ((x[1:] - x[:-1]) ** 2).sum() + pt.exp(x).sum()
    rows, cols = _hessian_sparsity.hessian_pattern(chain, [x], [300], max_nnz=3000)
    assert rows.size == 300 + 299 and np.all(rows - cols <= 1)


def icar_poisson_model(m, constraint="corner", seed=0):
    from pymc_optim.distributions.gmrf import ICAR

    edges = grid_edges(m)
    counts = np.random.default_rng(seed).poisson(2.0, size=m * m)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma")
        b = pm.Normal("b", 0.0, 2.0)
        x = ICAR("x", edges=edges, sigma=sigma, constraint=constraint)
        pm.Poisson("y", mu=pt.exp(b + x), observed=counts)
    return model


def _compiled_ops(fn):
    return {type(node.op).__name__ for node in fn.f.maker.fgraph.apply_nodes}


@pytest.mark.slow
@pytest.mark.parametrize("build", ["icar_corner", "gmrf", "pm_car"])
def test_auto_finds_the_sparse_hessian_of_gmrf_models(build):
    """A user's GMRF model, written plainly, gets the sparse path from "auto": the structure,
    the compiled graph's Ops (selected inverse, sparse solves, no dense factorization), and the
    values and gradients of the dense path (the oracle) to 1e-8."""
    m = 17  # n = 289 (the corner ICAR: 288 free values) ≥ SPARSE_MIN_SIZE
    if build == "icar_corner":
        model = icar_poisson_model(m)
        point = {"sigma_log__": 0.2, "b": 0.3}
    elif build == "gmrf":
        model, _ = gmrf_poisson_model(m)
        point = {"tau_log__": 0.2, "b": 0.3}
    else:
        edges = grid_edges(m)
        n = m * m
        W = np.zeros((n, n))
        W[edges[:, 0], edges[:, 1]] = 1.0
        W = W + W.T
        counts = np.random.default_rng(2).poisson(2.0, size=n)
        with pm.Model() as model:
            tau = pm.Gamma("tau", 2.0, 1.0)
            b = pm.Normal("b", 0.0, 2.0)
            x = pm.CAR("x", mu=np.zeros(n), W=W, alpha=0.9, tau=tau)
            pm.Poisson("y", mu=pt.exp(b + x), observed=counts)
        point = {"tau_log__": 0.2, "b": 0.3}
    sparse_model = pmo.marginalize_laplace(model, "x")
    structure = pmo.laplace_info(sparse_model).structure
    assert isinstance(structure, SparseStructure)
    dense_model = pmo.marginalize_laplace(model, "x", hessian_structure="dense")
    dlogp = sparse_model.compile_dlogp()
    ops = _compiled_ops(dlogp)
    assert {"SelectedInverseOp", "SparseSolveOp"} <= ops
    assert not ops & {"Cholesky", "MatrixInverse", "Solve", "SLogDet"}
    np.testing.assert_allclose(
        sparse_model.compile_logp()(point), dense_model.compile_logp()(point), rtol=RTOL
    )
    np.testing.assert_allclose(dlogp(point), dense_model.compile_dlogp()(point), rtol=RTOL)


@pytest.mark.slow
def test_hessian_structure_sparse_string_forces_the_sparse_path_at_any_size():
    model = icar_poisson_model(4)  # 15 free values: "auto" keeps these dense
    assert pmo.laplace_info(pmo.marginalize_laplace(model, "x")).structure.kind == "dense"
    sparse_model = pmo.marginalize_laplace(model, "x", hessian_structure="sparse")
    structure = pmo.laplace_info(sparse_model).structure
    assert isinstance(structure, SparseStructure)
    # the grounded grid Laplacian plus the diagonal: 15 nodes, 24 − 2 edges off the root
    assert structure.pattern.nnz == 15 + 22
    dense_model = pmo.marginalize_laplace(model, "x", hessian_structure="dense")
    point = {"sigma_log__": -0.3, "b": 0.1}
    np.testing.assert_allclose(
        sparse_model.compile_logp()(point), dense_model.compile_logp()(point), rtol=RTOL
    )
    np.testing.assert_allclose(
        sparse_model.compile_dlogp()(point), dense_model.compile_dlogp()(point), rtol=RTOL
    )


def test_soft_sum_to_zero_stays_dense():
    """The soft penalty Σ_k s_k² adds a rank-one term per component: H is dense, and "auto" does
    not take the sparse layout (documented in marginalize_laplace's Notes)."""
    from pymc_optim.linalg import detect

    model = icar_poisson_model(17, constraint="soft")
    values = model.rvs_to_values[model["x"]]
    z = pt.vector("z", shape=(289,))
    logp = graph_replace(model.logp(), {values: z}, strict=False)
    assert detect.sparse_hessian_structure(logp, [z], [289]) is None


def test_minimize_structure_sparse_and_auto_on_a_plain_vector():
    """`minimize` with a plain `pt.vector` (no static shape) and a numeric x0: "sparse" reads
    the pattern, "auto" takes it at n ≥ SPARSE_MIN_SIZE; both agree with the dense solve."""
    m = 17
    edges = grid_edges(m)
    n = m * m
    i, j = edges[:, 0], edges[:, 1]
    x, tau = pt.vector("x"), pt.scalar("tau")
    counts = np.arange(n) % 3
    objective = 0.5 * tau * ((x[i] - x[j]) ** 2).sum() + 0.05 * (x**2).sum()
    objective = objective + (pt.exp(x) - counts * x).sum()
    x0 = np.zeros(n)
    solutions = {
        s: pmo.minimize(objective, x, x0=x0, method="newton", structure=s)[0]
        for s in ("sparse", "auto", "dense")
    }
    losses = {s: (v**2).sum() for s, v in solutions.items()}
    outputs = [solutions["sparse"], solutions["auto"], solutions["dense"]]
    outputs += [pytensor.grad(losses[s], tau) for s in ("sparse", "auto", "dense")]
    values = pytensor.function([tau], outputs)(1.3)
    np.testing.assert_allclose(values[0], values[2], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(values[1], values[2], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(values[3], values[5], rtol=RTOL)
    np.testing.assert_allclose(values[4], values[5], rtol=RTOL)
    for s in ("sparse", "auto"):
        compiled = pytensor.function([tau], pytensor.grad(losses[s], tau))
        ops = {type(node.op).__name__ for node in compiled.maker.fgraph.apply_nodes}
        assert "SparseSolveOp" in ops and "Solve" not in ops


def test_structure_sparse_errors():
    x, tau = pt.vector("x"), pt.scalar("tau")
    objective = (pt.exp(x) - tau * x).sum() + ((x[1:] - x[:-1]) ** 2).sum()
    with pytest.raises(ValueError, match=r"`structure='sparse'` needs the size of `x`"):
        # no x0: x's runtime value starts the solve, so its size is unknown when the graph is built
        pmo.minimize(objective, x, method="newton", structure="sparse")
    with pytest.raises(ValueError, match=r"`block_size` is only used with.*`structure='sparse'`"):
        pmo.minimize(objective, x, x0=np.zeros(3), structure="sparse", block_size=2)
    unreadable = (pt.cumsum(x) ** 2).sum() - tau * x.sum()
    with pytest.raises(ValueError, match=r"sparsity pattern cannot be read off the graph"):
        pmo.minimize(unreadable, x, x0=np.zeros(3), method="newton", structure="sparse")
    with pytest.raises(ValueError, match=r"`hessian_structure` must be one of 'auto'.*'sparse'"):
        pmo.marginalize_laplace(icar_poisson_model(3), "x", hessian_structure="banded")


def _batched_newton(n=20):
    x, tau = pt.vector("x"), pt.scalar("tau")
    objective = (
        0.5 * tau * ((x[1:] - x[:-1]) ** 2).sum() + (pt.exp(x) - (np.arange(n) % 3) * x).sum()
    )
    x_star, ok = pmo.minimize(objective, x, x0=np.zeros(n), method="newton", structure="sparse")
    return x_star, ok, tau


def test_a_batch_of_sparse_solves_matches_the_solves_one_by_one():
    """A vectorized sparse Newton solve (a chain's draws solved at once) gives each problem's
    own solution, success and implicit gradient: one block per problem on the one-problem
    pattern, in one stacked Newton Op (no Blockwise loop)."""
    from pytensor.graph.replace import vectorize_graph

    from pymc_optim.backends.newton import NewtonOp
    from pymc_optim.linalg.sparse import StackedSparseStructure

    x_star, ok, tau = _batched_newton()
    taus = pt.vector("taus")
    batched_x, batched_ok = vectorize_graph([x_star, ok], {tau: taus})
    loss = (batched_x**2 * np.linspace(1.0, 2.0, 20)).sum()
    batched = pytensor.function([taus], [batched_x, batched_ok, pytensor.grad(loss, taus)])
    single_loss = (x_star**2 * np.linspace(1.0, 2.0, 20)).sum()
    single = pytensor.function([tau], [x_star, ok, pytensor.grad(single_loss, tau)])
    newton = [node.op for node in batched.maker.fgraph.apply_nodes if isinstance(node.op, NewtonOp)]
    assert len(newton) == 1 and isinstance(newton[0].condition.structure, StackedSparseStructure)
    assert "Blockwise" not in {type(n.op).__name__ for n in batched.maker.fgraph.apply_nodes}
    values = [0.5, 1.0, 2.0]
    xs, oks, grads = batched(values)
    assert oks.shape == (3,) and np.all(oks)
    for k, t in enumerate(values):
        x_k, ok_k, grad_k = single(t)
        assert ok_k
        np.testing.assert_allclose(xs[k], x_k, rtol=RTOL, atol=1e-12)
        np.testing.assert_allclose(grads[k], grad_k, rtol=RTOL)


def test_a_failing_problem_of_a_sparse_batch_leaves_the_others_alone():
    """τ < 0 makes one problem's Hessian indefinite (no minimum): that problem alone fails."""
    from pytensor.graph.replace import vectorize_graph

    x_star, ok, tau = _batched_newton()
    taus = pt.vector("taus")
    batched = pytensor.function([taus], vectorize_graph([x_star, ok], {tau: taus}))
    single = pytensor.function([tau], [x_star, ok])
    xs, oks = batched([1.0, -50.0, 2.0])
    assert list(oks) == [True, False, True]
    for k, t in [(0, 1.0), (2, 2.0)]:
        np.testing.assert_allclose(xs[k], single(t)[0], rtol=RTOL, atol=1e-12)


def test_batched_sparse_ops_match_the_ops_one_matrix_at_a_time(problem):
    """(B, nnz) values: log det, its gradient, solve (and its gradients), the selected inverse
    and the factor solve equal the one-matrix Ops row by row; a non-positive-definite matrix
    gives NaN in its own row only."""
    pattern, values, _ = problem
    n = pattern.n
    rng = np.random.default_rng(5)
    batch = np.stack([values, 1.5 * values, 0.7 * values])
    rhs = rng.normal(size=(3, n))
    V, B = pt.matrix("V"), pt.matrix("B")
    v, b = pt.vector("v"), pt.vector("b")
    weights = rng.normal(size=n)

    def outputs(vals, rhs_):
        solved = SparseSolveOp(pattern)(vals, rhs_)
        loss = SparseLogdetOp(pattern)(vals).sum() + (solved * weights).sum()
        return [
            SparseLogdetOp(pattern)(vals),
            solved,
            SelectedInverseOp(pattern)(vals),
            SparseFactorSolveOp(pattern, transposed=True)(vals, rhs_),
            SparseFactorSolveOp(pattern, transposed=False)(vals, rhs_),
            *pytensor.grad(loss, [vals, rhs_]),
        ]

    batched = pytensor.function([V, B], outputs(V, B))(batch, rhs)
    one = pytensor.function([v, b], outputs(v, b))
    for k in range(3):
        for got, want in zip(batched, one(batch[k], rhs[k]), strict=True):
            np.testing.assert_allclose(got[k], want, rtol=RTOL, atol=1e-12)
    if n > 1:
        bad = batch.copy()
        bad[1] = -bad[1]
        logdets, solved = pytensor.function([V, B], outputs(V, B)[:2])(bad, rhs)
        assert np.isnan(logdets[1]) and np.isnan(solved[1]).all()
        assert np.isfinite(logdets[[0, 2]]).all() and np.isfinite(solved[[0, 2]]).all()


def test_recover_latent_visits_near_draws_in_turn_and_keeps_each_draw_in_place():
    """recover_latent solves a chain's draws along a nearest-neighbour tour of θ (each solve
    starts at a close θ's mode): the tour is far shorter than the sampling order, and the
    recovered draws equal those solved in sampling order (same noise per draw; modes agree to
    the Newton tolerance, 1e-8 on the gradient of a problem with curvature ≳ 0.1)."""
    import arviz as az

    from pymc_optim.model.laplace import _nearest_neighbour_order, _recover

    rng = np.random.default_rng(0)
    points = rng.normal(size=(300, 2)) * [1.0, 50.0]
    order = _nearest_neighbour_order(points)
    assert sorted(order) == list(range(300)) and order[0] == 0
    standardized = (points - points.mean(0)) / points.std(0)

    def length(visits):
        return np.linalg.norm(np.diff(standardized[visits], axis=0), axis=1).sum()

    assert length(order) < 0.2 * length(list(range(300)))

    model, _ = gmrf_poisson_model(4)
    marginal = pmo.marginalize_laplace(model, "x", hessian_structure="sparse")
    draws = {"tau": np.exp(rng.normal(0.2, 0.3, (2, 12))), "b": rng.normal(0.3, 0.2, (2, 12))}
    idata = pmo.recover_latent(
        marginal, az.from_dict({"posterior": draws}), random_seed=7, progressbar=False
    )
    hyper = [draws[rv.name] for rv in marginal.free_RVs]
    from pymc_optim.model.laplace import (
        _initial_mode,
        _laplace_node,
        _outputs_mode_success,
        _recovery_function,
    )

    node = _laplace_node(marginal)
    solve, cold = _recovery_function(marginal, node, True), _initial_mode(node)
    in_sequence = _recover(  # in sampling order, every solve from the model's initial point
        marginal,
        lambda draw, point, start, noise: _outputs_mode_success(solve(*point, cold, noise)),
        hyper,
        np.random.default_rng(7),
        False,
    )
    for c in range(2):
        np.testing.assert_allclose(
            idata.posterior["x"].values[c], in_sequence[c][0], rtol=1e-6, atol=1e-7
        )
    assert idata.posterior["x_solved"].values.all()


def test_vectorizing_the_sparse_ops_batches_the_values_without_a_blockwise_loop(problem):
    """vectorize_graph over a batch of values (and right-hand sides) gives the Ops on (B, nnz)
    values, no Blockwise; the values and the gradient equal the one-matrix graphs'."""
    from pytensor.graph.replace import vectorize_graph

    pattern, values, _ = problem
    v, b = pt.vector("v"), pt.vector("b")
    weights = np.linspace(-1.0, 1.0, pattern.n)
    out = pattern.logdet(v) + (pattern.solve(v, b) * weights).sum()
    outputs = [out, pattern.sample(v, 0.0, b), pytensor.grad(out, v)]
    V, B = pt.matrix("V"), pt.matrix("B")
    batched = pytensor.function([V, B], vectorize_graph(outputs, {v: V, b: B}))
    ops = {type(node.op).__name__ for node in batched.maker.fgraph.apply_nodes}
    assert "Blockwise" not in ops and {"SparseLogdetOp", "SparseSolveOp"} <= ops
    one = pytensor.function([v, b], outputs)
    rng = np.random.default_rng(2)
    batch = np.stack([values, 1.3 * values])
    rhs = rng.normal(size=(2, pattern.n))
    got = batched(batch, rhs)
    for k in range(2):
        for g, want in zip(got, one(batch[k], rhs[k]), strict=True):
            np.testing.assert_allclose(g[k], want, rtol=RTOL, atol=1e-12)


# --- sequences of nearby solves (recover_latent's) -------------------------------------------
def softplus_grid(m):
    """The structure, and per a the system and the merit of min ½ τ Σ (x_i − x_j)² + 0.05 Σ x²
    + Σ (eˣ − a x) on an m × m grid (τ = 1.3), in numpy, as `iterations.newton` takes them (A
    compact on the grid pattern)."""
    edges = grid_edges(m)
    structure = SparseStructure.from_edges(edges)
    rows, cols, n = structure.pattern.rows, structure.pattern.cols, m * m
    adjacency = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    adjacency = adjacency + adjacency.T
    laplacian = sp.diags(np.asarray(adjacency.sum(axis=1)).ravel()) - adjacency
    Q = (1.3 * laplacian + 0.1 * sp.identity(n)).tocsr()

    def problem(a):
        def merit(z):
            return np.array([0.5 * z @ (Q @ z) + (np.exp(z) - a * z).sum()])

        def system(z):
            A = np.asarray(Q[rows, cols]).ravel() + np.where(rows == cols, np.exp(z)[rows], 0.0)
            return merit(z), Q @ z + np.exp(z) - a, A

        return system, merit

    return structure, problem


def test_chord_steps_reuse_the_last_factor_and_reach_the_newton_solution(monkeypatch):
    """From the solution of a nearby problem, with its A as `chord`, the solve takes chord
    steps on A's cached factor and factorizes once, at its last iterate z (``final_step=False``
    returns z: max|F(z)| ≤ tol, and z − A(z)⁻¹F(z) is the cold solve's solution to rounding). A
    chord matrix far from A (100 A) fails the contraction test at once and Newton takes over."""
    from pymc_optim.backends import iterations

    m, tol = 6, 1e-8
    a = 1.0 + np.arange(m * m) % 3
    structure, problem = softplus_grid(m)
    kwargs = {"structure": structure, "minimization": True, "tol": tol, "max_iter": 50}
    z_a, ok, *_ = iterations.newton(*problem(a), np.zeros(m * m), **kwargs)
    assert ok.all()
    reference = problem(a)[0](z_a)[2]
    system, merit = problem(a + 0.05)
    expected, ok, _, cold_evaluations, _ = iterations.newton(system, merit, z_a, **kwargs)
    assert ok.all()
    calls = []
    original = _cholesky.factorize
    monkeypatch.setattr(_cholesky, "factorize", lambda s, x: calls.append(1) or original(s, x))
    for chord, newton_steps in [(reference, False), (100 * reference, True)]:
        structure.solve_numpy(chord, np.ones(m * m))  # the chord matrix's factor, cached
        calls.clear()
        z, ok, _, n_evaluations, _ = iterations.newton(
            system, merit, z_a, chord=chord, final_step=False, **kwargs
        )
        _, F, A = system(z)
        assert ok.all() and np.abs(F).max() <= tol
        np.testing.assert_allclose(z - structure.solve_numpy(A, F), expected, rtol=0, atol=1e-14)
        # chord steps: the last iterate's factorization alone (the solve above reuses it)
        assert (len(calls) > 1) == newton_steps
        assert n_evaluations[0] > 1


def test_factor_caches_are_per_thread(monkeypatch):
    """Two threads alternating between their own matrices on one pattern keep their own last
    factor: each matrix is factorized once."""
    import threading

    H = grid_precision(4, seed=2)
    pattern, values = SparsePattern.from_scipy(H)
    calls = []
    original = _cholesky.factorize
    monkeypatch.setattr(_cholesky, "factorize", lambda s, x: calls.append(1) or original(s, x))
    turns = [threading.Event(), threading.Event()]

    def work(k):
        for _ in range(3):
            turns[k].wait()
            turns[k].clear()
            assert pattern._factor(values * (k + 1))[0] is not None
            turns[1 - k].set()

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    turns[0].set()
    for thread in threads:
        thread.join()
    assert len(calls) == 2


def test_recover_latent_factorizes_once_per_draw_and_threads_keep_the_draws(monkeypatch):
    """Along the tour each draw's solve takes chord steps on the previous draw's factor and
    factorizes H once, at its last iterate, whose factor the draw reuses: one factorization per
    draw after each run's cold solve. Each draw's mode is the cold solve's to rounding, and the
    runs (here of 10 draws) walked by two threads give the draws of one thread bit for bit."""
    import arviz as az

    from pymc_optim.model import laplace

    model, edges = gmrf_poisson_model(6)
    marginal = pmo.marginalize_laplace(
        model, "x", hessian_structure=SparseStructure.from_edges(edges)
    )
    info = pmo.laplace_info(marginal)
    cold_mode = pytensor.function(
        marginal.value_vars, marginal.replace_rvs_by_values([info.mode])[0]
    )
    rng = np.random.default_rng(5)
    posterior = {"tau": np.exp(rng.normal(0.2, 0.05, (2, 30))), "b": rng.normal(0.4, 0.02, (2, 30))}
    monkeypatch.setattr(laplace, "RUN_DRAWS", 10)
    calls, solves = [], []
    original_factorize, original_recover = _cholesky.factorize, laplace._recover
    monkeypatch.setattr(
        _cholesky, "factorize", lambda s, x: calls.append(1) or original_factorize(s, x)
    )

    def recording(marginal_model, solve, *args, **kwargs):
        def spy(draw, point, start, noise):
            before = len(calls)
            outputs, mode, success = solve(draw, point, start, noise)
            solves.append((bool(start.any()), len(calls) - before, point, mode))
            return outputs, mode, success

        return original_recover(marginal_model, spy, *args, **kwargs)

    monkeypatch.setattr(laplace, "_recover", recording)
    draws = {}
    for cores in (1, 2):
        idata = pmo.recover_latent(
            marginal, az.from_dict({"posterior": posterior}), random_seed=4, progressbar=False,
            cores=cores,
        )  # fmt: skip
        assert bool(idata.posterior["x_solved"].all())
        draws[cores] = idata.posterior["x"].values
        if cores == 1:
            assert sum(not warm for warm, *_ in solves) == 6  # one cold start per run
            assert [n for warm, n, *_ in solves if warm] == [1] * 54
            for _, _, (tau, b), mode in solves:
                expected = cold_mode(np.log(tau), b)
                np.testing.assert_allclose(mode, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(draws[1], draws[2])
