"""ICAR and GMRF distributions (pymc_optim.distributions.gmrf) against dense references."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
import scipy.sparse as sp
from scipy import stats

from pymc_optim.distributions.gmrf import GMRF, ICAR, ComponentZeroSumTransform


def grid_edges(rows, cols, offset=0):
    """4-neighbour edges of a rows × cols grid, nodes numbered row-major from `offset`."""
    index = np.arange(rows * cols).reshape(rows, cols) + offset
    right = np.column_stack([index[:, :-1].ravel(), index[:, 1:].ravel()])
    down = np.column_stack([index[:-1, :].ravel(), index[1:, :].ravel()])
    return np.concatenate([right, down])


def laplacian(n, edges, weights=None):
    w = np.ones(len(edges)) if weights is None else np.asarray(weights)
    L = np.zeros((n, n))
    for (i, j), wij in zip(edges, w, strict=True):
        L[i, i] += wij
        L[j, j] += wij
        L[i, j] -= wij
        L[j, i] -= wij
    return L


def components_matrix(n, sizes):
    """Rows: indicators of consecutive components of the given sizes."""
    A = np.zeros((len(sizes), n))
    start = 0
    for k, size in enumerate(sizes):
        A[k, start : start + size] = 1.0
        start += size
    return A


# Two islands: a weighted 3 × 4 grid and a 2 × 2 grid (n = 16, c = 2).
EDGES = np.concatenate([grid_edges(3, 4), grid_edges(2, 2, offset=12)])
WEIGHTS = np.linspace(0.5, 2.0, len(EDGES))
N, SIZES = 16, [12, 4]


def constrained_reference_logp(x, sigma):
    """log N(Uᵀx; 0, σ² Uᵀ L⁺ U), U an orthonormal basis of {A x = 0}: an isometric chart."""
    L = laplacian(N, EDGES, WEIGHTS)
    A = components_matrix(N, SIZES)
    U = np.linalg.svd(A)[2][len(SIZES) :].T  # the null space of A, orthonormal columns
    cov = sigma**2 * U.T @ np.linalg.pinv(L) @ U
    return stats.multivariate_normal(np.zeros(N - len(SIZES)), cov).logpdf(U.T @ x)


def zero_sum_point(seed):
    x = np.random.default_rng(seed).normal(size=N)
    A = components_matrix(N, SIZES)
    return x - A.T @ (A @ x / np.array(SIZES))


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5])
def test_icar_logp_is_the_normalised_density_on_the_subspace(sigma):
    rv = ICAR.dist(edges=EDGES, weights=WEIGHTS, sigma=sigma, islands="per_component")
    x = zero_sum_point(1)
    got = pm.logp(rv, x).eval()
    # Different routes (pseudo-inverse + SVD vs matrix-tree theorem + sparse Cholesky) of
    # O(10) condition number: agreement to rounding, 1e-10 relative.
    np.testing.assert_allclose(got, constrained_reference_logp(x, sigma), rtol=1e-10)


def test_icar_soft_constraint_is_a_normalised_proper_gaussian():
    eps, sigma = 0.05, 0.7
    rv = ICAR.dist(
        edges=EDGES, weights=WEIGHTS, sigma=sigma, constraint="soft", epsilon=eps,
        islands="per_component",
    )  # fmt: skip
    A = components_matrix(N, SIZES)
    sizes = np.array(SIZES, dtype=float)
    precision = laplacian(N, EDGES, WEIGHTS) / sigma**2 + A.T @ np.diag(1 / (eps * sizes) ** 2) @ A
    x = np.random.default_rng(2).normal(size=N)  # not zero-sum: the soft penalty is active
    expected = stats.multivariate_normal(np.zeros(N), np.linalg.inv(precision)).logpdf(x)
    np.testing.assert_allclose(pm.logp(rv, x).eval(), expected, rtol=1e-10)


def test_icar_adjacency_and_edges_agree_and_dims_work():
    W = sp.coo_array((WEIGHTS, (EDGES[:, 0], EDGES[:, 1])), shape=(N, N))
    W = (W + W.T).tocsr()
    coords = {"area": [f"a{i}" for i in range(N)]}
    with pm.Model(coords=coords) as model:
        ICAR("phi", adjacency=W, islands="per_component", dims="area")
        ICAR("psi", edges=EDGES[:, ::-1], weights=WEIGHTS, islands="per_component")
    x = zero_sum_point(3)
    logp = model.compile_logp(vars=[model["phi"], model["psi"]], jacobian=False, sum=False)
    # The roots are nodes 0 and 12 (first of each component); free coordinates x_i − x_root.
    free = np.delete(np.arange(N), [0, 12])
    y = (x - x[np.where(np.arange(N) < 12, 0, 12)])[free]
    point = {"phi_component_zerosum__": y, "psi_component_zerosum__": y}
    a, b = logp(point)
    np.testing.assert_allclose(a, b, rtol=1e-13)
    np.testing.assert_allclose(a, constrained_reference_logp(x, 1.0), rtol=1e-10)
    assert pm.draw(model["phi"], random_seed=1).shape == (N,)
    assert model.named_vars_to_dims["phi"] == ("area",)


def test_icar_draws_are_exact_constrained_and_have_covariance_sigma2_pinv_L():
    sigma, draws = 1.5, 4000
    rv = ICAR.dist(edges=EDGES, weights=WEIGHTS, sigma=sigma, islands="per_component")
    x = pm.draw(rv, draws=draws, random_seed=7)
    A = components_matrix(N, SIZES)
    np.testing.assert_allclose(x @ A.T, 0.0, atol=1e-12)
    expected = sigma**2 * np.linalg.pinv(laplacian(N, EDGES, WEIGHTS))
    estimate = x.T @ x / draws  # the mean is known to be 0
    # Standard error of a covariance estimate from Gaussian draws: √((C_ii C_jj + C_ij²)/N).
    d = np.diag(expected)
    se = np.sqrt((np.outer(d, d) + expected**2) / draws)
    assert np.all(np.abs(estimate - expected) < 5 * se)


@pytest.mark.parametrize("sigma", [1.0, 2.5])
def test_icar_soft_draws_have_component_mean_scale_epsilon(sigma):
    """Whatever σ, as the log density has it (the draws' means had sd σε)."""
    eps, draws = 0.2, 4000
    rv = ICAR.dist(
        edges=EDGES, sigma=sigma, constraint="soft", epsilon=eps, islands="per_component"
    )
    x = pm.draw(rv, draws=draws, random_seed=3)
    means = x @ components_matrix(N, SIZES).T / np.array(SIZES)
    # The sample standard deviation of 4000 normal draws has relative error 1/√8000 ≈ 1.1 %.
    np.testing.assert_allclose(means.std(axis=0), eps, rtol=5 / np.sqrt(2 * draws))


def test_batched_fields_are_refused_not_ignored():
    """size/shape/dims asking for several fields were silently ignored (one field drawn)."""
    from pymc_optim.distributions.gmrf import RW

    for make, n in [
        (lambda **kw: ICAR.dist(edges=EDGES, islands="per_component", **kw), N),
        (lambda **kw: GMRF.dist(sp.eye(3, format="csr"), **kw), 3),
        (lambda **kw: RW.dist(n=3, **kw), 3),
    ]:
        for batch in ({"size": 2}, {"shape": (2, n)}):
            with pytest.raises(ValueError, match=f"is one field of {n} values; got"):
                make(**batch)
        assert pm.draw(make(shape=(n,)), random_seed=0).shape == (n,)
    with pm.Model(coords={"a": range(2), "b": range(3)}):
        with pytest.raises(ValueError, match="asks for several"):
            RW("x", n=3, dims=("a", "b"))


def test_a_scale_per_node_is_refused():
    """A vector sigma/tau: the draws read it per element, the density summed one field's
    density per element, so the model's density was not that of its draws."""
    from pymc_optim.distributions.gmrf import RW

    for make, argument in [
        (lambda v: ICAR.dist(edges=EDGES, islands="per_component", sigma=v), "`ICAR`'s `sigma`"),
        (lambda v: GMRF.dist(sp.eye(3, format="csr"), tau=v), "`GMRF`'s `tau`"),
        (lambda v: RW.dist(n=3, sigma=v), "`RW`'s `sigma`"),
    ]:
        with pytest.raises(ValueError, match=f"{argument} must be a scalar .* shape \\(3,\\)"):
            make(np.ones(3))
        make(pm.HalfNormal.dist())  # a symbolic scalar scale is fine


def test_values_of_the_wrong_length_are_refused():
    """A density of 4 nodes read 4 of 6 values (or normalised for 4) and gave a number."""
    from pymc_optim.distributions.gmrf import RW

    six = np.linspace(-1.0, 1.0, 6)
    for name, rv in [
        ("ICAR", ICAR.dist(edges=[(0, 1), (1, 2), (2, 3)])),
        ("RW", RW.dist(n=4)),
        ("GMRF", GMRF.dist(sp.eye(4, format="csr"))),
    ]:
        with pytest.raises(ValueError, match=f"`{name}`'s value must have 4 entries.*got 6"):
            pm.logp(rv, six)
    with pm.Model():
        with pytest.raises(ValueError, match="`RW`'s value must have 4 entries"):
            RW("y", n=4, observed=six)


def test_icar_model_gradient_matches_finite_differences():
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma")
        phi = ICAR("phi", edges=EDGES, weights=WEIGHTS, sigma=sigma, islands="per_component")
        pm.Poisson("y", mu=pt.exp(0.5 + phi), observed=np.arange(N) % 4)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    rng = np.random.default_rng(0)
    point = {"sigma_log__": np.array(0.2), "phi_component_zerosum__": rng.normal(size=N - 2)}
    grad = dlogp(point)
    flat = np.concatenate([np.atleast_1d(point[v.name]) for v in model.value_vars])
    # Central differences, h = 1e-5: truncation O(h²) ~ 1e-10, rounding ~ 1e-16·|logp|/h ~ 1e-9.
    h = 1e-5
    for _ in range(3):
        direction = rng.normal(size=flat.size)

        def at(vector):
            return logp({"sigma_log__": vector[0], "phi_component_zerosum__": vector[1:]})

        fd = (at(flat + h * direction) - at(flat - h * direction)) / (2 * h)
        np.testing.assert_allclose(grad @ direction, fd, rtol=1e-6)


def test_icar_transform_round_trips_on_the_subspace():
    component = np.repeat([0, 1], SIZES)
    transform = ComponentZeroSumTransform(component, np.array([0, 12]))
    x = zero_sum_point(5)
    y = transform.forward(x).eval()
    np.testing.assert_allclose(transform.backward(y).eval(), x, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(
        transform.log_jac_det(y).eval(), -0.5 * np.log(np.array(SIZES)).sum(), rtol=1e-14
    )


@pytest.mark.slow
def test_icar_through_pm_sample():
    """NUTS on the constrained coordinates: the draws sum to zero and σ is identified."""
    edges = grid_edges(4, 4)
    with pm.Model():
        sigma = pm.HalfNormal("sigma", 1.0)
        phi = ICAR("phi", edges=edges, sigma=sigma)
        pm.Poisson("y", mu=pt.exp(1.0 + phi), observed=np.tile([0, 3, 5, 9], 4))
        idata = pm.sample(
            draws=200, tune=200, chains=2, cores=2, random_seed=1, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    phi_draws = idata.posterior["phi"].values
    np.testing.assert_allclose(phi_draws.sum(axis=-1), 0.0, atol=1e-10)
    assert idata.sample_stats["diverging"].sum() < 20


def test_gmrf_logp_and_draws_match_dense():
    rng = np.random.default_rng(4)
    n = 30
    Q = sp.diags([-0.9, 2.0, -0.9], [-1, 0, 1], shape=(n, n)) + sp.diags(rng.uniform(0, 1, n))
    mu = rng.normal(size=n)
    rv = GMRF.dist(precision=Q, mu=mu, tau=2.0)
    x = rng.normal(size=n)
    cov = np.linalg.inv(2.0 * Q.toarray())
    expected = stats.multivariate_normal(mu, cov).logpdf(x)
    np.testing.assert_allclose(pm.logp(rv, x).eval(), expected, rtol=1e-10)
    draws = pm.draw(rv, draws=4000, random_seed=2)
    d = np.diag(cov)
    se = np.sqrt((np.outer(d, d) + cov**2) / 4000)
    centred = draws - mu
    assert np.all(np.abs(centred.T @ centred / 4000 - cov) < 5 * se)


def test_gmrf_in_a_model_with_free_tau_gradient():
    Q = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], shape=(8, 8))
    with pm.Model() as model:
        tau = pm.Gamma("tau", 2.0, 2.0)
        GMRF("x", precision=Q, tau=tau)
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    point = {"tau_log__": np.array(0.3), "x": np.linspace(-1, 1, 8)}
    h = 1e-5
    up = dict(point, tau_log__=point["tau_log__"] + h)
    down = dict(point, tau_log__=point["tau_log__"] - h)
    np.testing.assert_allclose(dlogp(point)[0], (logp(up) - logp(down)) / (2 * h), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"adjacency": sp.csr_array(np.array([[0, 1, 0], [0, 0, 1], [0, 1, 0]]))},
            r"`adjacency` must be symmetric.*W\[0, 1\] = 1 but W\[1, 0\] = 0",
        ),
        (
            {"adjacency": np.array([[1, 1], [1, 0]])},
            r"`adjacency` must have a zero diagonal.*W\[0, 0\] = 1",
        ),
        (
            {"adjacency": np.array([[0, np.nan, 0], [np.nan, 0, 1.0], [0, 1.0, 0]])},
            r"non-negative finite weights; got W\[0, 1\] = nan",
        ),
        (
            {"adjacency": np.array([[0, -1.0], [-1.0, 0]])},
            r"non-negative finite weights; got W\[0, 1\] = -1",
        ),
        ({"edges": [(0, 1), (1, 2)], "n": 4}, r"1 isolated node\(s\).*e\.g\. node 3"),
        (
            {"edges": [(0, 1), (2, 3), (3, 4)]},
            r"2 connected components \(islands\), of sizes \[3, 2\].*islands=\"per_component\"",
        ),
        ({"edges": [(0, 1), (1, 0)]}, r"each undirected edge once; \(0, 1\) appears 2 times"),
        ({"edges": [(0, 1), (1, 1)]}, r"self-loops; got \(1, 1\) at row 1"),
        ({"edges": [(0, 1)], "weights": [-1.0]}, r"`weights` must be 1 positive finite"),
        ({"edges": [(0.0, 1.0)]}, r"`edges` must be an integer array of shape \(E, 2\)"),
        ({"edges": [(0, 5)], "n": 3}, r"`edges` must index nodes 0\.\.2"),
        ({"edges": [(0, 1)], "constraint": None}, r"`constraint` must be.*improper"),
        ({}, r"exactly one of `edges`.*or `adjacency`"),
    ],
)
def test_icar_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ICAR.dist(**kwargs)


