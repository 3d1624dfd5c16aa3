"""Values, multipliers and KKT implicit gradients of `minimize` with bounds and constraints.

Every problem has a closed form (or a closed form given its active set, which the test states),
and gradients are also checked against central finite differences of the *re-solved* problem.
The polish makes x* exact to rounding, so values and gradients are compared at 1e-11.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from scipy import optimize

import pymc_optim as pmo
from pymc_optim.linalg.structure import LinearStructure
from pymc_optim.problems.constrained.kkt import KKTStructure

RNG = np.random.default_rng(20261201)
#: x* is exact to rounding after the polish, whatever scipy's tolerance (measured: ≤ 2e-16 on
#: the equality and box problems with scipy's defaults); the gradients (one KKT solve) to ~1e-15.
VALUE_TOL = 1e-11
#: Central differences of a re-solved problem: error ~ step² · x''' + rounding/step; the
#: problems are piecewise quadratic in θ (no curvature within an active set) except the ball.
#: Measured: ≤ 5e-11 at step 1e-5.
FD_STEP = 1e-5
FD_TOL = 1e-8


def _spd(n, rng=RNG):
    L = rng.normal(size=(n, n))
    return L @ L.T / n + 0.5 * np.eye(n)


def central_difference(fn, value, step=FD_STEP):
    value = np.asarray(value, dtype=float)
    out = []
    for idx in np.ndindex(value.shape):
        e = np.zeros_like(value)
        e[idx] = step
        out.append((fn(value + e) - fn(value - e)) / (2 * step))
    return np.array(out).reshape(value.shape + np.shape(out[0]))


# --- equality constraints: closed form -----------------------------------------------------------
Q = _spd(4)
A_EQ = RNG.normal(size=(2, 4))
B0 = RNG.normal(size=4)
C0 = RNG.normal(size=2)
W = np.array([0.5, 1.0, 1.5, 2.0])  # loss weights: L = Σ W x*


def equality_closed_form(b, c):
    """x* = b − Q⁻¹Aᵀλ with λ = (AQ⁻¹Aᵀ)⁻¹(Ab − c) for min ½(x−b)ᵀQ(x−b), Ax = c."""
    Qi_At = np.linalg.solve(Q, A_EQ.T)
    S = A_EQ @ Qi_At
    lam = np.linalg.solve(S, A_EQ @ b - c)
    x = b - Qi_At @ lam
    dx_dc = Qi_At @ np.linalg.inv(S)  # (4, 2)
    dx_db = np.eye(4) - dx_dc @ A_EQ
    return x, -lam, dx_db, dx_dc  # our convention: ∇f = Aᵀλ, ∇f = Q(x − b) = −Aᵀ(AQ⁻¹Aᵀ)⁻¹…


@pytest.fixture(scope="module", params=["SLSQP", "trust-constr", "newton"])
def equality_problem(request):
    x = pt.vector("x", shape=(4,))
    b = pt.vector("b", shape=(4,))
    c = pt.vector("c", shape=(2,))
    f = 0.5 * (x - b) @ pt.as_tensor(Q) @ (x - b)
    kwargs = {
        "SLSQP": {"options": {"ftol": 1e-12}},
        "trust-constr": {"options": {"gtol": 1e-10, "xtol": 1e-12}},
        "newton": {"tol": 1e-12},
    }[request.param]
    x_star, success = pmo.minimize(
        f,
        x,
        x0=np.zeros(4),
        method=request.param,
        constraints={"type": "eq", "fun": pt.as_tensor(A_EQ) @ x - c},
        optimizer_kwargs=kwargs,
    )
    (lam,) = pmo.lagrange_multipliers(x_star).equality
    loss = (x_star * W).sum()
    fn = pytensor.function(
        [b, c], [x_star, success, lam, *pt.grad(loss, [b, c]), pt.grad(lam.sum(), c)]
    )
    return fn


def test_equality_value_multipliers_and_gradient_match_closed_form(equality_problem):
    x, success, lam, g_b, g_c, dlam_dc = equality_problem(B0, C0)
    x_ref, lam_ref, dx_db, dx_dc = equality_closed_form(B0, C0)
    assert success
    assert_allclose(x, x_ref, atol=VALUE_TOL)
    assert_allclose(A_EQ @ x, C0, atol=VALUE_TOL)  # equality holds
    assert_allclose(lam, lam_ref, atol=VALUE_TOL)
    assert_allclose(g_b, dx_db.T @ W, atol=VALUE_TOL)
    assert_allclose(g_c, dx_dc.T @ W, atol=VALUE_TOL)
    # the multipliers are differentiated by the same rule: λ = (AQ⁻¹Aᵀ)⁻¹(c − Ab)
    S = A_EQ @ np.linalg.solve(Q, A_EQ.T)
    assert_allclose(dlam_dc, np.linalg.inv(S).sum(axis=0), atol=VALUE_TOL)


def test_equality_gradient_matches_finite_differences(equality_problem):
    _, _, _, g_b, g_c, _ = equality_problem(B0, C0)
    fd_b = central_difference(lambda b: equality_problem(b, C0)[0] @ W, B0)
    fd_c = central_difference(lambda c: equality_problem(B0, c)[0] @ W, C0)
    assert_allclose(g_b, fd_b, atol=FD_TOL)
    assert_allclose(g_c, fd_c, atol=FD_TOL)


# --- box constraints: some bounds active, some not -----------------------------------------------
Q_BOX = _spd(5)
A_BOX = np.array([2.0, -1.5, 0.3, 0.8, -0.2])
LOWER = -np.ones(5)
UPPER = np.array([1.0, 1.0, 0.5, np.inf, 1.0])
W_BOX = np.linspace(0.5, 1.5, 5)


def box_reference(a, lower, upper):
    """x* of min ½(x−a)ᵀQ(x−a) on the box, by scipy with tight tolerances, and its closed-form
    Jacobian given the active set: free coordinates F solve Q_FF (x_F − a_F) = −Q_FA (x_A − a_A).
    """
    res = optimize.minimize(
        lambda x: (0.5 * (x - a) @ Q_BOX @ (x - a), Q_BOX @ (x - a)),
        np.zeros(5),
        jac=True,
        method="L-BFGS-B",
        bounds=optimize.Bounds(lower, upper),
        options={"gtol": 1e-14, "ftol": 1e-16},
    )
    x = np.clip(res.x, lower, upper)
    active = (np.abs(x - lower) < 1e-7) | (np.abs(x - upper) < 1e-7)
    free = ~active
    # x_F = a_F − Q_FF⁻¹ Q_FA (x_A − a_A); x_A = bound (dx_A/da = 0, dx_A/dbound = 1)
    QFF_inv_QFA = np.linalg.solve(Q_BOX[np.ix_(free, free)], Q_BOX[np.ix_(free, active)])
    dx_da = np.zeros((5, 5))
    dx_da[np.ix_(free, free)] = np.eye(free.sum())
    dx_da[np.ix_(free, active)] = QFF_inv_QFA
    dx_dbound = np.zeros((5, 5))  # d x / d (the active bound values), columns of active coords
    dx_dbound[np.ix_(active, active)] = np.eye(active.sum())
    dx_dbound[np.ix_(free, active)] = -QFF_inv_QFA
    x_free = a[free] - QFF_inv_QFA @ (x[active] - a[active])
    x[free] = x_free
    return x, active, dx_da, dx_dbound


@pytest.fixture(scope="module", params=["L-BFGS-B", "SLSQP", "trust-constr"])
def box_problem(request):
    x = pt.vector("x", shape=(5,))
    a = pt.vector("a", shape=(5,))
    lo = pt.vector("lo", shape=(5,))  # a symbolic lower bound: the gradient flows to it
    f = 0.5 * (x - a) @ pt.as_tensor(Q_BOX) @ (x - a)
    x_star, success = pmo.minimize(f, x, x0=np.zeros(5), method=request.param, bounds=(lo, UPPER))
    nu = pmo.lagrange_multipliers(x_star).bounds
    loss = (x_star * W_BOX).sum()
    return pytensor.function([a, lo], [x_star, success, nu, *pt.grad(loss, [a, lo])])


def test_box_value_and_gradient_match_closed_form_on_the_active_set(box_problem):
    x, success, nu, g_a, g_lo = box_problem(A_BOX, LOWER)
    x_ref, active, dx_da, dx_dbound = box_reference(A_BOX, LOWER, UPPER)
    assert 0 < active.sum() < 5  # the case has both kinds
    assert success
    assert_allclose(x, x_ref, atol=VALUE_TOL)
    # active bounds are hit exactly; ν = ∇f, positive on the lower, negative on the upper bound
    assert np.all((x == LOWER) | (x == UPPER) | ~active)
    g = Q_BOX @ (x - A_BOX)
    assert_allclose(nu, np.where(active, g, 0.0), atol=VALUE_TOL)
    assert np.all(nu[x == LOWER] > 0) and np.all(nu[x == UPPER] < 0)
    assert_allclose(g_a, dx_da.T @ W_BOX, atol=VALUE_TOL)
    on_lower = x == LOWER
    assert_allclose(g_lo, np.where(on_lower, dx_dbound.T @ W_BOX, 0.0), atol=VALUE_TOL)


def test_box_gradient_matches_finite_differences(box_problem):
    _, _, _, g_a, g_lo = box_problem(A_BOX, LOWER)
    fd_a = central_difference(lambda a: box_problem(a, LOWER)[0] @ W_BOX, A_BOX)
    fd_lo = central_difference(lambda lo: box_problem(A_BOX, lo)[0] @ W_BOX, LOWER)
    assert_allclose(g_a, fd_a, atol=FD_TOL)
    assert_allclose(g_lo, fd_lo, atol=FD_TOL)


def test_active_bound_regression_lbfgsb_unit_box():
    # The L-BFGS-B regression: min Σ(x − a)² on [0, 1]ⁿ at a = 2 sits on the upper bound,
    # d(Σx*)/da = 0.
    x = pt.vector("x", shape=(3,))
    a = pt.scalar("a")
    x_star, success = pmo.minimize(
        ((x - a) ** 2).sum(), x, x0=np.zeros(3), method="L-BFGS-B", bounds=(0.0, 1.0)
    )
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star.sum(), a)])
    x_val, ok, g = fn(2.0)
    assert ok
    assert_allclose(x_val, 1.0, atol=0)
    assert g == 0.0
    # interior: the unconstrained derivative, 1 per coordinate
    assert_allclose(fn(0.5)[2], 3.0, atol=VALUE_TOL)


def test_active_bound_oracle_contrast_pytensor_optimize():
    # pytensor's own Op accepts scipy bounds but differentiates the unconstrained condition
    # ∇f = 0: at a = 2 it reports n = 3, where the truth (above) is 0.
    from pytensor.tensor.optimize import minimize

    x = pt.vector("x", shape=(3,))
    a = pt.scalar("a")
    x_star, _ = minimize(
        ((x - a) ** 2).sum(),
        x,
        method="L-BFGS-B",
        optimizer_kwargs={"bounds": [(0.0, 1.0)] * 3},
    )
    g = pt.grad(x_star.sum(), a).eval({x: np.zeros(3), a: 2.0})
    assert_allclose(g, 3.0)


# --- the simplex portfolio: budget + long-only ----------------------------------------------------
N_ASSETS = 5
SIGMA = _spd(N_ASSETS) * 0.04
MU = np.array([0.08, 0.02, 0.05, 0.01, 0.06])
W_PORT = np.linspace(0.5, 1.5, N_ASSETS)


def portfolio_on_support(gamma, mu, support):
    """Closed form of max wᵀμ − γ/2 wᵀΣw, Σw = 1 on the assets in `support` (0 elsewhere)."""
    S = SIGMA[np.ix_(support, support)]
    Si_1 = np.linalg.solve(S, np.ones(support.sum()))
    Si_mu = np.linalg.solve(S, mu[support])
    eta = (Si_mu.sum() - gamma) / Si_1.sum()
    w = np.zeros(N_ASSETS)
    w[support] = (Si_mu - eta * Si_1) / gamma
    return w


@pytest.fixture(scope="module", params=["SLSQP", "trust-constr"])
def portfolio(request):
    w = pt.vector("w", shape=(N_ASSETS,))
    gamma = pt.scalar("gamma")
    mu = pt.vector("mu", shape=(N_ASSETS,))
    f = -(w @ mu) + 0.5 * gamma * (w @ pt.as_tensor(SIGMA) @ w)
    w_star, success = pmo.minimize(
        f,
        w,
        x0=np.full(N_ASSETS, 1 / N_ASSETS),
        method=request.param,
        bounds=(0.0, None),
        constraints={"type": "eq", "fun": w.sum() - 1.0},
    )
    loss = (w_star * W_PORT).sum()
    return pytensor.function([gamma, mu], [w_star, success, *pt.grad(loss, [gamma, mu])])


@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_portfolio_value_and_gradient(portfolio, gamma):
    w, success, g_gamma, g_mu = portfolio(gamma, MU)
    assert success
    support = w > 0
    assert 1 < support.sum() < N_ASSETS  # long-only binds for some assets, not all
    assert_allclose(w, portfolio_on_support(gamma, MU, support), atol=VALUE_TOL)
    assert_allclose(w.sum(), 1.0, atol=1e-14)
    # closed form on the support, differentiated by central differences (no re-solve needed)
    ref = lambda g, m: portfolio_on_support(g, m, support) @ W_PORT  # noqa: E731
    assert_allclose(g_gamma, central_difference(lambda g: ref(g, MU), gamma), atol=FD_TOL)
    assert_allclose(g_mu, central_difference(lambda m: ref(gamma, m), MU), atol=FD_TOL)
    # and against the re-solved constrained problem
    fd_gamma = central_difference(lambda g: portfolio(g, MU)[0] @ W_PORT, gamma)
    fd_mu = central_difference(lambda m: portfolio(gamma, m)[0] @ W_PORT, MU)
    assert_allclose(g_gamma, fd_gamma, atol=FD_TOL)
    assert_allclose(g_mu, fd_mu, atol=FD_TOL)
    assert np.all(g_mu[~support] == 0.0)  # an excluded asset's return does not matter locally


# --- a nonlinear inequality: projection onto the unit ball ----------------------------------------
@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
def test_ball_projection_nonlinear_constraint(method):
    x = pt.vector("x", shape=(3,))
    a = pt.vector("a", shape=(3,))
    x_star, success = pmo.minimize(
        ((x - a) ** 2).sum(),
        x,
        x0=np.zeros(3),
        method=method,
        constraints=[{"type": "ineq", "fun": 1.0 - (x**2).sum()}],
    )
    (mu,) = pmo.lagrange_multipliers(x_star).inequality
    fn = pytensor.function([a], [x_star, success, mu, pt.grad((x_star * W[:3]).sum(), a)])
    a_out = np.array([1.5, -0.5, 1.0])
    x_val, ok, mu_val, g = fn(a_out)
    r = np.linalg.norm(a_out)
    assert ok
    assert_allclose(x_val, a_out / r, atol=VALUE_TOL)
    assert_allclose(mu_val, r - 1.0, atol=VALUE_TOL)  # 2(x − a) = −2μx  ⇒  μ = ‖a‖ − 1
    jac = (np.eye(3) - np.outer(a_out, a_out) / r**2) / r  # d(a/‖a‖)/da
    assert_allclose(g, jac.T @ W[:3], atol=VALUE_TOL)
    # inside the ball the constraint is inactive: x* = a, μ = 0, gradient W
    x_in, ok, mu_in, g_in = fn(np.array([0.2, 0.1, -0.3]))
    assert ok and mu_in == 0.0
    assert_allclose(g_in, W[:3], atol=VALUE_TOL)


def test_trust_constr_multipliers_agree_with_ours():
    # A second route to the multipliers: scipy's own (trust-constr's result.v, sign flipped:
    # its Lagrangian is f + vᵀc).
    x = pt.vector("x", shape=(4,))
    b, c = B0, C0
    f = 0.5 * (x - b) @ pt.as_tensor(Q) @ (x - b)
    x_star, _ = pmo.minimize(
        f, x, x0=np.zeros(4), constraints={"type": "eq", "fun": pt.as_tensor(A_EQ) @ x - c}
    )
    (lam,) = pmo.lagrange_multipliers(x_star).equality
    res = optimize.minimize(
        lambda z: 0.5 * (z - b) @ Q @ (z - b),
        np.zeros(4),
        jac=lambda z: Q @ (z - b),
        method="trust-constr",
        constraints=optimize.LinearConstraint(A_EQ, c, c),
        options={"gtol": 1e-12, "xtol": 1e-14},
    )
    assert_allclose(lam.eval(), -res.v[0], atol=1e-7)


# --- degenerate and infeasible cases --------------------------------------------------------------
def test_weakly_active_bound_is_reported_as_failure():
    # At a = 1 the unconstrained minimum sits exactly on the bound with a zero multiplier: x*(a)
    # has a kink there (one-sided derivatives 1 and 0). x* is right, success is False.
    x = pt.vector("x", shape=(2,))
    a = pt.scalar("a")
    x_star, success = pmo.minimize(
        ((x - a) ** 2).sum(), x, x0=np.zeros(2), method="L-BFGS-B", bounds=(0.0, 1.0)
    )
    fn = pytensor.function([a], [x_star, success])
    x_val, ok = fn(1.0)
    assert_allclose(x_val, 1.0, atol=1e-12)
    assert not ok
    assert fn(1.0 + 1e-4)[1] and fn(1.0 - 1e-4)[1]  # off the kink, both sides are regular


def test_weakly_active_inequality_is_reported_as_failure():
    x = pt.vector("x", shape=(2,))
    a = pt.scalar("a")
    x_star, success = pmo.minimize(
        ((x - a) ** 2).sum(),
        x,
        x0=np.zeros(2),
        method="SLSQP",
        constraints={"type": "ineq", "fun": 2.0 - x.sum()},
    )
    fn = pytensor.function([a], [x_star, success])
    assert not fn(1.0)[1]  # x* = (1, 1) exactly on x₁ + x₂ = 2 with μ = 0
    assert fn(0.9)[1] and fn(1.1)[1]


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
def test_infeasible_constraints_give_success_false(method):
    x = pt.vector("x", shape=(2,))
    x_star, success = pmo.minimize(
        (x**2).sum(),
        x,
        x0=np.zeros(2),
        method=method,
        constraints=[
            {"type": "ineq", "fun": x[0] - 1.0},
            {"type": "ineq", "fun": -x[0]},
        ],
        optimizer_kwargs={"options": {"maxiter": 200}},
    )
    assert not success.eval()


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
def test_constraint_that_is_the_control_itself(method):
    """x ≥ 0 written as {"fun": x}: min ‖x − a‖² is max(a, 0), with ∂x*/∂a = 1 off the active
    set and 0 on it (PyTensor's scan Jacobian of x itself refused its own inputs)."""
    x, a = pt.vector("x"), pt.vector("a")
    x_star, success = pmo.minimize(
        ((x - a) ** 2).sum(),
        x,
        x0=pt.ones_like(a),
        method=method,
        constraints={"type": "ineq", "fun": x},
    )
    found, ok, slope = pytensor.function([a], [x_star, success, pt.grad(x_star.sum(), a)])(
        np.array([1.0, -2.0, 4.0])
    )
    assert ok
    assert_allclose(found, [1.0, 0.0, 4.0], atol=1e-6)
    assert_allclose(slope, [1.0, 0.0, 1.0], atol=1e-6)


def test_scipy_bound_pairs_are_read_per_element_and_two_pairs_are_refused():
    """scipy's [(min, max), ...] gives the same solution as scipy; two pairs of numbers would
    also read as (lower, upper) (x* = [0, 5] with success, before): refused as ambiguous."""
    x, a = pt.vector("x"), pt.vector("a")
    pairs = [(0.0, 5.0), (None, 1.0), (2.5, None)]
    x_star, success = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.ones(3), bounds=pairs)
    values = np.array([1.0, 2.0, 3.0])
    expected = optimize.minimize(lambda v: ((v - values) ** 2).sum(), np.ones(3), bounds=pairs).x
    found, ok = pytensor.function([a], [x_star, success])(values)
    assert ok
    assert_allclose(found, expected, atol=1e-6)
    assert_allclose(found, [1.0, 1.0, 3.0], atol=1e-6)
    with pytest.raises(ValueError, match=r"`bounds` \[\(0.0, 5.0\), \(0.0, 5.0\)\] is ambiguous"):
        pmo.minimize(((x - a) ** 2).sum(), x, x0=np.ones(2), bounds=[(0.0, 5.0), (0.0, 5.0)])
    with pytest.raises(ValueError, match="one pair per element of a vector `x`; got 3 pairs"):
        x4 = pt.vector("x4", shape=(4,))
        pmo.minimize(((x4 - 1.0) ** 2).sum(), x4, x0=np.ones(4), bounds=pairs)


