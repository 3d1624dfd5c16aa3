"""The fast paths on graphs written the way users write them, and explicit structures verified.

Each test builds the graph plainly (unshaped vectors, symbolic x0, default arguments,
``pm.logp`` of PyMC's distributions) and asserts the value and that the fast path was taken:
the structure of the solver Op, or the sizes of the compiled graph's Cholesky factorizations.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.linalg
import scipy.stats
from pytensor.compile.mode import get_default_mode
from pytensor.graph.basic import equal_computations
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.linalg import Cholesky

import pymc_optim as pmo
from pymc_optim.backends.newton import NewtonOp
from pymc_optim.linalg.detect import hessian_structure, jacobian_structure
from pymc_optim.rewrites.structured_linalg import _REWRITERS, TAG, batched_slogdet

G = 300
RNG = np.random.default_rng(13)
Y = RNG.poisson(np.exp(0.5 + RNG.normal(0, 0.7, G))).astype(float)


def _poisson_objective(x, mu, sg):
    return -((Y * (mu + x) - pt.exp(mu + x)).sum() - 0.5 * (x**2).sum() / sg**2)


def _solver_ops(fn):
    return [
        node.op.core_op if isinstance(node.op, Blockwise) else node.op
        for node in fn.maker.fgraph.apply_nodes
        if isinstance(node.op.core_op if isinstance(node.op, Blockwise) else node.op, NewtonOp)
    ]


# --- structure="auto" in the solvers ------------------------------------------------------------


def test_poisson_random_intercepts_default_structure_is_diagonal():
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    x = pt.vector("x")  # no static shape: x0 fixes it
    x_star, success = pmo.minimize(
        _poisson_objective(x, mu, sg), x, x0=pt.zeros(G), method="newton"
    )
    out = (x_star**2).sum()
    fn = pytensor.function([mu, sg], [out, *pt.grad(out, [mu, sg]), success])
    [op] = _solver_ops(fn)
    assert op.condition.structure.kind == "diagonal"

    # the value and gradient against the dense Hessian (a different linear-algebra path)
    x_dense, _ = pmo.minimize(
        _poisson_objective(x, mu, sg), x, x0=pt.zeros(G), method="newton", structure="dense"
    )
    out_dense = (x_dense**2).sum()
    dense = pytensor.function([mu, sg], [out_dense, *pt.grad(out_dense, [mu, sg])])
    *got, ok = fn(0.4, 0.8)
    assert ok
    np.testing.assert_allclose(got, dense(0.4, 0.8), rtol=1e-10)
    # and the minimizer itself: each x_i solves y_i − exp(μ + x_i) − x_i/σ² = 0
    x_value = pytensor.function([mu, sg], x_star)(0.4, 0.8)
    np.testing.assert_allclose(Y - np.exp(0.4 + x_value) - x_value / 0.64, 0, atol=1e-8)


def test_detection_with_symbolic_x0_pm_logp_and_indexing():
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    group = np.repeat(np.arange(50), 4)
    counts = RNG.poisson(2.0, group.size)
    x = pt.vector("x")
    objective = -(
        pm.logp(pm.Poisson.dist(pt.exp(mu + x[group])), counts).sum()
        + pm.logp(pm.Normal.dist(0, sg), x).sum()
    )
    x0 = mu * pt.ones(50)  # symbolic, depends on a parameter
    x_star, success = pmo.minimize(objective, x, x0=x0, method="newton")
    assert x_star.owner.op.condition.structure.kind == "diagonal"
    grad_fn = pytensor.function([mu, sg], [x_star, pt.grad(x_star.sum(), sg), success])
    x_value, g, ok = grad_fn(0.3, 1.2)
    assert ok
    sums = np.bincount(group, counts, minlength=50)
    np.testing.assert_allclose(sums - 4 * np.exp(0.3 + x_value) - x_value / 1.44, 0, atol=1e-8)
    # d x*/dσ from the diagonal implicit rule against central differences of the solve
    solve = pytensor.function([mu, sg], x_star.sum())
    eps = 1e-5
    assert g == pytest.approx((solve(0.3, 1.2 + eps) - solve(0.3, 1.2 - eps)) / (2 * eps), rel=1e-6)


def test_detection_with_several_controls_and_under_vectorize_graph():
    a = pt.vector("a")
    x, z = pt.vector("x"), pt.vector("z")
    objective = (pt.cosh(x - a) + (z - 2 * a) ** 2).sum()
    (x_star, z_star), _ = pmo.minimize(
        objective, [x, z], x0=[pt.zeros_like(a), pt.zeros_like(a)], method="newton"
    )
    assert x_star.owner.op.condition.structure.kind == "diagonal"
    batched_a = pt.matrix("batched_a")
    [bx, bz] = vectorize_graph([x_star, z_star], {a: batched_a})
    fn = pytensor.function([batched_a], [bx, bz, pt.grad((bx + bz).sum(), batched_a)])
    ops = _solver_ops(fn)
    assert ops and all(op.condition.structure.kind == "diagonal" for op in ops)
    values = np.arange(6.0).reshape(2, 3)
    bx_value, bz_value, g = fn(values)
    np.testing.assert_allclose(bx_value, values, atol=1e-8)
    np.testing.assert_allclose(bz_value, 2 * values, atol=1e-8)
    np.testing.assert_allclose(g, 3.0, atol=1e-8)  # d(x* + z*)/da = 1 + 2


def test_coupled_objective_stays_dense():
    x, a = pt.vector("x"), pt.vector("a")
    objective = ((x[1:] - x[:-1]) ** 2).sum() + ((x - a) ** 2).sum()
    x_star, _ = pmo.minimize(objective, x, x0=np.zeros(4), method="newton")
    assert x_star.owner.op.condition.structure.kind == "dense"
    a_value = np.array([1.0, -2.0, 0.5, 3.0])
    # ∇ = 0: (I + D) x = a with D the path-graph Laplacian
    laplacian = np.diag([1.0, 2, 2, 1]) - np.eye(4, k=1) - np.eye(4, k=-1)
    np.testing.assert_allclose(
        x_star.eval({a: a_value}), np.linalg.solve(np.eye(4) + laplacian, a_value), atol=1e-8
    )


def test_root_and_fixed_point_detect_element_wise_equations():
    c = pt.vector("c")
    x = pt.vector("x")
    x_star, success = pmo.root(x**3 - c, x, x0=pt.ones_like(c), method="newton")
    assert x_star.owner.op.condition.structure.kind == "diagonal"
    c_value = np.array([8.0, 27.0, 1.0])
    fn = pytensor.function([c], [x_star, pt.grad(x_star.sum(), c), success])
    root, g, ok = fn(c_value)
    assert ok
    # Newton stops at max|F| ≤ 1e-8 (its default tol): |x − ∛c| ≤ 1e-8 / (3 x²) to first order
    scaled_error = np.abs(root - np.cbrt(c_value)) * 3 * np.cbrt(c_value) ** 2
    np.testing.assert_array_less(scaled_error, 1e-8)
    np.testing.assert_allclose(g, c_value ** (-2 / 3) / 3, rtol=1e-8)

    x_fp, _ = pmo.fixed_point(pt.cos(x) * c, x, x0=pt.zeros_like(c), method="newton")
    assert x_fp.owner.op.condition.structure.kind == "diagonal"
    value = x_fp.eval({c: np.array([0.5, 1.0, 0.2])})
    np.testing.assert_allclose(value, np.cos(value) * [0.5, 1.0, 0.2], atol=1e-8)

    coupled, _ = pmo.root(x**3 - x.sum() - c, x, x0=pt.ones_like(c), method="newton")
    assert coupled.owner.op.condition.structure.kind == "dense"


def test_structural_reading_does_not_depend_on_the_size():
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    x = pt.vector("x")
    assert hessian_structure(_poisson_objective(x, mu, sg), [x]).kind == "diagonal"
    assert jacobian_structure([pt.exp(x) - mu], [x]).kind == "diagonal"
    assert hessian_structure(x.sum() ** 2, [x]).kind == "dense"
    assert hessian_structure((x[::-1] * x).sum(), [x]).kind == "dense"


COV_3 = np.array([[1.0, 0.5, 0.2], [0.5, 1.25, -0.2], [0.2, -0.2, 1.13]])


def _correlated_effects_objective(X, mu, sg, prior):
    """Poisson counts with b correlated effects per group: row r of X is group r's effects."""
    counts = np.random.default_rng(3).poisson(2.0, size=(40, 3))
    if prior == "pm.logp(MvNormal)":
        log_prior = pm.logp(pm.MvNormal.dist(mu=np.zeros(3), cov=sg**2 * COV_3), X).sum()
    else:  # written out
        log_prior = -0.5 * ((X @ np.linalg.inv(COV_3)) * X).sum() / sg**2
    return -(pm.logp(pm.Poisson.dist(pt.exp(mu + X)), counts).sum() + log_prior)


