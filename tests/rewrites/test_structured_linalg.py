"""Kronecker and block-diagonal rewrites: compiled structure, values and gradients vs dense."""

import contextlib

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.linalg
import scipy.stats
from pytensor.compile.mode import get_default_mode
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.linalg import Cholesky, Det, LUFactor, SLogDet, SolveBase

import pymc_optim as pmo
from pymc_optim.rewrites.structured_linalg import TAG, structure_linalg

ONLY_PYTENSOR = get_default_mode().excluding(TAG)
#: Dense reference: neither these rewrites nor PyTensor's own Kronecker/block-diagonal ones.
DENSE = ONLY_PYTENSOR.excluding(
    "lift_linalg_of_expanded_matrices",
    "det_of_kronecker",
    "det_of_blockdiag",
    "block_diag_solve_to_block_diag_solves",
)
N_A, N_B = 4, 3  # factor sizes: the Kronecker matrix is 12 × 12
N = N_A * N_B
RTOL = 1e-9  # the structured and dense routes differ by rounding only (float64)


@contextlib.contextmanager
def pymc_own_graph():
    """Graphs built inside are PyMC's own (importing pymc_optim factors MvNormal's log density
    as PyMC builds it, see pymc_optim.rewrites.structured_linalg): the dense references."""
    pmo.disable_rewrites()
    try:
        yield
    finally:
        pmo.enable_rewrites()


def spd(rng, k, batch=()):
    x = rng.normal(size=(*batch, k, k))
    return x @ np.swapaxes(x, -1, -2) + k * np.eye(k)


def decompositions(f, size):
    """Cholesky / LU / solve / det / slogdet nodes of `f` acting on a (…, size, size) matrix
    (or on one of unknown static size)."""
    found = []
    for node in f.maker.fgraph.toposort():
        op = getattr(node.op, "core_op", node.op)
        if isinstance(op, Cholesky | LUFactor | SolveBase | Det | SLogDet):
            if node.inputs[0].type.shape[-1] in (size, None):
                found.append(type(op).__name__)
    return found


def big_nodes(f, size):
    """Nodes of `f` with any (…, size, size) input: none means the matrix is never formed."""
    return [
        str(node.op)
        for node in f.maker.fgraph.toposort()
        if any(i.ndim >= 2 and i.type.shape[-2:] == (size, size) for i in node.inputs)
    ]


def compile_both(inputs, outputs):
    return pytensor.function(inputs, outputs), pytensor.function(inputs, outputs, mode=DENSE)


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)


@pytest.fixture
def kron_inputs(rng):
    a = pt.matrix("a", shape=(N_A, N_A), dtype="float64")
    b = pt.matrix("b", shape=(N_B, N_B), dtype="float64")
    return a, b, spd(rng, N_A), spd(rng, N_B)


# --- Cholesky -----------------------------------------------------------------------------------


def test_cholesky_of_kron(kron_inputs):
    a, b, A, B = kron_inputs
    L = pt.linalg.cholesky(pt.linalg.kron(a, b))
    f, dense = compile_both([a, b], L)
    assert decompositions(f, N) == []
    assert decompositions(dense, N) == ["Cholesky"]
    expected = np.linalg.cholesky(np.kron(A, B))
    np.testing.assert_allclose(f(A, B), expected, rtol=RTOL, atol=1e-12)


def test_cholesky_of_block_diag_batched(rng):
    # Blockwise: a batch of 2 block-diagonal matrices with blocks of sizes 2, 3, 3.
    blocks = [pt.tensor(shape=(2, s, s), dtype="float64") for s in (2, 3, 3)]
    values = [spd(rng, s, (2,)) for s in (2, 3, 3)]
    L = pt.linalg.cholesky(pt.linalg.block_diag(*blocks))
    f, dense = compile_both(blocks, L)
    assert decompositions(f, 8) == [] and decompositions(dense, 8) == ["Cholesky"]
    expected = [
        np.linalg.cholesky(scipy.linalg.block_diag(*(v[i] for v in values))) for i in (0, 1)
    ]
    np.testing.assert_allclose(f(*values), np.stack(expected), rtol=RTOL, atol=1e-12)


