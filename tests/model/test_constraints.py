"""Sum-to-zero constraints by conditioning by kriging (pymc_optim.model.constraints) in
marginalize_laplace and recover_latent, against dense oracles.

Oracles: with a Gaussian likelihood the Laplace marginal is exact, p(y | θ) = N(y; μ, Σ_prior +
s² I) with Σ_prior = σ² Q⁺ the intrinsic prior's covariance on {A x = 0}; with a Poisson
likelihood, the library's own Laplace in the n − k free coordinates of the sampling transform
(dense H): the Laplace approximation is invariant under affine reparametrizations, so the two
agree to rounding when the constrained mode is exact.
"""

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim.distributions.gmrf import ICAR, RW, ComponentZeroSumTransform, NullSpaceTransform
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.model.laplace import _laplace_node

POINTS = [{"mu": 0.3, "sigma_log__": -0.2}, {"mu": -1.0, "sigma_log__": 0.5}]


def laplacian(n, edges):
    L = np.zeros((n, n))
    for i, j in edges:
        L[i, i] += 1
        L[j, j] += 1
        L[i, j] -= 1
        L[j, i] -= 1
    return L


def chain_edges(n, offset=0):
    """A path with two chords (a graph with cycles), nodes offset.. offset + n − 1."""
    path = [(offset + i, offset + i + 1) for i in range(n - 1)]
    return np.array(path + [(offset, offset + n // 2), (offset + 1, offset + n - 2)])


def icar_model(edges, y, likelihood, *, transform=None, **icar_kwargs):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        kwargs = {} if transform is None else {"transform": transform}
        phi = ICAR("phi", edges=edges, sigma=sigma, **kwargs, **icar_kwargs)
        if likelihood == "normal":
            pm.Normal("y", mu + phi, 0.7, observed=y)
        else:
            pm.Poisson("y", pt.exp(mu + phi), observed=y)
    return model


def gaussian_oracle(y, prior_cov, noise_sd=0.7):
    """The exact marginal model: y ~ N(μ, σ² C + s² I), C the prior's covariance at σ = 1."""
    n = y.size
    with pm.Model() as oracle:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.MvNormal("y", mu, cov=sigma**2 * prior_cov + noise_sd**2 * np.eye(n), observed=y)
    return oracle


def assert_same_logp_and_gradient(model, reference, atol=1e-8):
    for point in POINTS:
        got, want = model.compile_logp()(point), reference.compile_logp()(point)
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
        np.testing.assert_allclose(
            model.compile_dlogp()(point), reference.compile_dlogp()(point), rtol=0, atol=atol
        )


class _UnconstrainedChart(ComponentZeroSumTransform):
    """The same sampling transform without its constraint matrix: marginalize_laplace then
    integrates in the n − c free coordinates (the dense reparametrization oracle)."""

    constraint_matrix = None


def _chart(edges, n):
    from pymc_optim.distributions.gmrf import _icar_graph

    graph = _icar_graph(edges, None, None, n, "sum_to_zero", 1e-3, "per_component")
    return _UnconstrainedChart(graph.component, graph.roots)


def test_gaussian_icar_kriged_marginal_is_exact():
    """Value and gradient equal the closed form to 1e-8 (measured ≤ 1e-13): Gaussian
    likelihood, so the constrained mode is one kriging step and the Laplace marginal exact."""
    n = 10
    edges = chain_edges(n)
    y = np.random.default_rng(1).normal(size=n)
    marginal = pmo.marginalize_laplace(icar_model(edges, y, "normal"), "phi")
    node = _laplace_node(marginal)
    np.testing.assert_array_equal(node.op.constraint, np.ones((1, n)))
    oracle = gaussian_oracle(y, np.linalg.pinv(laplacian(n, edges)))
    assert_same_logp_and_gradient(marginal, oracle)


def test_islands_get_one_constraint_per_component_and_stay_exact():
    edges = np.concatenate([chain_edges(8), chain_edges(6, offset=8)])
    n = 14
    y = np.random.default_rng(2).normal(size=n)
    model = icar_model(edges, y, "normal", islands="per_component")
    marginal = pmo.marginalize_laplace(model, "phi")
    A = _laplace_node(marginal).op.constraint
    assert A.shape == (2, n)
    np.testing.assert_array_equal(A.sum(axis=1), [8, 6])
    oracle = gaussian_oracle(y, np.linalg.pinv(laplacian(n, edges)))
    assert_same_logp_and_gradient(marginal, oracle)


@pytest.mark.slow
def test_poisson_icar_kriged_on_the_sparse_factor_matches_the_dense_chart():
    """N = 300 (sparse by "auto", with the sparse Ops only): the exact constrained mode (Newton
    on the multiplier) gives the Laplace marginal of the n − 1 free coordinates to 1e-8 in
    value and gradient (measured ≤ 6e-13)."""
    n = 300
    edges = chain_edges(n)
    y = np.random.default_rng(3).poisson(2.0, size=n)
    marginal = pmo.marginalize_laplace(icar_model(edges, y, "poisson"), "phi")
    structure = pmo.laplace_info(marginal).structure
    assert isinstance(structure, SparseStructure)
    assert structure.pattern.nnz == n + len(edges)
    ops = {type(node.op).__name__ for node in marginal.compile_dlogp().f.maker.fgraph.toposort()}
    assert "Cholesky" not in ops  # no dense factorization of H
    chart = icar_model(edges, y, "poisson", transform=_chart(edges, n))
    reference = pmo.marginalize_laplace(chart, "phi", hessian_structure="dense")
    assert _laplace_node(reference).op.constraint is None
    assert_same_logp_and_gradient(marginal, reference)


@pytest.mark.slow
def test_poisson_icar_dense_kriging_matches_the_dense_chart():
    n = 12
    edges = chain_edges(n)
    y = np.random.default_rng(4).poisson(2.0, size=n)
    marginal = pmo.marginalize_laplace(icar_model(edges, y, "poisson"), "phi")
    assert pmo.laplace_info(marginal).structure.kind == "dense"
    chart = icar_model(edges, y, "poisson", transform=_chart(edges, n))
    assert_same_logp_and_gradient(marginal, pmo.marginalize_laplace(chart, "phi"))


def spectral_oracle(y, difference, noise_sd=0.7):
    """The exact marginal model written in the eigenbasis of the intrinsic prior's precision
    Q = DᵀD (at σ = 1), D the (N − k, N) `difference` operator: along an eigenvector with
    q > 0, y − μ has variance σ²/q + s², along the null space s². No pseudo-inverse: a
    covariance built from ``pinv(Q)`` carried a rounding residue along the null space that moved
    the oracle's logp by up to 5e-6 at N = 300. The eigenpairs come from the SVD of D (q the
    squared singular values, the null space the last k right singular vectors), not from
    ``eigh(DᵀD)``: RW2's smallest q at N = 300 is ~1e-8 against a largest of 16, and eigh's
    absolute error ~ε‖Q‖ moved the oracle's logp by 1.3e-8 there; the SVD's relative error in
    q is ~ε‖D‖/√q ≈ 1e-12."""
    _, singular, vt = np.linalg.svd(difference, full_matrices=True)
    U = vt.T
    inv_q = np.concatenate([1.0 / singular**2, np.zeros(U.shape[0] - singular.size)])
    with pm.Model() as oracle:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        r = pt.as_tensor(U.T) @ (y - mu)
        v = sigma**2 * inv_q + noise_sd**2
        pm.Potential(
            "y", -0.5 * (r**2 / v).sum() - 0.5 * pt.log(v).sum() - 0.5 * y.size * np.log(2 * np.pi)
        )
    return oracle


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("n", [20, 300])
def test_gaussian_rw_sum_to_zero_kriged_marginal_is_exact(n, order):
    """RW1 (one constraint) and RW2 (two: constant and linear trend) with
    constraint="sum_to_zero": exact to 1e-8 against the spectral oracle in the eigenbasis of
    DᵀD (measured ≤ 1.2e-11 at N = 300, RW1 and RW2), on the dense path (N = 20) and the sparse one
    (N = 300). RW2's kriged gradient compiles in bounded memory since rewrites/stack_trace.py
    (before: 3.5 GB and a MemoryError inside PyTensor's rewriter at N = 20)."""
    y = np.random.default_rng(1).normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        x = RW("x", n=n, order=order, sigma=sigma, constraint="sum_to_zero")
        pm.Normal("y", mu + x, 0.7, observed=y)
    marginal = pmo.marginalize_laplace(model, "x")
    op = _laplace_node(marginal).op
    assert op.constraint.shape == (order, n)
    assert isinstance(op.structure, SparseStructure) == (n == 300)
    D = np.diff(np.eye(n), n=order, axis=0)  # the (N − k, N) k-th difference operator
    assert_same_logp_and_gradient(marginal, spectral_oracle(y, D))


def test_soft_constraint_differs_by_the_gaussian_of_the_component_mean():
    """The soft constraint (constraint="soft", ε = 1e-3) is the proper Gaussian whose
    component mean has standard deviation ε: its exact marginal is N(μ, σ² L⁺ + ε² 11ᵀ + s² I).
    Its Laplace marginal matches that to 1e-8, and differs from the kriged (exact) one by the
    difference of the two closed forms — measured ≈ 1e-5 here, growing as ε² n² / s²."""
    n = 10
    edges = chain_edges(n)
    y = np.random.default_rng(5).normal(size=n)
    kriged = pmo.marginalize_laplace(icar_model(edges, y, "normal"), "phi")
    soft = pmo.marginalize_laplace(icar_model(edges, y, "normal", constraint="soft"), "phi")
    assert _laplace_node(soft).op.constraint is None
    pinv = np.linalg.pinv(laplacian(n, edges))
    soft_cov = pinv + (1e-3) ** 2 * np.ones((n, n))
    with pm.Model() as soft_oracle:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        cov = sigma**2 * pinv + (1e-3) ** 2 * np.ones((n, n)) + 0.49 * np.eye(n)
        pm.MvNormal("y", mu, cov=cov, observed=y)
    del soft_cov
    assert_same_logp_and_gradient(soft, soft_oracle)
    exact = gaussian_oracle(y, pinv)
    for point in POINTS:
        gap = soft.compile_logp()(point) - kriged.compile_logp()(point)
        want = soft_oracle.compile_logp()(point) - exact.compile_logp()(point)
        np.testing.assert_allclose(gap, want, rtol=0, atol=1e-8)
        assert 1e-7 < abs(gap) < 1e-3  # the soft constraint is close, not exact


def test_recover_latent_draws_are_kriged_onto_the_constraint():
    """At fixed θ, 4000 draws satisfy A x = 0 to rounding and have the exact conditional mean
    and variances (Gaussian likelihood): mean within 4 Monte Carlo standard errors, variance
    within 4 standard errors of a variance (√(2/m) relative)."""
    n, m = 10, 4000
    edges = chain_edges(n)
    y = np.random.default_rng(6).normal(size=n)
    marginal = pmo.marginalize_laplace(icar_model(edges, y, "normal"), "phi")
    mu, sigma = 0.3, 0.8
    idata = az.from_dict(
        {"posterior": {"mu": np.full((1, m), mu), "sigma": np.full((1, m), sigma)}}
    )
    idata = pmo.recover_latent(marginal, idata, random_seed=7, progressbar=False)
    draws = idata.posterior["phi"].values.reshape(m, n)
    assert np.abs(draws.sum(axis=1)).max() < 1e-10
    prior = sigma**2 * np.linalg.pinv(laplacian(n, edges))
    gain = prior @ np.linalg.inv(prior + 0.49 * np.eye(n))
    mean, cov = gain @ (y - mu), prior - gain @ prior
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * sd / np.sqrt(m))
    assert np.all(np.abs(draws.var(axis=0) / np.diag(cov) - 1) < 4 * np.sqrt(2 / m))


def test_recover_latent_poisson_draws_satisfy_the_constraint_on_the_sparse_path():
    n = 300
    edges = chain_edges(n)
    y = np.random.default_rng(8).poisson(2.0, size=n)
    marginal = pmo.marginalize_laplace(icar_model(edges, y, "poisson"), "phi")
    idata = az.from_dict({"posterior": {"mu": np.full((1, 3), 0.5), "sigma": np.full((1, 3), 0.7)}})
    idata = pmo.recover_latent(marginal, idata, random_seed=1, progressbar=False)
    draws = idata.posterior["phi"].values[0]
    assert idata.posterior["phi_solved"].values.all()
    assert np.abs(draws.sum(axis=1)).max() < 1e-9
    assert draws.std(axis=0).min() > 0


def test_kriged_latent_refuses_a_diagonal_structure():
    n = 10
    model = icar_model(chain_edges(n), np.zeros(n), "normal")
    with pytest.raises(
        ValueError,
        match=r"`hessian_structure` must be 'auto', 'dense' or 'sparse' when a latent carries a "
        r"linear constraint \(\['phi'\].*got 'diagonal'",
    ):
        pmo.marginalize_laplace(model, "phi", hessian_structure="diagonal")


def test_null_space_transform_exposes_its_constraint():
    A = np.vstack([np.ones(5), np.arange(5.0)])
    transform = NullSpaceTransform(A, [0, 1])
    np.testing.assert_array_equal(transform.constraint_matrix, A)


# --- backends: the kriged marginal compiled by numba (nutpie) and JAX (numpyro, blackjax) -------
@pytest.mark.slow
def test_kriged_sparse_marginal_refuses_jax_naming_the_backends_that_run_it():
    """Under JAX the sparse Cholesky refuses when the function is compiled, naming the backends
    that run it (C, NUMBA) and the dense structure, which JAX runs."""
    pytest.importorskip("jax")
    n = 6
    model = icar_model(chain_edges(n), np.zeros(n), "poisson")
    marginal = pmo.marginalize_laplace(model, "phi", hessian_structure="sparse")
    with pytest.raises(
        NotImplementedError,
        match=r"\(sparse Cholesky\) has no JAX implementation; compile with PyTensor's default C "
        r"backend or mode='NUMBA', or, for a Laplace marginal under JAX, pass "
        r"`hessian_structure='dense'`",
    ):
        marginal.compile_logp(mode="JAX")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["NUMBA", "JAX"])
def test_kriged_marginals_and_draws_under_numba_and_jax_equal_the_c_backend(mode):
    """A kriged sum-to-zero ICAR (two nested Newton loops: the mode for fixed multipliers, and
    the multipliers) compiled by numba on the sparse factor and by JAX on the dense one, and a
    kriged RW2 (two constraints) under JAX: the marginal's value and gradient equal the C
    backend's to 1e-8 (measured ≤ 1e-15), and `recover_latent(mode=...)` gives the C backend's
    draws to 1e-8 from the same seed. With empty caches on a quiet machine numba takes ~75 s to
    compile the marginal and ~90 s the draws, JAX 12 s and 11 s (RW2 16 s)."""
    pytest.importorskip(mode.lower())
    n = 8
    edges = chain_edges(n)
    y = np.random.default_rng(9).poisson(2.0, size=n)
    structure = "sparse" if mode == "NUMBA" else "dense"  # JAX refuses the sparse factor
    icar = pmo.marginalize_laplace(
        icar_model(edges, y, "poisson"), "phi", hessian_structure=structure
    )
    with pm.Model() as rw_model:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        x = RW("x", n=n, order=2, sigma=sigma, constraint="sum_to_zero")
        pm.Poisson("y", pt.exp(mu + x), observed=y)
    rw2 = pmo.marginalize_laplace(rw_model, "x", hessian_structure="dense")
    point = np.array([0.3, -0.2])
    for marginal in [icar] if mode == "NUMBA" else [icar, rw2]:
        got, want = (marginal.logp_dlogp_function(ravel_inputs=True, mode=m) for m in (mode, None))
        for fn in (got, want):
            fn.set_extra_values({})
        for g, w in zip(got(point), want(point), strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-8)
    idata = az.from_dict({"posterior": {"mu": np.full((1, 3), 0.5), "sigma": np.full((1, 3), 0.7)}})
    draws = {
        m: pmo.recover_latent(icar, idata, random_seed=1, progressbar=False, mode=m).posterior
        for m in (mode, None)
    }
    assert draws[mode]["phi_solved"].values.all()
    np.testing.assert_allclose(draws[mode]["phi"], draws[None]["phi"], rtol=0, atol=1e-8)
    assert np.abs(draws[mode]["phi"].values.sum(axis=-1)).max() < 1e-10


@pytest.mark.slow
def test_fit_inla_on_a_kriged_latent_equals_the_dense_chart():
    """The whole fit (mode search in θ with the warm-started inner KKT Newton loop, the
    integration, the draws): the hyperparameters' posterior means and sds equal those of the same
    model integrated in the n − 1 free coordinates (the Laplace approximation is invariant under
    the affine change of chart) to the mode search's tolerance, and every draw sums to zero."""
    n = 40
    edges = chain_edges(n)
    y = np.random.default_rng(9).poisson(2.0, size=n)
    fits = {
        name: pmo.fit_inla(
            icar_model(edges, y, "poisson", **kwargs),
            "phi",
            draws=50,
            random_seed=3,
            progressbar=False,
        )
        for name, kwargs in [("kriged", {}), ("chart", {"transform": _chart(edges, n)})]
    }
    kriged, chart = fits["kriged"].inla, fits["chart"].inla
    np.testing.assert_allclose(kriged["mean"], chart["mean"], rtol=1e-5)
    np.testing.assert_allclose(kriged["sd"], chart["sd"], rtol=1e-5)
    draws = fits["kriged"].posterior["phi"].values[0]
    assert np.abs(draws.sum(axis=1)).max() < 1e-9