def _value_and_gradient(x_star, mu, sg):
    out = (x_star**2).sum()
    return pytensor.function([mu, sg], [out, *pt.grad(out, [mu, sg])])


@pytest.mark.parametrize("prior", ["written out", "pm.logp(MvNormal)"])
def test_matrix_shaped_x_with_independent_rows_is_block_diagonal(prior):
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    X = pt.matrix("X")  # no static shape: x0 fixes it
    objective = _correlated_effects_objective(X, mu, sg, prior)
    x_star, success = pmo.minimize(objective, X, x0=pt.zeros((40, 3)), method="newton")
    fn = _value_and_gradient(x_star, mu, sg)
    [op] = _solver_ops(fn)
    assert (op.condition.structure.kind, op.condition.structure.block_size) == (
        "block_diagonal",
        3,
    )
    x_dense, _ = pmo.minimize(
        objective, X, x0=pt.zeros((40, 3)), method="newton", structure="dense"
    )
    np.testing.assert_allclose(
        fn(0.3, 0.9), _value_and_gradient(x_dense, mu, sg)(0.3, 0.9), rtol=1e-10
    )
    assert pytensor.function([mu, sg], success)(0.3, 0.9)


def test_sum_of_per_group_objectives_is_block_diagonal():
    mu = pt.scalar("mu")
    x = pt.vector("x")
    groups = [x[2 * g : 2 * g + 2] for g in range(6)]  # a Python loop, as users write it
    objective = sum(pt.logsumexp(v + mu) + 0.5 * (v**2).sum() + v[0] * v[1] for v in groups)
    x_star, success = pmo.minimize(objective, x, x0=pt.zeros(12), method="newton")
    structure = x_star.owner.op.condition.structure
    assert (structure.kind, structure.block_size) == ("block_diagonal", 2)
    value, g, ok = pytensor.function([mu], [x_star, pt.grad(x_star.sum(), mu), success])(0.2)
    assert ok
    # every group solves softmax(v + μ) + v + (v₁, v₀) = 0
    v = value.reshape(6, 2)
    softmax = np.exp(v + 0.2) / np.exp(v + 0.2).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(softmax + v + v[:, ::-1], 0, atol=1e-8)
    solve = pytensor.function([mu], x_star.sum())
    eps = 1e-5
    assert g == pytest.approx((solve(0.2 + eps) - solve(0.2 - eps)) / (2 * eps), rel=1e-6)