def test_cholesky_of_batched_kron(rng):
    a, b = pt.matrix("a", dtype="float64"), pt.matrix("b", dtype="float64")
    a3 = pt.tensor("a3", shape=(2, N_A, N_A), dtype="float64")
    b3 = pt.tensor("b3", shape=(2, N_B, N_B), dtype="float64")
    L = vectorize_graph(pt.linalg.cholesky(pt.linalg.kron(a, b)), {a: a3, b: b3})
    A, B = spd(rng, N_A, (2,)), spd(rng, N_B, (2,))
    f, dense = compile_both([a3, b3], L)
    assert decompositions(f, N) == [] and decompositions(dense, N) == ["Cholesky"]
    expected = np.stack([np.linalg.cholesky(np.kron(A[i], B[i])) for i in (0, 1)])
    np.testing.assert_allclose(f(A, B), expected, rtol=RTOL, atol=1e-12)


# --- solves -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["solve", "solve_pos", "triangular", "cho_solve"])
@pytest.mark.parametrize("b_ndim", [1, 2])
def test_solve_with_kron(kron_inputs, rng, kind, b_ndim):
    a, b, A, B = kron_inputs
    K = pt.linalg.kron(a, b)
    rhs = pt.tensor("rhs", shape=(N,) if b_ndim == 1 else (N, 2), dtype="float64")
    R = rng.normal(size=rhs.type.shape)
    if kind == "solve":
        x = pt.linalg.solve(K, rhs, b_ndim=b_ndim)
        expected = np.linalg.solve(np.kron(A, B), R)
    elif kind == "solve_pos":
        x = pt.linalg.solve(K, rhs, assume_a="pos", b_ndim=b_ndim)
        expected = np.linalg.solve(np.kron(A, B), R)
    elif kind == "triangular":
        L = pt.linalg.kron(pt.linalg.cholesky(a), pt.linalg.cholesky(b))
        x = pt.linalg.solve_triangular(L.mT, rhs, lower=False, b_ndim=b_ndim)
        Ld = np.kron(np.linalg.cholesky(A), np.linalg.cholesky(B))
        expected = scipy.linalg.solve_triangular(Ld.T, R, lower=False)
    else:
        L = pt.linalg.kron(pt.linalg.cholesky(a), pt.linalg.cholesky(b))
        x = pt.linalg.cho_solve((L, True), rhs, b_ndim=b_ndim)
        expected = np.linalg.solve(np.kron(A, B), R)
    f, dense = compile_both([a, b, rhs], x)
    assert decompositions(f, N) == []
    assert decompositions(dense, N) != []
    np.testing.assert_allclose(f(A, B, R), expected, rtol=1e-8)


def test_triangular_solve_with_general_factors_stays_dense(kron_inputs):
    # tril(A ⊗ B) is not tril(A) ⊗ tril(B): without knowing the factors are triangular, the
    # rewrite must not fire.
    a, b, A, B = kron_inputs
    rhs = pt.vector("rhs", shape=(N,), dtype="float64")
    x = pt.linalg.solve_triangular(pt.linalg.kron(a, b), rhs, lower=True)
    f = pytensor.function([a, b, rhs], x)
    assert decompositions(f, N) == ["SolveTriangular"]
    R = np.arange(N, dtype=float)
    np.testing.assert_allclose(
        f(A, B, R), scipy.linalg.solve_triangular(np.kron(A, B), R, lower=True), rtol=1e-8
    )


@pytest.mark.parametrize("sizes", [(3, 3, 3, 3), (2, 3, 4)])
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_solve_with_block_diag(rng, sizes, assume_a):
    blocks = [pt.matrix(shape=(s, s), dtype="float64") for s in sizes]
    values = [spd(rng, s) for s in sizes]
    n = sum(sizes)
    rhs = pt.tensor("rhs", shape=(5, n), dtype="float64")  # a batch of 5 right-hand sides
    R = rng.normal(size=(5, n))
    x = pt.linalg.solve(pt.linalg.block_diag(*blocks), rhs, assume_a=assume_a, b_ndim=1)
    f, dense = compile_both([*blocks, rhs], x)
    assert decompositions(f, n) == [] and decompositions(dense, n) != []
    if len(set(sizes)) == 1:  # equal blocks: one batched factorization of the 4 stacked blocks
        factorizations = [
            node.inputs[0].type.shape
            for node in f.maker.fgraph.toposort()
            if isinstance(getattr(node.op, "core_op", node.op), Cholesky | LUFactor | SolveBase)
        ]
        assert factorizations and all(shape[-3:] == (4, 3, 3) for shape in factorizations)
    expected = np.linalg.solve(scipy.linalg.block_diag(*values), R.T).T
    np.testing.assert_allclose(f(*values, R), expected, rtol=1e-8)


