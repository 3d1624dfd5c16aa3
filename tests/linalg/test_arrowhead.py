"""Arrowhead Hessians, H = [[A, B], [Bᵀ, D]] (pymc_optim.linalg.arrowhead): the structure against
the dense oracle, its detection on the graphs users write (fixed effects stacked with random
effects in the latent), and the Laplace marginals and solvers that use it."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim.linalg.arrowhead import (
    AUTO_MIN_SIZE,
    MAX_BORDER,
    ArrowheadStructure,
    arrowhead_hessian_structure,
    arrowhead_of_pattern,
)
from pymc_optim.linalg.detect import dropped_entries

# Cholesky factors and triangular solves of matrices with condition numbers ≲ 10³: backward
# stable, ~1e-13 relative to LAPACK's dense results; 1e-10 leaves three orders of margin.
RTOL = 1e-10


def random_arrowhead(structure, seed=0):
    """A symmetric positive definite H with `structure`'s layout, and A in compact form."""
    rng = np.random.default_rng(seed)
    n, b, border = structure.n, structure.inner_block_size, structure.border
    inner = np.setdiff1d(np.arange(n), border)
    H = np.zeros((n, n))
    for g in range(inner.size // b):
        block = inner[g * b : (g + 1) * b]
        R = rng.normal(size=(b, b))
        H[np.ix_(block, block)] = R @ R.T + b * np.eye(b)
    B = rng.normal(size=(inner.size, border.size))
    H[np.ix_(inner, border)] = B
    H[np.ix_(border, inner)] = B.T
    A_inv_B = np.linalg.solve(H[np.ix_(inner, inner)], B)
    R = rng.normal(size=(border.size, border.size))
    H[np.ix_(border, border)] = B.T @ A_inv_B + R @ R.T + np.eye(border.size)
    return H @ structure.directions().T, H


@pytest.fixture(
    params=[([0, 7, 29], 30, 1), ([0, 1], 26, 2), ([24, 25, 26], 27, 3)],
    ids=["diagonal, border spread", "blocks of 2, border first", "blocks of 3, border last"],
)
def problem(request):
    border, n, b = request.param
    structure = ArrowheadStructure(border=border, n=n, inner_block_size=b)
    A, H = random_arrowhead(structure)
    return structure, A, H


def test_solve_logdet_and_dense_matrix_match_numpy(problem):
    structure, A, H = problem
    rhs = np.random.default_rng(5).normal(size=(H.shape[0], 2))
    a, b, B = pt.dmatrix("A"), pt.dvector("b"), pt.dmatrix("B")
    f = pytensor.function(
        [a, b, B],
        [
            structure.solve(a, b, transposed=False, symmetric=True),
            structure.solve(a, B, transposed=True, symmetric=False),  # H is symmetric
            structure.logdet_positive_definite(a),
        ],
    )
    x, X, logdet = f(A, rhs[:, 0], rhs)
    np.testing.assert_allclose(structure.dense_matrix(A), H, rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(x, np.linalg.solve(H, rhs[:, 0]), rtol=RTOL)
    np.testing.assert_allclose(X, np.linalg.solve(H, rhs), rtol=RTOL)
    np.testing.assert_allclose(structure.solve_numpy(A, rhs), X, rtol=RTOL)
    np.testing.assert_allclose(structure.solve_numpy(A, rhs[:, 0]), x, rtol=RTOL)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(H)[1], rtol=RTOL)
    np.testing.assert_allclose(structure.matvec_numpy(A, rhs[:, 0]), H @ rhs[:, 0], rtol=RTOL)


def test_logdet_gradient_is_the_inverse_on_the_layout(problem):
    # A's compact columns are H v for the directions v; with H = H(t) linear in t along a
    # symmetric direction E inside the layout, d log det H / dt = tr(H⁻¹ E)
    structure, A, H = problem
    rng = np.random.default_rng(3)
    E = structure.dense_matrix(random_arrowhead(structure, seed=4)[0]) * rng.uniform()
    t = pt.dscalar("t")
    compact = pt.constant(A) + t * pt.constant(E @ structure.directions().T)
    f = pytensor.function([t], pytensor.grad(structure.logdet_positive_definite(compact), t))
    np.testing.assert_allclose(f(0.0), np.trace(np.linalg.solve(H, E)), rtol=1e-9)


def test_draws_are_a_linear_map_with_covariance_h_inverse(problem):
    structure, A, H = problem
    n = H.shape[0]
    a, mean, noise = pt.dmatrix("A"), pt.dvector("mean"), pt.dmatrix("noise")
    draw = pytensor.function([a, mean, noise], structure.sample_gaussian(mean, a, noise))
    T = draw(A, np.zeros(n), np.eye(n))  # draw = mean + T ε
    np.testing.assert_allclose(T @ T.T, np.linalg.inv(H), rtol=RTOL, atol=1e-14)
    one = pt.dvector("one")
    epsilon = np.random.default_rng(2).normal(size=n)
    single = pytensor.function([a, mean, one], structure.sample_gaussian(mean, a, one))
    np.testing.assert_allclose(single(A, np.ones(n), epsilon), 1.0 + T @ epsilon, rtol=RTOL)


def test_positive_definite_tests_agree_with_the_eigenvalues(problem):
    structure, A, H = problem
    a = pt.dmatrix("A")
    test = pytensor.function([a], structure.positive_definite(a))
    assert test(A).tolist() == [True] and structure.positive_definite_numpy(A).tolist() == [True]
    # the border's corner lowered until the Schur complement, and H, are indefinite
    k = structure.border[0]
    corner = np.zeros_like(H)
    corner[k, k] = -2.0 * np.abs(H).sum()
    indefinite = A + corner @ structure.directions().T
    assert np.linalg.eigvalsh(structure.dense_matrix(indefinite)).min() < 0
    assert test(indefinite).tolist() == [False]
    assert structure.positive_definite_numpy(indefinite).tolist() == [False]
    # a margin: H − τI positive definite iff τ is below the smallest eigenvalue
    smallest = np.linalg.eigvalsh(H).min()
    assert structure.positive_definite_numpy(A, margin=0.9 * smallest).tolist() == [True]
    assert structure.positive_definite_numpy(A, margin=1.1 * smallest).tolist() == [False]
    finite = pytensor.function([a], structure.finite(a))
    assert finite(A).tolist() == [True] and finite(np.full_like(A, np.nan)).tolist() == [False]


def test_structures_compare_by_border_and_validate_their_fields():
    one = ArrowheadStructure(border=[3, 0], n=10)
    assert one == ArrowheadStructure(border=np.array([0, 3]), n=10)
    assert hash(one) == hash(ArrowheadStructure(border=[0, 3], n=10))
    assert one != ArrowheadStructure(border=[0, 3], n=10, inner_block_size=2)
    assert one.border.tolist() == [0, 3]
    assert repr(one) == "ArrowheadStructure(n=10, border=2, inner='diagonal')"
    with pytest.raises(ValueError, match=r"`border` must hold at least one index in \[0, n\)"):
        ArrowheadStructure(border=[], n=10)
    with pytest.raises(ValueError, match="`border` must not repeat an index"):
        ArrowheadStructure(border=[1, 1], n=10)
    with pytest.raises(ValueError, match="a positive multiple of `inner_block_size` = 3"):
        ArrowheadStructure(border=[0], n=11, inner_block_size=3)
    with pytest.raises(ValueError, match="`n` must be an integer of at least 2"):
        ArrowheadStructure(border=[0], n=1.5)
    with pytest.raises(ValueError, match="takes `border` and `n` by keyword"):
        ArrowheadStructure("arrowhead", 2, [0], 10)


def test_dropped_entries_are_those_outside_the_border_and_blocks():
    structure = ArrowheadStructure(border=[0], n=7, inner_block_size=2)  # blocks {1,2} {3,4} {5,6}
    pattern = np.eye(7, dtype=bool)
    pattern[0, :] = pattern[:, 0] = True
    pattern[1, 2] = pattern[2, 1] = True
    assert dropped_entries(structure, pattern).size == 0
    pattern[2, 3] = pattern[3, 2] = True  # across two blocks
    assert dropped_entries(structure, pattern).tolist() == [[2, 3], [3, 2]]


# --- the pattern's reading ---------------------------------------------------------------------
def lower(pattern):
    rows, cols = np.nonzero(np.tril(pattern | pattern.T))
    return rows, cols


def test_the_border_is_the_fewest_densest_rows_that_leave_blocks():
    n = 40
    pattern = np.eye(n, dtype=bool)
    pattern[[3, 17], :] = True  # two fixed effects, at any position
    found = arrowhead_of_pattern(*lower(pattern), n)
    assert found == ArrowheadStructure(border=[3, 17], n=n)
    for g in range(0, 38, 2):  # the other 38 in pairs: (0, 1), (2, 4), (5, 6), …
        inner = np.setdiff1d(np.arange(n), [3, 17])
        pattern[inner[g], inner[g + 1]] = True
    assert arrowhead_of_pattern(*lower(pattern), n).inner_block_size == 2


def test_patterns_without_a_small_border_are_not_arrowheads():
    n = 40
    assert arrowhead_of_pattern(*lower(np.eye(n, dtype=bool)), n) is None  # diagonal
    tridiagonal = np.eye(n, dtype=bool) | np.eye(n, k=1, dtype=bool)
    assert arrowhead_of_pattern(*lower(tridiagonal), n) is None
    wide = np.eye(n, dtype=bool)
    wide[: MAX_BORDER // 2 + 15, :] = True  # b + p > n / 2: a dense H is as cheap
    assert arrowhead_of_pattern(*lower(wide), n) is None


def test_the_graph_of_a_design_matrix_is_read_as_an_arrowhead():
    rng = np.random.default_rng(0)
    G, p, per = 40, 3, 4
    X = rng.normal(size=(G * per, p))
    group = np.repeat(np.arange(G), per)
    x = pt.vector("x", shape=(p + G,))
    eta = pt.dot(X, x[:p]) + x[p:][group]
    objective = (pt.exp(eta) - eta).sum() + 0.5 * (x**2).sum()
    assert arrowhead_hessian_structure(objective, [x], [p + G]) == ArrowheadStructure(
        border=[0, 1, 2], n=p + G
    )
    # below AUTO_MIN_SIZE the dense layout is as cheap: not looked for
    small = pt.vector("small", shape=(AUTO_MIN_SIZE - 1,))
    eta = small[0] + small[1:]
    assert (
        arrowhead_hessian_structure(
            (pt.exp(eta) - eta).sum() + 0.5 * (small**2).sum(), [small], [AUTO_MIN_SIZE - 1]
        )
        is None
    )


# --- Laplace marginals on the graphs users write ------------------------------------------------
G, PER = 40, 4  # 42 latent values: "auto" looks for an arrowhead from AUTO_MIN_SIZE on


def data():
    rng = np.random.default_rng(11)
    x1 = rng.normal(size=G * PER)
    group = np.repeat(np.arange(G), PER)
    y = rng.poisson(np.exp(0.5 + 0.3 * x1 + rng.normal(0, 0.4, G)[group]))
    return x1, group, y


def separate_normals_model():
    """Fixed effects as separate pm.Normal's, stacked with the random effects in the latent."""
    x1, group, y = data()
    with pm.Model() as model:
        beta0 = pm.Normal("beta0", 0.0, 10.0)
        beta1 = pm.Normal("beta1", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=G)
        pm.Poisson("y", pt.exp(beta0 + beta1 * x1 + u[group]), observed=y)
    return model


def design_matrix_model():
    """Fixed effects as one vector behind a design matrix, X @ beta."""
    x1, group, y = data()
    X = np.column_stack([np.ones_like(x1), x1])
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=2)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=G)
        pm.Poisson("y", pt.exp(X @ beta + u[group]), observed=y)
    return model