def test_matrix_control_with_array_bounds():
    X = pt.matrix("X", shape=(2, 3))
    A = pt.matrix("A", shape=(2, 3))
    upper = np.array([[1.0, 0.0, 2.0], [0.5, np.inf, 1.0]])
    x_star, success = pmo.minimize(
        ((X - A) ** 2).sum(), X, x0=np.zeros((2, 3)), bounds=(None, upper)
    )
    a_val = np.array([[2.0, -1.0, 1.0], [0.4, 3.0, 3.0]])
    x_val, ok, g = pytensor.function([A], [x_star, success, pt.grad(x_star.sum(), A)])(a_val)
    assert ok
    assert_allclose(x_val, np.minimum(a_val, upper), atol=VALUE_TOL)
    assert_allclose(g, (a_val < upper).astype(float), atol=0)


# --- errors at graph construction -----------------------------------------------------------------
def _x_and_objective():
    x = pt.vector("x", shape=(2,))
    return x, (x**2).sum()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"method": "L-BFGS-B", "constraints": {"type": "eq", "fun": "x"}},
            ValueError,
            "'L-BFGS-B' takes bounds only",
        ),
        (
            {"method": "newton", "constraints": {"type": "ineq", "fun": "x"}},
            ValueError,
            "'newton' solves equality constraints only",
        ),
        ({"method": "BFGS", "bounds": (0, 1)}, ValueError, "does not take bounds or constraints"),
        ({"constraints": {"type": "le", "fun": "x"}}, ValueError, "must be 'eq' or 'ineq'"),
        ({"constraints": {"fun": "x"}}, TypeError, "exactly the keys 'type' and 'fun'"),
        ({"bounds": (0, 1, 2)}, ValueError, r"`bounds` must be `\(lower, upper\)`"),
        ({"bounds": ("x", None)}, ValueError, "depends on `x`; write it as an inequality"),
        (
            {"bounds": (0, 1), "optimizer_kwargs": {"bounds": [(0, 1)]}},
            ValueError,
            "must not contain 'bounds'",
        ),
        ({"bounds": (0, 1), "hess": True}, ValueError, "keep their defaults"),
        (
            {"constraints": {"type": "eq", "fun": lambda z: z.sum() - 1.0}},
            TypeError,
            r"`constraints\[0\]\['fun'\]` must be a symbolic PyTensor expression of `x`, not a "
            r"Python function; got `<lambda>`",
        ),
        (
            {"bounds": (0, 1), "optimizer_kwargs": [("tol", 1e-8)]},
            TypeError,
            r"`optimizer_kwargs` must be a dict .*got list.*Pass a mapping",
        ),
        (
            {"bounds": (0, 1), "optimizer_kwargs": {"maxiter": 5}},
            ValueError,
            r"`scipy.optimize.minimize`, which takes 'tol', 'callback', 'options'.*got 'maxiter'",
        ),
        ({"bounds": (0, 1), "x0": np.zeros(3)}, ValueError, r"`x0` for `x` must have `x`'s shape"),
    ],
)
def test_errors_name_the_argument(kwargs, error, match):
    x, f = _x_and_objective()
    kwargs = dict(kwargs)
    if "constraints" in kwargs:
        kwargs["constraints"] = {
            k: (x if v == "x" else v) for k, v in kwargs["constraints"].items()
        }
    if "bounds" in kwargs:
        kwargs["bounds"] = tuple(x if v == "x" else v for v in kwargs["bounds"])
    kwargs.setdefault("x0", np.zeros(2))
    with pytest.raises(error, match=match):
        pmo.minimize(f, x, **kwargs)