# --- log-determinants ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["log_det", "slogdet", "cholesky"])
def test_logdet_of_kron(kron_inputs, form):
    a, b, A, B = kron_inputs
    K = pt.linalg.kron(a, b)
    if form == "log_det":
        out = pt.log(pt.linalg.det(K))
    elif form == "slogdet":
        out = pt.stack(pt.linalg.slogdet(K))
    else:
        out = 2 * pt.log(pt.diagonal(pt.linalg.cholesky(K))).sum()
    f, dense = compile_both([a, b], out)
    assert decompositions(f, N) == [] and decompositions(dense, N) != []
    sign, logdet = np.linalg.slogdet(np.kron(A, B))
    expected = [sign, logdet] if form == "slogdet" else logdet
    np.testing.assert_allclose(f(A, B), expected, rtol=RTOL)
    np.testing.assert_allclose(dense(A, B), expected, rtol=RTOL)


def test_log_det_of_kron_does_not_overflow():
    # det(10·I₃₀ ⊗ 10·I₃₀) = 10¹⁸⁰⁰ overflows float64; PyTensor's own det(A)^m det(B)^n too.
    a = pt.matrix("a", shape=(30, 30), dtype="float64")
    b = pt.matrix("b", shape=(30, 30), dtype="float64")
    out = pt.log(pt.linalg.det(pt.linalg.kron(a, b)))
    f = pytensor.function([a, b], out)
    A = 10 * np.eye(30)
    np.testing.assert_allclose(f(A, A), 1800 * np.log(10.0), rtol=RTOL)
    np.testing.assert_allclose(
        pytensor.function([a, b], out, mode=DENSE)(A, A), 1800 * np.log(10.0), rtol=RTOL
    )
    assert np.isinf(pytensor.function([a, b], out, mode=ONLY_PYTENSOR)(A, A))


def test_slogdet_of_block_diag_with_negative_block(rng):
    blocks = [pt.matrix(shape=(s, s), dtype="float64") for s in (2, 3)]
    values = [rng.normal(size=(s, s)) for s in (2, 3)]
    values[0] = np.array([[0.0, 1.0], [1.0, 0.0]])  # det −1
    out = pt.stack(pt.linalg.slogdet(pt.linalg.block_diag(*blocks)))
    f, dense = compile_both(blocks, out)
    assert decompositions(f, 5) == [] and decompositions(dense, 5) != []
    np.testing.assert_allclose(
        f(*values), np.linalg.slogdet(scipy.linalg.block_diag(*values)), rtol=RTOL
    )


def test_batched_log_det_compiles():
    # PyTensor 2.38 alone fails to compile log(det(·)) of a batch of matrices.
    x = pt.tensor3("x", dtype="float64")
    X = np.stack([np.eye(2) * k for k in (1.0, 2.0, 3.0)])
    out = pytensor.function([x], pt.log(pt.linalg.det(x)))(X)
    np.testing.assert_allclose(out, 2 * np.log([1.0, 2.0, 3.0]), rtol=RTOL)


# --- PyMC's MvNormal and the gradient -----------------------------------------------------------


def kron_covariance(theta):
    """A separable covariance of two positive parameters (lengthscales), symmetric for all θ."""
    t = np.linspace(0, 1, N_A)
    s = np.linspace(0, 1, N_B)
    k_t = pt.exp(-(((t[:, None] - t[None, :]) / theta[0]) ** 2)) + 0.1 * np.eye(N_A)
    k_s = pt.exp(-np.abs(s[:, None] - s[None, :]) / theta[1]) + 0.1 * np.eye(N_B)
    return pt.linalg.kron(k_t, k_s)


def numpy_logp(theta, x):
    t, s = np.linspace(0, 1, N_A), np.linspace(0, 1, N_B)
    k_t = np.exp(-(((t[:, None] - t[None, :]) / theta[0]) ** 2)) + 0.1 * np.eye(N_A)
    k_s = np.exp(-np.abs(s[:, None] - s[None, :]) / theta[1]) + 0.1 * np.eye(N_B)
    return scipy.stats.multivariate_normal(np.zeros(N), np.kron(k_t, k_s)).logpdf(x)