@pytest.mark.slow  # compiles two Laplace marginals (about a minute on 2 cores)
@pytest.mark.parametrize(
    "build, latent, border",
    [
        (separate_normals_model, ["beta0", "beta1", "u"], [0, 1]),
        (design_matrix_model, ["beta", "u"], [0, 1]),
        (design_matrix_model, ["u", "beta"], [G, G + 1]),
    ],
    ids=["separate Normals", "X @ beta", "X @ beta, border last"],
)
def test_auto_finds_the_arrowhead_and_the_marginal_equals_the_dense_one(build, latent, border):
    model = build()
    marginal = pmo.marginalize_laplace(model, latent)
    dense = pmo.marginalize_laplace(model, latent, hessian_structure="dense")
    structure = pmo.laplace_info(marginal).structure
    assert structure == ArrowheadStructure(border=border, n=G + 2)
    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    logp_dense, dlogp_dense = dense.compile_logp(), dense.compile_dlogp()
    for log_sigma in [-1.0, 0.2]:
        point = {"sigma_log__": log_sigma}
        np.testing.assert_allclose(logp(point), logp_dense(point), rtol=1e-9)
        np.testing.assert_allclose(dlogp(point), dlogp_dense(point), rtol=1e-7)


@pytest.mark.slow  # compiles two Laplace marginals (about a minute on 2 cores)
def test_random_slopes_give_an_arrowhead_with_blocks():
    x1, group, y = data()
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=2)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=(G, 2))  # an intercept and a slope per group
        eta = beta[0] + beta[1] * x1 + u[group, 0] + u[group, 1] * x1
        pm.Poisson("y", pt.exp(eta), observed=y)
    marginal = pmo.marginalize_laplace(model, ["beta", "u"])
    structure = pmo.laplace_info(marginal).structure
    assert structure == ArrowheadStructure(border=[0, 1], n=2 + 2 * G, inner_block_size=2)
    dense = pmo.marginalize_laplace(model, ["beta", "u"], hessian_structure="dense")
    point = {"sigma_log__": -0.7}
    np.testing.assert_allclose(
        marginal.compile_logp()(point), dense.compile_logp()(point), rtol=1e-9
    )