def test_constraint_must_depend_on_x_and_x_must_be_single():
    x, f = _x_and_objective()
    a = pt.scalar("a")
    with pytest.raises(ValueError, match=r"must be an expression of `x`"):
        pmo.minimize(f, x, constraints={"type": "eq", "fun": a - 1})
    y = pt.vector("y", shape=(2,))
    with pytest.raises(NotImplementedError, match="single control variable"):
        pmo.minimize(f + (y**2).sum(), [x, y], bounds=(0, 1))


def test_lagrange_multipliers_refuses_other_solutions():
    x, f = _x_and_objective()
    x_star, _ = pmo.minimize(f, x, x0=np.ones(2))
    with pytest.raises(TypeError, match="`x_star` must be returned by `minimize` with"):
        pmo.lagrange_multipliers(x_star)


def test_solution_info_reports_the_objective():
    x, f = _x_and_objective()
    x_star, _ = pmo.minimize(f, x, x0=np.ones(2), bounds=(1.0, None))
    info = pmo.solution_info(x_star)
    assert_allclose(info.value.eval(), 2.0, atol=VALUE_TOL)
    assert info.success.eval()


def test_scalar_control_and_fixed_variable():
    x = pt.scalar("x")
    a = pt.scalar("a")
    x_star, success = pmo.minimize((x - a) ** 2, x, x0=0.0, bounds=(0.0, 1.0))
    fn = pytensor.function([a], [x_star, success, pt.grad(x_star, a)])
    assert [float(v) for v in fn(2.0)] == [1.0, 1.0, 0.0]
    assert_allclose(fn(0.3), [0.3, 1.0, 1.0], atol=VALUE_TOL)
    # lower == upper: x₁ is fixed whichever way the objective pushes (a multiplier of either sign)
    v = pt.vector("v", shape=(2,))
    v_star, ok = pmo.minimize(((v - a) ** 2).sum(), v, x0=np.zeros(2), bounds=([0.5, 0.0], 0.5))
    fv = pytensor.function([a], [v_star, ok, pt.grad(v_star.sum(), a)])
    for a_val, expected, grad in ((2.0, [0.5, 0.5], 0.0), (-1.0, [0.5, 0.0], 0.0)):
        got, ok_val, g = fv(a_val)
        assert ok_val
        assert_allclose(got, expected, atol=0)
        assert g == grad
    assert_allclose(fv(0.2)[2], 1.0, atol=VALUE_TOL)  # x₂ free, x₁ fixed