def test_mvnormal_kron_logp_and_gradient(rng):
    theta = pt.vector("theta", shape=(2,), dtype="float64")
    x = pt.vector("x", shape=(N,), dtype="float64")
    with pymc_own_graph():
        logp = pm.logp(pm.MvNormal.dist(mu=0, cov=kron_covariance(theta)), x)
    structured = structure_linalg(logp)
    f = pytensor.function([theta, x], [structured, *pytensor.grad(structured, [theta, x])])
    compile_only = pytensor.function([theta, x], [logp, *pytensor.grad(logp, [theta, x])])
    dense = pytensor.function([theta, x], [logp, *pytensor.grad(logp, [theta, x])], mode=DENSE)
    # Factored before differentiation: no 12 × 12 matrix anywhere, value or gradient.
    assert big_nodes(f, N) == []
    # Rewritten only at compile time: no decomposition of it, though the gradient still forms it.
    assert decompositions(compile_only, N) == []
    assert decompositions(dense, N) != []

    Theta, X = np.array([0.4, 0.7]), rng.normal(size=N)
    value, g_theta, g_x = f(Theta, X)
    np.testing.assert_allclose(value, numpy_logp(Theta, X), rtol=RTOL)
    for other in (compile_only, dense):
        for got, want in zip(other(Theta, X), (value, g_theta, g_x), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-8)
    eps = 1e-5  # central differences: error O(eps²) ≈ 1e-10 against values of order 1
    fd = [
        (numpy_logp(Theta + eps * e, X) - numpy_logp(Theta - eps * e, X)) / (2 * eps)
        for e in np.eye(2)
    ]
    np.testing.assert_allclose(g_theta, fd, rtol=1e-6)


def test_model_logp_is_factored_before_differentiation(rng):
    # PyMC's model.logp() passes through the rewrites (logprob cleanup), so compile_dlogp never
    # forms the covariance either.
    with pm.Model() as model:
        theta = pm.HalfNormal("theta", 1.0, shape=2)
        pm.MvNormal("x", mu=0, cov=kron_covariance(theta), shape=N)
    point = model.initial_point()
    point["x"] = rng.normal(size=N)
    dlogp = model.compile_dlogp()
    logp = model.compile_logp()
    assert big_nodes(dlogp.f, N) == [] and big_nodes(logp.f, N) == []

    value_vars = model.value_vars
    # The dense reference: the same density from pm.logp (not through the cleanup pass).
    x_rv, theta_rv = model["x"], model["theta"]
    theta_value = model.rvs_to_values[theta_rv]
    with pymc_own_graph():
        dense_graph = (
            pm.logp(
                pm.MvNormal.dist(mu=0, cov=kron_covariance(pt.exp(theta_value))),
                model.rvs_to_values[x_rv],
            ).sum()
            + pm.logp(pm.HalfNormal.dist(1.0, shape=2), pt.exp(theta_value)).sum()
            + theta_value.sum()
        )
    dense = pytensor.function(
        value_vars, [dense_graph, *pytensor.grad(dense_graph, value_vars)], mode=DENSE
    )
    assert decompositions(dense, N) != []
    values = [point[v.name] for v in value_vars]
    want = dense(*values)
    np.testing.assert_allclose(logp(point), want[0], rtol=1e-9)
    np.testing.assert_allclose(
        dlogp(point), np.concatenate([np.ravel(w) for w in want[1:]]), rtol=1e-8
    )


def test_mvnormal_block_diag_batched_values(rng):
    # Two observations of a 3-group random effect (blocks of 3): batched value, shared blocks.
    chol = pt.matrix("chol", shape=(3, 3), dtype="float64")
    cov_block = chol @ chol.T + 0.5 * pt.eye(3)
    cov = pt.linalg.block_diag(cov_block, cov_block, cov_block)
    x = pt.matrix("x", shape=(2, 9), dtype="float64")
    with pymc_own_graph():
        logp = pm.logp(pm.MvNormal.dist(mu=0, cov=cov), x).sum()
    structured = structure_linalg(logp)
    f = pytensor.function([chol, x], [structured, pytensor.grad(structured, chol)])
    dense = pytensor.function([chol, x], [logp, pytensor.grad(logp, chol)], mode=DENSE)
    assert big_nodes(f, 9) == [] and decompositions(dense, 9) != []
    C, X = np.tril(rng.normal(size=(3, 3))), rng.normal(size=(2, 9))
    S = scipy.linalg.block_diag(*[C @ C.T + 0.5 * np.eye(3)] * 3)
    expected = scipy.stats.multivariate_normal(np.zeros(9), S).logpdf(X).sum()
    value, grad = f(C, X)
    np.testing.assert_allclose(value, expected, rtol=RTOL)
    for got, want in zip(dense(C, X), (value, grad), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-8)