def test_an_explicit_arrowhead_that_drops_entries_is_refused():
    model = separate_normals_model()
    wrong = ArrowheadStructure(border=[0], n=G + 2)  # beta1 couples with every u too
    with pytest.raises(ValueError, match="`hessian_structure='arrowhead'` drops nonzero entries"):
        pmo.marginalize_laplace(model, ["beta0", "beta1", "u"], hessian_structure=wrong)
    right = ArrowheadStructure(border=[0, 1], n=G + 2)
    marginal = pmo.marginalize_laplace(model, ["beta0", "beta1", "u"], hessian_structure=right)
    assert pmo.laplace_info(marginal).structure == right


def test_minimize_auto_solves_with_the_arrowhead_and_differentiates():
    rng = np.random.default_rng(0)
    n_groups, p = 40, 3
    X = rng.normal(size=(n_groups * 3, p))
    group = np.repeat(np.arange(n_groups), 3)
    y = rng.poisson(2.0, size=n_groups * 3)
    x = pt.vector("x", shape=(p + n_groups,))
    scale = pt.dscalar("scale")
    eta = pt.dot(X, x[:p]) + x[p:][group]
    objective = (pt.exp(eta) - y * eta).sum() + 0.5 * scale * (x[p:] ** 2).sum()
    objective = objective + 0.5 * (x[:p] ** 2).sum()
    x_star, success = pmo.minimize(objective, x, x0=np.zeros(p + n_groups), method="newton")
    assert isinstance(x_star.owner.op.condition.structure, ArrowheadStructure)
    f = pytensor.function([scale], [x_star, success, pytensor.grad(x_star.sum(), scale)])
    dense_star, _ = pmo.minimize(
        objective, x, x0=np.zeros(p + n_groups), method="newton", structure="dense"
    )
    g = pytensor.function([scale], [dense_star, pytensor.grad(dense_star.sum(), scale)])
    xs, ok, gradient = f(1.5)
    reference, reference_gradient = g(1.5)
    assert ok
    np.testing.assert_allclose(xs, reference, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gradient, reference_gradient, rtol=1e-8)