def test_batched_solutions_and_gradients():
    # vectorize_graph (PyMC's batching) wraps the Op in a Blockwise: one constrained solve per
    # batch entry, each with its own active set.
    from pytensor.graph.replace import vectorize_graph

    x = pt.vector("x", shape=(3,))
    b = pt.scalar("b")
    x_star, _ = pmo.minimize(((x - b) ** 2).sum(), x, x0=np.zeros(3), bounds=(0.0, 1.0))
    batch = pt.vector("batch", shape=(4,))
    batched = vectorize_graph(x_star, {b: batch})
    values = np.array([-1.0, 0.5, 2.0, 0.7])
    assert_allclose(batched.eval({batch: values}), np.clip(values, 0, 1)[:, None] * np.ones(3))
    g = pt.grad(batched.sum(), batch).eval({batch: values})
    assert_allclose(g, [0.0, 3.0, 0.0, 3.0], atol=VALUE_TOL)


def test_equality_newton_runs_under_jax():
    pytest.importorskip("jax")
    x = pt.vector("x", shape=(3,))
    b = pt.vector("b", shape=(3,))
    c = pt.scalar("c")
    x_star, _ = pmo.minimize(
        ((x - b) ** 2).sum(),
        x,
        x0=np.zeros(3),
        constraints={"type": "eq", "fun": x.sum() - c},
        method="newton",
    )
    fn = pytensor.function([b, c], [x_star, pt.grad((x_star * W[:3]).sum(), c)], mode="JAX")
    b_val = np.array([1.0, 2.0, 3.0])
    x_val, g = fn(b_val, 1.0)
    assert_allclose(x_val, b_val - (b_val.sum() - 1.0) / 3, atol=1e-10)
    assert_allclose(g, W[:3].mean(), atol=1e-10)  # dx/dc = 1/3 per coordinate


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
def test_constraint_parameter_gets_its_gradient(method):
    # Projection onto the ball of radius ρ (a parameter of the constraint): x* = ρ a/‖a‖ outside,
    # so dx*/dρ = a/‖a‖; inside, x* = a does not depend on ρ.
    x = pt.vector("x", shape=(3,))
    a = pt.vector("a", shape=(3,))
    rho = pt.scalar("rho")
    x_star, _ = pmo.minimize(
        ((x - a) ** 2).sum(),
        x,
        x0=np.zeros(3),
        method=method,
        constraints={"type": "ineq", "fun": rho**2 - (x**2).sum()},
    )
    fn = pytensor.function([a, rho], [x_star, pt.grad((x_star * W[:3]).sum(), rho)])
    a_out = np.array([1.5, -0.5, 1.0])
    x_val, g = fn(a_out, 0.8)
    assert_allclose(x_val, 0.8 * a_out / np.linalg.norm(a_out), atol=VALUE_TOL)
    assert_allclose(g, W[:3] @ a_out / np.linalg.norm(a_out), atol=VALUE_TOL)
    fd = central_difference(lambda r: fn(a_out, r)[0] @ W[:3], 0.8)
    assert_allclose(g, fd, atol=FD_TOL)
    assert fn(a_out, 3.0)[1] == 0.0