def test_gmrf_bad_input():
    with pytest.raises(TypeError, match=r"`precision` must be a scipy.sparse matrix; got ndarray"):
        GMRF.dist(precision=np.eye(3))
    with pytest.raises(ValueError, match=r"`precision` must be symmetric"):
        GMRF.dist(precision=sp.csr_array(np.array([[2.0, 1.0], [0.0, 2.0]])))
    laplacian_2 = sp.csr_array(np.array([[1.0, -1.0], [-1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"`precision` must be positive definite.*use `ICAR`"):
        GMRF.dist(precision=laplacian_2)


def test_icar_logp_cost_is_linear_no_dense_matrix():
    """A 316 × 316 grid (N ≈ 10⁵): the log density graph holds no (N, N) tensor."""
    edges = grid_edges(316, 316)
    sigma = pt.scalar("sigma")
    rv = ICAR.dist(edges=edges, sigma=sigma)
    value = pt.vector("x")
    logp = pm.logp(rv, value)
    f = pytensor.function([value, sigma], [logp, pytensor.grad(logp, value)])
    for node in f.maker.fgraph.apply_nodes:
        for var in node.outputs:
            assert var.ndim <= 1, node
    x = np.zeros(316 * 316)
    assert np.isfinite(f(x, 1.0)[0])


@pytest.mark.slow
def test_icar_corner_constraint_density_draws_and_sparse_laplace():
    import pymc_optim as pmo

    sigma = 0.8
    rv = ICAR.dist(
        edges=EDGES, weights=WEIGHTS, sigma=sigma, constraint="corner", islands="per_component"
    )
    free = np.delete(np.arange(N), [0, 12])  # the roots: first node of each component
    L = laplacian(N, EDGES, WEIGHTS)
    x = np.zeros(N)
    x[free] = np.random.default_rng(8).normal(size=free.size)
    cov = sigma**2 * np.linalg.inv(L[np.ix_(free, free)])
    expected = stats.multivariate_normal(np.zeros(free.size), cov).logpdf(x[free])
    np.testing.assert_allclose(pm.logp(rv, x).eval(), expected, rtol=1e-10)
    draws = pm.draw(rv, draws=5, random_seed=1)
    np.testing.assert_array_equal(draws[:, [0, 12]], 0.0)

    # The Laplace marginal with the sparse structure in the free coordinates equals the dense.
    edges = grid_edges(4, 4)
    with pm.Model() as model:
        s = pm.HalfNormal("sigma", 1.0)
        b = pm.Normal("b", 0.0, 2.0)
        phi = ICAR("phi", edges=edges, sigma=s, constraint="corner")
        pm.Poisson("y", mu=pt.exp(b + phi), observed=np.tile([0, 3, 5, 9], 4))
    structure = ICAR.hessian_structure(edges)
    assert structure.pattern.n == 15
    sparse_model = pmo.marginalize_laplace(model, "phi", hessian_structure=structure)
    dense_model = pmo.marginalize_laplace(model, "phi", hessian_structure="dense")
    point = {"sigma_log__": np.array(-0.3), "b": np.array(1.2)}
    np.testing.assert_allclose(
        sparse_model.compile_logp()(point), dense_model.compile_logp()(point), rtol=1e-8
    )
    np.testing.assert_allclose(
        sparse_model.compile_dlogp()(point), dense_model.compile_dlogp()(point), rtol=1e-8
    )


# --- RW1 / RW2 ----------------------------------------------------------------------------------


def _difference_matrix(n, order):
    D = np.diff(np.eye(n), n=order, axis=0)  # (n − k, n)
    return D


@pytest.mark.parametrize("order", [1, 2])
def test_rw_logp_is_the_proper_gaussian_of_its_free_values(order):
    """Free values x_k.. with x_0..x_{k-1} = 0: precision D_fᵀD_f/σ² (D_f = D without the
    anchors' columns), against scipy's multivariate normal."""
    from pymc_optim.distributions.gmrf import RW

    n, sigma = 7, 0.6
    D = _difference_matrix(n, order)[:, order:]
    cov = sigma**2 * np.linalg.inv(D.T @ D)
    x = np.concatenate([np.zeros(order), np.random.default_rng(order).normal(size=n - order)])
    got = pm.logp(RW.dist(n=n, order=order, sigma=sigma), x).eval()
    want = stats.multivariate_normal(np.zeros(n - order), cov).logpdf(x[order:])
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("order", [1, 2])
def test_rw_draws_have_the_walks_covariance(order):
    """10⁴ draws: the sample covariance of the free values within 5 Monte Carlo standard errors
    of σ² (D_fᵀD_f)⁻¹ entry by entry (the standard error of a covariance from m draws of a
    Gaussian is √((Σ_ii Σ_jj + Σ_ij²)/m))."""
    from pymc_optim.distributions.gmrf import RW

    n, sigma, m = 5, 0.7, 10_000
    draws = pm.draw(RW.dist(n=n, order=order, sigma=sigma), draws=m, random_seed=5)
    assert np.all(draws[:, :order] == 0)
    D = _difference_matrix(n, order)[:, order:]
    cov = sigma**2 * np.linalg.inv(D.T @ D)
    sample = np.cov(draws[:, order:].T)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / m)
    assert np.all(np.abs(sample - cov) <= 5 * se)


def test_rw_in_a_model_samples_free_values_and_takes_the_sparse_laplace():
    import pymc_optim as pmo
    from pymc_optim.distributions.gmrf import RW
    from pymc_optim.linalg.sparse import SparseStructure

    n = 300
    y = np.random.default_rng(0).poisson(3.0, size=n)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 0.2)
        b = pm.Normal("b", 0.0, 2.0)
        slope = pm.Normal("slope", 0.0, 0.1)
        x = RW("x", n=n, order=2, sigma=sigma)
        pm.Poisson("y", mu=pt.exp(b + slope * np.arange(n) + x), observed=y)
    assert model.initial_point()["x_component_corner__"].shape == (n - 2,)
    structure = pmo.laplace_info(pmo.marginalize_laplace(model, "x")).structure
    assert isinstance(structure, SparseStructure)
    # the pentadiagonal RW2 precision on the 298 free values: 298 + 297 + 296 entries
    assert structure.pattern.nnz == 298 + 297 + 296


def test_rw_errors():
    from pymc_optim.distributions.gmrf import RW

    with pytest.raises(ValueError, match=r"`order` must be 1 \(RW1\) or 2 \(RW2\); got 3"):
        RW.dist(n=5, order=3)
    with pytest.raises(ValueError, match=r"`n` must be an integer larger than `order` \(2\)"):
        RW.dist(n=2, order=2)
    with pytest.raises(ValueError, match=r'`constraint` must be "anchored" or "sum_to_zero"'):
        RW.dist(n=5, order=2, constraint="soft")


@pytest.mark.parametrize("order", [1, 2])
def test_rw_sum_to_zero_is_the_normalised_density_on_the_null_space_complement(order):
    """constraint="sum_to_zero": N(0, σ² (DᵀD)⁺) on {A x = 0} (A: constants, and the linear
    trend for RW2), against scipy in an isometric chart of that subspace."""
    from pymc_optim.distributions.gmrf import RW

    n, sigma = 9, 0.6
    D = _difference_matrix(n, order)
    A = np.vstack([np.ones(n), np.arange(n)])[:order]
    U = np.linalg.svd(A)[2][order:].T  # orthonormal basis of {A x = 0}
    x = U @ np.random.default_rng(order).normal(size=n - order)
    cov = sigma**2 * U.T @ np.linalg.pinv(D.T @ D) @ U
    got = pm.logp(RW.dist(n=n, order=order, sigma=sigma, constraint="sum_to_zero"), x).eval()
    want = stats.multivariate_normal(np.zeros(n - order), cov).logpdf(U.T @ x)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("order", [1, 2])
def test_rw_sum_to_zero_draws_and_transform(order):
    """Draws satisfy A x = 0 and have covariance σ² (DᵀD)⁺ within 5 Monte Carlo standard
    errors; the NullSpaceTransform round-trips on the subspace and its log-Jacobian is the
    volume factor √det(EᵀPE) of its (linear) backward map."""
    from pymc_optim.distributions.gmrf import RW, NullSpaceTransform

    n, sigma, m = 6, 0.7, 10_000
    x = RW.dist(n=n, order=order, sigma=sigma, constraint="sum_to_zero")
    draws = pm.draw(x, draws=m, random_seed=4)
    A = np.vstack([np.ones(n), np.arange(n)])[:order]
    assert np.abs(draws @ A.T).max() < 1e-12
    cov = sigma**2 * np.linalg.pinv(_difference_matrix(n, order).T @ _difference_matrix(n, order))
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / m)
    assert np.all(np.abs(np.cov(draws.T) - cov) <= 5 * se)

    with pm.Model() as model:
        RW("x", n=n, order=order, sigma=sigma, constraint="sum_to_zero")
    transform = model.rvs_to_transforms[model["x"]]
    assert isinstance(transform, NullSpaceTransform)
    y = transform.forward(draws[0]).eval()
    np.testing.assert_allclose(transform.backward(y).eval(), draws[0], atol=1e-12)
    backward = np.column_stack([transform.backward(e).eval() for e in np.eye(n - order)])
    volume = 0.5 * np.linalg.slogdet(backward.T @ backward)[1]
    np.testing.assert_allclose(transform.log_jac_det(y).eval(), volume, rtol=1e-12)