def test_root_of_row_wise_equations_is_block_diagonal():
    c = pt.matrix("c")
    X = pt.matrix("X")
    mixing = np.array([[1.0, 0.3], [-0.2, 1.0]])
    x_star, success = pmo.root(pt.tanh(X @ mixing) + X - c, X, x0=np.zeros((5, 2)), method="newton")
    structure = x_star.owner.op.condition.structure
    assert (structure.kind, structure.block_size) == ("block_diagonal", 2)
    c_value = np.random.default_rng(8).normal(size=(5, 2))
    value, ok = pytensor.function([c], [x_star, success])(c_value)
    assert ok
    np.testing.assert_allclose(np.tanh(value @ mixing) + value - c_value, 0, atol=1e-8)


# --- explicit structures verified --------------------------------------------------------------


def test_explicit_structure_dropping_entries_is_an_error():
    x, a = pt.vector("x"), pt.vector("a", shape=(4,))
    objective = ((x[1:] - x[:-1]) ** 2).sum() + ((x - a) ** 2).sum()
    with pytest.raises(
        ValueError, match=r"`structure='diagonal'` drops nonzero entries .*\(0, 1\)"
    ):
        pmo.minimize(objective, x, x0=np.zeros(4), method="newton", structure="diagonal")
    # a correct explicit structure is accepted
    x_star, _ = pmo.minimize(objective, x, x0=np.zeros(4), method="newton", structure="dense")
    assert x_star.owner.op.condition.structure.kind == "dense"