# --- Newton-KKT's structure: the Hessian of the Lagrangian read off the graph ---------------------

N_SEP = 40
W_SEP = np.linspace(0.5, 2.0, N_SEP)
A_SEP = np.linspace(-1.0, 1.0, N_SEP)
#: Schur complement and dense LU solve the same KKT system; after Newton's last step x* differs by
#: rounding amplified by the KKT matrix's condition number (≈ 10 here): measured ≤ 1e-15.
PATH_TOL = 1e-12
#: scipy's SLSQP stops at ftol on the objective, so x is accurate to about √ftol (ftol = 1e-14).
SLSQP_TOL = 1e-6


def _separable_problem(x0=None, **kwargs):
    """min Σ w eˣ + ½x² − a x  s.t.  Σ x = c and Σ_{i<10} eˣ = 12, written as a user would."""
    x = pt.vector("x")
    a = pt.vector("a")
    c = pt.scalar("c")
    f = (W_SEP * pt.exp(x) + 0.5 * x**2 - a * x).sum()
    constraints = [
        {"type": "eq", "fun": x.sum() - c},
        {"type": "eq", "fun": pt.exp(x[:10]).sum() - 12.0},
    ]
    x_star, success = pmo.minimize(
        f,
        x,
        x0=pt.zeros(N_SEP) if x0 is None else x0,
        method="newton",
        constraints=constraints,
        **kwargs,
    )
    return x_star, success, a, c