# --- bym2_scaling_factor ----------------------------------------------------------------------


def dense_scaling_factors(n, edges, weights=None):
    """The reference: diag of the dense pseudo-inverse of the Laplacian, geometric means over
    the nodes with a neighbour, overall and per component (isolated nodes: 1)."""
    from scipy.sparse.csgraph import connected_components

    variances = np.diag(np.linalg.pinv(laplacian(n, edges, weights), hermitian=True))
    adjacency = sp.coo_matrix((np.ones(len(edges)), tuple(np.asarray(edges).T)), shape=(n, n))
    _, component = connected_components(adjacency, directed=False)
    sizes = np.bincount(component)[component]
    overall = np.exp(np.log(variances[sizes > 1]).mean())
    per_node = np.ones(n)
    for k in np.unique(component[sizes > 1]):
        per_node[component == k] = np.exp(np.log(variances[component == k]).mean())
    return overall, per_node


@pytest.mark.parametrize(
    ("n", "edges", "weights"),
    [
        (9, np.column_stack([np.arange(8), np.arange(1, 9)]), None),  # a chain
        (20, grid_edges(4, 5), None),
        (16, EDGES, WEIGHTS),  # two weighted islands (components)
        # two components and an isolated node (node 7)
        (12, np.concatenate([grid_edges(2, 3), [(6, 8), (8, 9), (9, 10), (10, 11)]]), None),
    ],
    ids=["chain", "grid", "two-weighted-components", "components-and-isolated-node"],
)
def test_bym2_scaling_factor_equals_the_dense_pseudo_inverse(n, edges, weights):
    from pymc_optim.distributions import bym2_scaling_factor

    overall, per_node = dense_scaling_factors(n, edges, weights)
    np.testing.assert_allclose(
        bym2_scaling_factor(edges, weights=weights, n=n), overall, rtol=1e-10, atol=0
    )
    np.testing.assert_allclose(
        bym2_scaling_factor(edges, weights=weights, n=n, per_component=True),
        per_node,
        rtol=1e-10,
        atol=0,
    )
    # the same graph given as a sparse adjacency
    w = np.ones(len(edges)) if weights is None else weights
    upper = sp.coo_matrix((w, tuple(np.asarray(edges).T)), shape=(n, n))
    np.testing.assert_allclose(
        bym2_scaling_factor(adjacency=upper + upper.T), overall, rtol=1e-10, atol=0
    )


def test_bym2_scaling_factor_on_the_germany_map():
    """544 districts, one component: the sparse computation against the dense pseudo-inverse."""
    from pymc_optim.datasets import load_germany
    from pymc_optim.distributions import bym2_scaling_factor

    edges = load_germany().edges
    overall, _ = dense_scaling_factors(544, edges)
    np.testing.assert_allclose(bym2_scaling_factor(edges, n=544), overall, rtol=1e-10, atol=0)


def test_bym2_scaling_factor_refuses_a_malformed_graph():
    from pymc_optim.distributions import bym2_scaling_factor

    with pytest.raises(ValueError, match=r"Give exactly one of `edges`"):
        bym2_scaling_factor()
    with pytest.raises(ValueError, match=r"`edges` must list each undirected edge once"):
        bym2_scaling_factor([(0, 1), (1, 0)])
    with pytest.raises(ValueError, match=r"`adjacency` has no edge"):
        bym2_scaling_factor(adjacency=sp.csr_matrix((3, 3)))