def test_laplace_explicit_diagonal_on_coupled_latents_is_an_error():
    cov = np.array([[1.0, 0.8, 0.0], [0.8, 1.0, 0.3], [0.0, 0.3, 1.0]])
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma")
        latent = pm.MvNormal("latent", mu=np.zeros(3), cov=cov)
        pm.Normal("y", latent, sigma, observed=[0.5, -0.2, 1.0])
    with pytest.raises(
        ValueError, match=r"`hessian_structure='diagonal'` drops nonzero entries .*\(0, 1\)"
    ):
        pmo.marginalize_laplace(model, "latent", hessian_structure="diagonal")
    marginal = pmo.marginalize_laplace(model, "latent")
    # not diagonal: the prior's covariance plus the likelihood's curvature (H = K⁻¹ + W)
    assert pmo.laplace_info(marginal).structure.kind == "latent_gaussian"
    # Gaussian-Gaussian: the Laplace marginal is exact
    point = {"sigma_log__": np.log(0.7)}
    logp = marginal.compile_logp(vars=[marginal.potentials[0]], sum=True, jacobian=False)
    want = scipy.stats.multivariate_normal(np.zeros(3), cov + 0.49 * np.eye(3)).logpdf(
        [0.5, -0.2, 1.0]
    )
    assert float(logp(point)) == pytest.approx(want, rel=1e-10)


# --- Kronecker MvNormal as PyMC builds it ---------------------------------------------------------

N_A, N_B = 6, 5


def _spd(n, seed):
    m = np.random.default_rng(seed).normal(size=(n, n))
    return m @ m.T / n + np.eye(n)


def _cholesky_sizes(fn) -> set[int | None]:
    return {
        node.inputs[0].type.shape[-1]
        for node in fn.maker.fgraph.apply_nodes
        if isinstance(node.op.core_op if isinstance(node.op, Blockwise) else node.op, Cholesky)
    }


@pytest.mark.parametrize("form", ["cov", "chol", "tau", "three factors"])
def test_pm_logp_of_kronecker_mvnormal_is_factored(form):
    A, B = pt.matrix("A", shape=(N_A, N_A)), pt.matrix("B", shape=(N_B, N_B))
    values = [_spd(N_A, 1), _spd(N_B, 2)]
    inputs = [A, B]
    if form == "cov":
        dist, dense_cov = pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(A, B)), np.kron(*values)
    elif form == "chol":
        chol = pt.linalg.kron(pt.linalg.cholesky(A), pt.linalg.cholesky(B))
        dist, dense_cov = pm.MvNormal.dist(mu=0, chol=chol), np.kron(*values)
    elif form == "tau":
        dist = pm.MvNormal.dist(mu=0, tau=pt.linalg.kron(A, B))
        dense_cov = np.linalg.inv(np.kron(*values))
    else:
        C = pt.matrix("C", shape=(2, 2))
        inputs.append(C)
        values.append(_spd(2, 3))
        dist = pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(pt.linalg.kron(A, B), C))
        dense_cov = np.kron(np.kron(values[0], values[1]), values[2])
    n = dense_cov.shape[0]
    x = pt.vector("x", shape=(n,))
    x_value = np.random.default_rng(4).normal(size=n)
    logp = pm.logp(dist, x)
    fn = pytensor.function([*inputs, x], [logp, *pt.grad(logp, [*inputs, x])])
    assert max(_cholesky_sizes(fn)) <= N_A  # only the factors are factorized
    got = fn(*values, x_value)
    assert got[0] == pytest.approx(
        scipy.stats.multivariate_normal(np.zeros(n), dense_cov).logpdf(x_value), rel=1e-10
    )
    pmo.disable_rewrites()
    try:
        logp_ref = pm.logp(dist, x)
        ref = pytensor.function([*inputs, x], [logp_ref, *pt.grad(logp_ref, [*inputs, x])])
    finally:
        pmo.enable_rewrites()
    for g, r in zip(got, ref(*values, x_value), strict=True):
        # a gradient with respect to a symmetric matrix is meaningful in symmetric directions
        # only: the dense and the factored Cholesky gradients differ in their antisymmetric part
        np.testing.assert_allclose(_symmetric(g), _symmetric(r), rtol=1e-8, atol=1e-10)