def test_rewrites_fire_inside_solver_op_inner_graphs(kron_inputs, rng):
    # The solver Ops compile their inner functions with pytensor.function: the rewrites apply.
    a, b, A, B = kron_inputs
    z = pt.vector("z", shape=(N,), dtype="float64")
    y = pt.as_tensor(rng.poisson(2.0, size=N).astype("float64"))
    prior = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(a, b)), z)
    objective = -(prior + (y * z - pt.exp(z)).sum())
    z_star, success = pmo.minimize(objective, z, x0=np.zeros(N), method="newton")
    op = z_star.owner.op
    functions = op._compiled_functions()
    assert functions
    for fn in functions.values():
        assert decompositions(fn, N) == []
    f = pytensor.function([a, b], [z_star, success])
    zs, ok = f(A, B)
    assert ok
    # The mode solves Σ⁻¹ z = y − exp(z).
    np.testing.assert_allclose(np.linalg.solve(np.kron(A, B), zs), y.data - np.exp(zs), atol=1e-8)


@pytest.mark.parametrize("side", ["left", "right"])
def test_matmul_with_kron(kron_inputs, rng, side):
    a, b, A, B = kron_inputs
    M = pt.matrix("M", shape=(N, 5) if side == "left" else (5, N), dtype="float64")
    K = pt.linalg.kron(a, b)
    out = K @ M if side == "left" else M.dot(K)
    f, dense = compile_both([a, b, M], out)
    assert big_nodes(f, N) == [] and big_nodes(dense, N) != []
    Mv = rng.normal(size=M.type.shape)
    expected = np.kron(A, B) @ Mv if side == "left" else Mv @ np.kron(A, B)
    np.testing.assert_allclose(f(A, B, Mv), expected, rtol=1e-10)


def test_laplace_marginal_with_kronecker_prior_is_exact_for_gaussian_likelihood(rng):
    # f ~ N(0, K_t(ℓ) ⊗ K_s), y ~ N(f, 0.5²): the Laplace marginal is exact, y ~ N(0, K + 0.25 I).
    t, s = np.linspace(0, 1, N_A), np.linspace(0, 1, N_B)
    K_s = np.exp(-0.5 * ((s[:, None] - s[None, :]) / 0.4) ** 2) + 1e-2 * np.eye(N_B)

    def k_t(ell, lib):
        return lib.exp(-0.5 * ((t[:, None] - t[None, :]) / ell) ** 2) + 1e-2 * np.eye(N_A)

    y = rng.normal(size=N)
    with pm.Model() as model:
        ell = pm.HalfNormal("ell", 1.0)
        f = pm.MvNormal("f", mu=0, cov=pt.linalg.kron(k_t(ell, pt), pt.as_tensor(K_s)), shape=N)
        pm.Normal("y", f, 0.5, observed=y)
    marginal = pmo.marginalize_laplace(model, "f", hessian_structure="dense")
    # The solver's parameters are the factors' Cholesky factors, not the 12 × 12 matrix.
    solver = pmo.laplace_info(marginal).success.owner.op
    shapes = [p.type.shape for p in solver.problem.inner_params]
    assert (N, N) not in [shape[-2:] for shape in shapes if len(shape) >= 2]

    def exact(log_ell):
        cov = np.kron(k_t(np.exp(log_ell), np), K_s) + 0.25 * np.eye(N)
        ell = np.exp(log_ell)
        prior = scipy.stats.halfnorm.logpdf(ell) + log_ell  # log-transformed hyperparameter
        return scipy.stats.multivariate_normal(np.zeros(N), cov).logpdf(y) + prior

    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    log_ell = np.log(0.3)
    point = {"ell_log__": np.array(log_ell)}
    np.testing.assert_allclose(logp(point), exact(log_ell), rtol=1e-8)
    eps = 1e-5  # central differences, error O(eps²)
    fd = (exact(log_ell + eps) - exact(log_ell - eps)) / (2 * eps)
    np.testing.assert_allclose(dlogp(point), [fd], rtol=1e-6)