def _separable_scipy(a, c):
    cons = [
        {"type": "eq", "fun": lambda v: v.sum() - c},
        {"type": "eq", "fun": lambda v: np.exp(v[:10]).sum() - 12.0},
    ]
    res = optimize.minimize(
        lambda v: (W_SEP * np.exp(v) + 0.5 * v**2 - a * v).sum(),
        np.zeros(N_SEP),
        jac=lambda v: W_SEP * np.exp(v) + v - a,
        method="SLSQP",
        constraints=cons,
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    return res.x


def _spy_fallbacks(monkeypatch) -> list:
    """Record every dense KKT matrix assembled (the fallback of a singular H), in the Newton
    loop and in the compiled implicit gradient alike."""
    fallbacks = []
    dense_matrix = KKTStructure.dense_matrix

    def spy(self, A, xp=np):
        fallbacks.append(A.shape)
        return dense_matrix(self, A, xp)

    monkeypatch.setattr(KKTStructure, "dense_matrix", spy)
    return fallbacks


def _has_schur_solve(fn) -> bool:
    from pymc_optim.linalg.structure import UnlessFinite

    return any(isinstance(node.op, UnlessFinite) for node in fn.maker.fgraph.apply_nodes)


@pytest.fixture(scope="module")
def separable():
    out = {}
    for name in ("auto", "dense"):
        x_star, success, a, c = _separable_problem(structure=name)
        loss = (x_star * W_SEP).sum()
        fn = pytensor.function([a, c], [x_star, success, *pt.grad(loss, [a, c])])
        out[name] = (x_star, fn)
    return out


def test_newton_kkt_detects_a_diagonal_lagrangian_hessian(separable):
    x_star, _ = separable["auto"]
    assert x_star.owner.op.condition.structure == KKTStructure(hessian=LinearStructure("diagonal"))
    dense_star, _ = separable["dense"]
    assert dense_star.owner.op.condition.structure == LinearStructure("dense")
    # a dense objective Hessian keeps the dense KKT system (the closed-form equality problem)
    x = pt.vector("x", shape=(4,))
    x_q, _ = pmo.minimize(
        0.5 * x @ pt.as_tensor(Q) @ x,
        x,
        x0=np.zeros(4),
        method="newton",
        constraints={"type": "eq", "fun": x.sum() - 1.0},
    )
    assert x_q.owner.op.condition.structure == LinearStructure("dense")


def test_schur_path_value_and_gradient_match_dense_slsqp_and_finite_differences(
    separable, monkeypatch
):
    a_val, c_val = A_SEP, 0.7
    fallbacks = _spy_fallbacks(monkeypatch)
    _, fast = separable["auto"]
    assert _has_schur_solve(fast)
    x_fast, ok, g_a, g_c = fast(a_val, c_val)
    assert fallbacks == []  # every Newton step and the gradient took the Schur complement
    _, dense = separable["dense"]
    x_dense, ok_dense, g_a_dense, g_c_dense = dense(a_val, c_val)
    assert ok and ok_dense
    assert_allclose(x_fast, x_dense, atol=PATH_TOL)
    assert_allclose(x_fast, _separable_scipy(a_val, c_val), atol=SLSQP_TOL)
    assert_allclose(g_a, g_a_dense, atol=PATH_TOL)
    assert_allclose(g_c, g_c_dense, atol=PATH_TOL)
    fd_c = central_difference(lambda c: fast(a_val, c)[0] @ W_SEP, c_val)
    assert_allclose(g_c, fd_c, atol=FD_TOL)
    fd_a = central_difference(
        lambda a5: fast(np.concatenate([a5, a_val[5:]]), c_val)[0] @ W_SEP, a_val[:5]
    )
    assert_allclose(g_a[:5], fd_a, atol=FD_TOL)


def test_schur_path_with_symbolic_x0_of_unknown_shape():
    x0 = pt.vector("x0")
    x_star, success, a, c = _separable_problem(x0=x0)
    assert x_star.owner.op.condition.structure.kind == "kkt"
    fn = pytensor.function([a, c, x0], [x_star, success])
    x_val, ok = fn(A_SEP, 0.7, np.zeros(N_SEP))
    assert ok
    assert_allclose(x_val, _separable_scipy(A_SEP, 0.7), atol=SLSQP_TOL)


def test_block_diagonal_lagrangian_hessian_of_a_reshaped_vector(monkeypatch):
    # rows of 3 correlated elements, two linear constraints coupling all rows
    G = 30
    P = np.array([[2.0, 0.5, 0.1], [0.5, 1.5, -0.2], [0.1, -0.2, 1.0]])
    C = np.random.default_rng(5).normal(size=(2, 3 * G))
    x = pt.vector("x")
    a = pt.vector("a")
    c = pt.vector("c")
    rows = x.reshape((-1, 3))
    f = ((rows @ P) * rows).sum() + pt.exp(x).sum() - (a * x).sum()
    fns = {}
    for name, kwargs in {
        "auto": {},
        "explicit": {"structure": "block_diagonal", "block_size": 3},
        "dense": {"structure": "dense"},
    }.items():
        x_star, ok = pmo.minimize(
            f,
            x,
            x0=pt.zeros(3 * G),
            method="newton",
            constraints={"type": "eq", "fun": pt.as_tensor(C) @ x - c},
            **kwargs,
        )
        expected = (
            LinearStructure("dense")
            if name == "dense"
            else KKTStructure(hessian=LinearStructure("block_diagonal", 3))
        )
        assert x_star.owner.op.condition.structure == expected
        loss = (x_star**2).sum()
        fns[name] = pytensor.function([a, c], [x_star, ok, *pt.grad(loss, [a, c])])
    a_val, c_val = np.linspace(-1, 1, 3 * G), np.array([0.3, -0.2])
    fallbacks = _spy_fallbacks(monkeypatch)
    results = {name: fn(a_val, c_val) for name, fn in fns.items()}
    assert fallbacks == []
    assert _has_schur_solve(fns["auto"]) and _has_schur_solve(fns["explicit"])
    for name in ("auto", "explicit"):
        x_val, ok, g_a, g_c = results[name]
        assert ok
        for got, want in zip(
            [x_val, g_a, g_c], [results["dense"][i] for i in (0, 2, 3)], strict=True
        ):
            assert_allclose(got, want, atol=PATH_TOL)
    fd_c = central_difference(lambda cc: (fns["auto"](a_val, cc)[0] ** 2).sum(), c_val)
    assert_allclose(results["auto"][3], fd_c, atol=FD_TOL)


def test_singular_hessian_block_falls_back_to_the_dense_kkt_solve(monkeypatch):
    # min x₁² + x₂ s.t. x₁ + x₂ = c: H = diag(2, 0) is singular, the KKT matrix is not.
    # x* = (½, c − ½), so dx*/dc = (0, 1).
    x = pt.vector("x")
    c = pt.scalar("c")
    x_star, ok = pmo.minimize(
        x[0] ** 2 + x[1],
        x,
        x0=pt.zeros(2),
        method="newton",
        constraints={"type": "eq", "fun": x.sum() - c},
    )
    assert x_star.owner.op.condition.structure.kind == "kkt"
    fn = pytensor.function([c], [x_star, ok, pt.grad(x_star[1], c), pt.grad(x_star[0], c)])
    fallbacks = _spy_fallbacks(monkeypatch)
    x_val, ok_val, g1, g0 = fn(2.0)
    assert fallbacks  # the Schur complement was NaN: the dense KKT matrix was solved
    assert ok_val
    assert_allclose(x_val, [0.5, 1.5], atol=VALUE_TOL)
    assert_allclose([g0, g1], [0.0, 1.0], atol=VALUE_TOL)


def test_explicit_kkt_structures_are_verified_once():
    x = pt.vector("x", shape=(4,))
    coupled = (x**2).sum() + x.sum() ** 2
    constraint = {"type": "eq", "fun": x.sum() - 1.0}
    with pytest.raises(
        ValueError,
        match=r"`structure='diagonal'` drops nonzero entries of the "
        r"Hessian of the Lagrangian",
    ):
        pmo.minimize(
            coupled,
            x,
            x0=np.zeros(4),
            method="newton",
            constraints=constraint,
            structure="diagonal",
        )
    # a nonlinear constraint's curvature is part of H: Σ x₀x₁ couples x₀ and x₁
    with pytest.raises(ValueError, match=r"drops nonzero entries"):
        pmo.minimize(
            (x**2).sum(),
            x,
            x0=np.ones(4),
            method="newton",
            structure="diagonal",
            constraints={"type": "eq", "fun": x[0] * x[1] - 1.0},
        )
    x_star, _ = pmo.minimize(
        (x**2).sum(),
        x,
        x0=np.zeros(4),
        method="newton",
        constraints=constraint,
        structure="diagonal",
    )
    assert x_star.owner.op.condition.structure.kind == "kkt"
    assert_allclose(x_star.eval(), np.full(4, 0.25), atol=VALUE_TOL)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"method": "SLSQP", "structure": "diagonal"},
            r"`structure` is the layout of the Hessian of the Lagrangian in `method='newton'`",
        ),
        ({"method": "newton", "structure": "sparse"}, r"`structure='sparse'` is not available"),
        (
            {"method": "newton", "structure": "block_diagonal", "block_size": 3},
            r"`block_size` must divide the size of `x`",
        ),
    ],
)
def test_kkt_structure_errors_name_the_argument(kwargs, match):
    x, f = _x_and_objective()
    with pytest.raises(ValueError, match=match):
        pmo.minimize(
            f, x, x0=np.zeros(2), constraints={"type": "eq", "fun": x.sum() - 1.0}, **kwargs
        )


def test_vectorized_schur_solution_and_gradient():
    # vectorize_graph batches the Op and its implicit gradient (Blockwise): one solve per c
    from pytensor.graph.replace import vectorize_graph

    x_star, _, a, c = _separable_problem()
    batch = pt.vector("batch")
    batched = vectorize_graph(x_star, {c: batch})
    fn = pytensor.function([a, batch], [batched, pt.grad((batched @ W_SEP).sum(), batch)])
    single = pytensor.function([a, c], [x_star, pt.grad(x_star @ W_SEP, c)])
    values = np.array([0.3, 0.7])
    x_val, g = fn(A_SEP, values)
    for k, v in enumerate(values):
        x_k, g_k = single(A_SEP, v)
        assert_allclose(x_val[k], x_k, atol=PATH_TOL)
        assert_allclose(g[k], g_k, atol=PATH_TOL)