def test_pm_logp_of_block_diagonal_mvnormal_is_one_batched_factorization():
    # equal blocks are factored as one stack: one batched Cholesky (not one per block), and a
    # gradient without the per-block Python loops of AllocDiag that PyTensor's Cholesky gradient
    # vectorizes into
    from pytensor.tensor.basic import AllocDiag

    G, b = 4, 5
    blocks = [pt.matrix(f"S{i}", shape=(b, b)) for i in range(G)]
    values = [_spd(b, 10 + i) for i in range(G)]
    x = pt.vector("x", shape=(G * b,))
    x_value = np.random.default_rng(4).normal(size=G * b)
    logp = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.block_diag(*blocks)), x)
    fn = pytensor.function([*blocks, x], [logp, *pt.grad(logp, [*blocks, x])])
    choleskys = [
        node
        for node in fn.maker.fgraph.apply_nodes
        if isinstance(node.op.core_op if isinstance(node.op, Blockwise) else node.op, Cholesky)
    ]
    assert len(choleskys) == 1
    assert choleskys[0].inputs[0].type.shape == (G, b, b)
    assert not [
        node
        for node in fn.maker.fgraph.apply_nodes
        if isinstance(node.op, Blockwise) and isinstance(node.op.core_op, AllocDiag)
    ]
    got = fn(*values, x_value)
    dense_cov = scipy.linalg.block_diag(*values)
    assert got[0] == pytest.approx(
        scipy.stats.multivariate_normal(np.zeros(G * b), dense_cov).logpdf(x_value), rel=1e-10
    )
    pmo.disable_rewrites()
    try:
        logp_ref = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.block_diag(*blocks)), x)
        ref = pytensor.function([*blocks, x], [logp_ref, *pt.grad(logp_ref, [*blocks, x])])
    finally:
        pmo.enable_rewrites()
    for g, r in zip(got, ref(*values, x_value), strict=True):
        np.testing.assert_allclose(_symmetric(g), _symmetric(r), rtol=1e-8, atol=1e-10)


def test_constrained_newton_on_a_plain_vector_takes_the_schur_path():
    # written as a user would: unshaped x, x0 = pt.zeros(n), default structure
    from pymc_optim.linalg.structure import LinearStructure
    from pymc_optim.problems.constrained.kkt import KKTStructure

    n = 50
    x, a, c = pt.vector("x"), pt.vector("a"), pt.scalar("c")
    objective = (pt.exp(x) + 0.5 * x**2 - a * x).sum()
    outs = {}
    for structure in ("auto", "dense"):
        x_star, ok = pmo.minimize(
            objective,
            x,
            x0=pt.zeros(n),
            method="newton",
            constraints={"type": "eq", "fun": x.sum() - c},
            structure=structure,
        )
        outs[structure] = (x_star, pytensor.function([a, c], [x_star, ok, pt.grad(x_star[0], c)]))
    assert outs["auto"][0].owner.op.condition.structure == KKTStructure(
        hessian=LinearStructure("diagonal")
    )
    a_val = np.linspace(-1, 1, n)
    fast, dense = outs["auto"][1](a_val, 0.5), outs["dense"][1](a_val, 0.5)
    assert fast[1] and dense[1]
    # the same KKT system solved two ways: equal to rounding (condition number ≈ 10)
    np.testing.assert_allclose(fast[0], dense[0], atol=1e-12)
    np.testing.assert_allclose(fast[2], dense[2], atol=1e-12)


def _symmetric(a):
    a = np.asarray(a)
    return (a + a.T) / 2 if a.ndim == 2 else a


def _kernel(points, lengthscale):
    d2 = (points[:, None] - points[None, :]) ** 2
    return pt.exp(-0.5 * d2 / lengthscale**2) + 0.1 * np.eye(points.size)