@pytest.mark.parametrize("matrix", ["kron", "block_diag"])
def test_solve_and_logdet_gradients_equal_dense(kron_inputs, rng, matrix):
    # A scalar of a solve and a log-determinant, differentiated three ways: factored before
    # grad, rewritten at compile time only, dense; and against central differences.
    a, b, A, B = kron_inputs
    if matrix == "kron":
        M, size = pt.linalg.kron(a, b), N
    else:
        M, size = pt.linalg.block_diag(a, b), N_A + N_B
    rhs = pt.vector("rhs", shape=(size,), dtype="float64")
    R = rng.normal(size=size)
    out = (pt.linalg.solve(M, rhs) ** 2).sum() + pt.log(pt.linalg.det(M))
    wrt = [a, b, rhs]
    factored = structure_linalg(out)
    f = pytensor.function(wrt, [factored, *pytensor.grad(factored, wrt)])
    compile_only, dense = compile_both(wrt, [out, *pytensor.grad(out, wrt)])
    assert big_nodes(f, size) == [] and decompositions(compile_only, size) == []
    assert decompositions(dense, size) != []
    want = dense(A, B, R)
    for got in (f(A, B, R), compile_only(A, B, R)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-12)
    value = pytensor.function(wrt, out, mode=DENSE)
    eps = 1e-6  # central differences, error O(eps²) on entries of order 1
    direction = [rng.normal(size=v.shape) for v in (A, B, R)]
    fd = (
        value(*(v + eps * d for v, d in zip((A, B, R), direction, strict=True)))
        - value(*(v - eps * d for v, d in zip((A, B, R), direction, strict=True)))
    ) / (2 * eps)
    analytic = sum(np.sum(g * d) for g, d in zip(want[1:], direction, strict=True))
    np.testing.assert_allclose(analytic, fd, rtol=1e-6)


@pytest.mark.parametrize("kind", ["solve", "triangular"])
def test_one_matrix_many_columns(rng, kind):
    # A vectorized Jacobian solves with one matrix per direction: one solve with more columns.
    a = pt.matrix("a", shape=(5, 5), dtype="float64")
    rhs = pt.tensor("rhs", shape=(7, 2, 5, 3), dtype="float64")
    if kind == "solve":
        x = pt.linalg.solve(a[None, None], rhs, b_ndim=2)
        A = spd(rng, 5)
    else:
        x = pt.linalg.solve_triangular(a[None, None], rhs, lower=True, b_ndim=2)
        A = np.linalg.cholesky(spd(rng, 5))
    f, dense = compile_both([a, rhs], x)
    batched = [
        node
        for node in f.maker.fgraph.toposort()
        if getattr(node.op, "core_op", None) is not None and "Solve" in str(node.op)
    ]
    assert batched == [] and decompositions(f, 5) != []
    R = rng.normal(size=rhs.type.shape)
    np.testing.assert_allclose(f(A, R), dense(A, R), rtol=1e-10)
    np.testing.assert_allclose(f(A, R), np.linalg.solve(A, R), rtol=1e-8)


@pytest.mark.parametrize("lower", [True, False])
def test_masked_cholesky_gradient_is_pytensors(rng, lower):
    # the stacked blocks' Cholesky: the same reverse-mode gradient as PyTensor's, batched
    from pymc_optim.rewrites.structured_linalg import _MaskedCholesky

    S = pt.tensor3("S")
    W = pt.tensor3("W")
    ours = (Blockwise(_MaskedCholesky(lower=lower))(S) * W).sum()
    theirs = (pt.linalg.cholesky(S, lower=lower) * W).sum()
    fn = pytensor.function([S, W], [ours, theirs, pt.grad(ours, S), pt.grad(theirs, S)], mode=DENSE)
    m = rng.normal(size=(3, 4, 4))
    values = m @ m.transpose(0, 2, 1) + 4 * np.eye(4)
    v_ours, v_theirs, g_ours, g_theirs = fn(values, rng.normal(size=(3, 4, 4)))
    assert v_ours == pytest.approx(v_theirs, rel=RTOL)
    np.testing.assert_allclose(g_ours, g_theirs, rtol=RTOL, atol=1e-12)