def test_kronecker_mvnormal_in_a_model_is_factored_in_every_compiled_function():
    t, s = np.linspace(0, 1, N_A), np.linspace(0, 1, N_B)
    n = N_A * N_B
    with pm.Model() as model:
        ell = pm.HalfNormal("ell")
        pm.MvNormal("x", mu=0, cov=pt.linalg.kron(_kernel(t, ell), _kernel(s, 2 * ell)))
        inside = pm.logp(model["x"], model.rvs_to_values[model["x"]])
    point = {"ell_log__": np.log(0.4), "x": np.random.default_rng(5).normal(size=n)}
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    fn = model.logp_dlogp_function(ravel_inputs=True)  # what pm.sample compiles
    fn.set_extra_values({})
    for compiled in (logp.f, dlogp.f, fn._pytensor_function):
        assert max(_cholesky_sizes(compiled)) <= N_A
    inside_fn = pytensor.function(
        model.value_vars, pt.grad(inside, model.value_vars[1]), on_unused_input="ignore"
    )
    assert max(_cholesky_sizes(inside_fn)) <= N_A

    def kernel(points, ell):
        return np.exp(-0.5 * (points[:, None] - points[None, :]) ** 2 / ell**2) + 0.1 * np.eye(
            points.size
        )

    cov = np.kron(kernel(t, 0.4), kernel(s, 0.8))
    want = scipy.stats.multivariate_normal(np.zeros(n), cov).logpdf(point["x"])
    halfnormal = scipy.stats.halfnorm.logpdf(0.4) + np.log(0.4)  # with the log-Jacobian
    assert float(logp(point)) == pytest.approx(want + halfnormal, rel=1e-10)
    # dlogp/dx = −Σ⁻¹ x
    np.testing.assert_allclose(
        dlogp(point)[1:], -np.linalg.solve(cov, point["x"]), rtol=1e-8, atol=1e-10
    )
    flat = np.concatenate([[point["ell_log__"]], point["x"]])
    np.testing.assert_allclose(fn(flat)[1], dlogp(point), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_pm_sample_runs_on_the_factored_kronecker_density():
    t, s = np.linspace(0, 1, N_A), np.linspace(0, 1, N_B)
    with pm.Model() as model:
        ell = pm.HalfNormal("ell")
        pm.MvNormal("x", mu=0, cov=pt.linalg.kron(_kernel(t, ell), _kernel(s, 2 * ell)))
        step = pm.NUTS()  # the step pm.sample would build, and its compiled logp + gradient
        assert max(_cholesky_sizes(step._logp_dlogp_func._pytensor_function)) <= N_A
        idata = pm.sample(
            draws=100, tune=100, chains=2, cores=2, step=step, random_seed=13, progressbar=False
        )
    x_draws = idata.posterior["x"].values.reshape(-1, N_A * N_B)
    ell_draws = idata.posterior["ell"].values.ravel()
    assert np.all(np.isfinite(x_draws)) and np.all(ell_draws > 0)
    # the sampled density at a draw is the dense one
    logp = model.compile_logp(vars=[model["x"]], jacobian=False)
    k = np.argmax(ell_draws)
    point = {"ell_log__": np.log(ell_draws[k]), "x": x_draws[k]}

    def kernel(points, ell):
        d2 = (points[:, None] - points[None, :]) ** 2
        return np.exp(-0.5 * d2 / ell**2) + 0.1 * np.eye(points.size)

    cov = np.kron(kernel(t, ell_draws[k]), kernel(s, 2 * ell_draws[k]))
    want = scipy.stats.multivariate_normal(np.zeros(N_A * N_B), cov).logpdf(x_draws[k])
    assert float(logp(point)) == pytest.approx(want, rel=1e-10)


# --- the global rewrites and how to turn them off ------------------------------------------------


def _unrelated_graphs():
    a, b, v = pt.matrix("a"), pt.matrix("b"), pt.vector("v")
    spd = a @ a.T + pt.eye(a.shape[0])
    dense_logp = pm.logp(pm.MvNormal.dist(mu=0, cov=spd), v)
    return [
        ([a, v], [dense_logp, *pt.grad(dense_logp, [a, v])]),
        ([a, b], [pt.linalg.solve(a, b), pt.log(pt.linalg.det(a))]),
        ([v], [pt.exp(v).sum(), pt.grad(pt.exp(v).sum(), v)]),
    ]


def test_unrelated_graphs_compile_to_the_same_thing(monkeypatch):
    # PyTensor 2.38 compiles the dense MvNormal gradient nondeterministically, with or without
    # pymc_optim: `broadcast_shape_iter` orders the symbolic lengths of a broadcast through a
    # set of Variables (hashed by address), so the shape asserts' inputs, and whether merge
    # finds them equal, change from one compilation to the next (77 to 86 nodes in one process).
    # Only the shape (integer and boolean) part varies; the computation must be identical.
    fired, calls = [], []
    for rewriter in (*_REWRITERS, batched_slogdet):
        monkeypatch.setattr(rewriter, "fn", _spy(rewriter, fired, calls))
    excluded = get_default_mode().excluding(TAG, "pmo_batched_slogdet")
    for inputs, outputs in _unrelated_graphs():
        with_rewrites = pytensor.function(inputs, outputs)
        without = pytensor.function(inputs, outputs, mode=excluded)
        assert _computation(with_rewrites) == _computation(without)
    assert calls  # the spies were consulted, so the next line can fail
    assert fired == []  # and no rewrite of ours replaced anything
    # the spies see a rewrite that fires (a Kronecker covariance)
    A, B = pt.matrix("A", shape=(N_A, N_A)), pt.matrix("B", shape=(N_B, N_B))
    pytensor.function([A, B], pt.linalg.cholesky(pt.linalg.kron(A, B)))
    assert "structured_cholesky" in fired


def test_pymc_dense_mvnormal_density_is_pymcs_own_graph():
    a, v = pt.matrix("a"), pt.vector("v")
    cov = a @ a.T + pt.eye(a.shape[0])
    ours = pm.logp(pm.MvNormal.dist(mu=0, cov=cov), v)
    pmo.disable_rewrites()
    try:
        pymcs = pm.logp(pm.MvNormal.dist(mu=0, cov=cov), v)
    finally:
        pmo.enable_rewrites()
    assert equal_computations([ours], [pymcs])


def _spy(rewriter, fired, calls):
    original = rewriter.fn

    def spy(fgraph, node):
        calls.append(rewriter.__name__)
        result = original(fgraph, node)
        if result:
            fired.append(rewriter.__name__)
        return result

    return spy


def _computation(fn) -> list[str]:
    """The floating-point part of the compiled graph, one line per node in depth-first order:
    integer and boolean values (shapes, their asserts, parameter checks) print as their type."""
    fgraph = fn.maker.fgraph
    names = {var: f"input{i}" for i, var in enumerate(fgraph.inputs)}
    lines: list[str] = []

    def name(var):
        if var in names:
            return names[var]
        if not var.type.dtype.startswith("float"):
            return f"<{var.type}>"
        if var.owner is None:
            return f"{var.type}{{{var.data!r}}}" if hasattr(var, "data") else str(var.type)
        args = ", ".join(name(i) for i in var.owner.inputs)
        for out in var.owner.outputs:
            names[out] = f"v{len(lines)}.{var.owner.outputs.index(out)}"
        lines.append(f"{names[var]} = {var.owner.op}({args}) : {var.type}")
        return names[var]

    return [name(out) for out in fgraph.outputs] + lines


def test_disable_rewrites_gives_pytensors_own_compilation():
    A, B = pt.matrix("A", shape=(N_A, N_A)), pt.matrix("B", shape=(N_B, N_B))
    x = pt.vector("x", shape=(N_A * N_B,))
    assert pmo.rewrites_enabled()
    pmo.disable_rewrites()
    try:
        assert not pmo.rewrites_enabled()
        logp = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(A, B)), x)
        outputs = [logp, *pt.grad(logp, [A, B])]
        disabled = pytensor.function([A, B, x], outputs)
        excluded = pytensor.function(
            [A, B, x], outputs, mode=get_default_mode().excluding(TAG, "pmo_batched_slogdet")
        )
    finally:
        pmo.enable_rewrites()
    assert _printed(disabled) == _printed(excluded)


def _printed(fn) -> str:
    """The compiled graph, Op by Op (ids assigned in order, so equal graphs print equally)."""
    return pytensor.printing.debugprint(fn, file="str", print_type=True)
