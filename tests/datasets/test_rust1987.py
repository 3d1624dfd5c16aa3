"""Rust (1987): the Bellman fixed point inside the likelihood, its implicit gradient, Table IX.

References: an independent numpy NFXP (Newton–Kantorovich solve of EV, the analytic implicit
derivative dEV/dθ = (I − ∂T/∂EV)⁻¹ ∂T/∂θ written by hand), central finite differences, and
Rust's published Table IX (group 4, n = 90) from the data's README.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_optim as pmo
from pymc_optim.datasets import load_rust1987
from pymc_optim.datasets.rust1987 import (
    RustLikelihood,
    bellman_update,
    choice_log_likelihood,
    expected_value,
    rust_model,
    transition_matrix,
    transition_probabilities,
)

# Table IX, group 4, n = 90 (README): estimates, BHHH standard errors, full log-likelihood.
TABLE_IX = {
    0.9999: {"rc": 10.075, "theta11": 2.293, "se": (1.582, 0.639), "loglik": -3304.155},
    0.0: {"rc": 7.6358, "theta11": 71.5133, "se": (0.7197, 13.778), "loglik": -3306.028},
}
TOL = 1e-10  # the model's inner tolerance on max|EV − T(EV)| (INNER_TOL)


@pytest.fixture(scope="module")
def data():
    return load_rust1987(4, n=90)


@pytest.fixture(scope="module")
def P(data):
    return transition_matrix(transition_probabilities(data.increment), data.n)


# --- an independent numpy NFXP --------------------------------------------------------------


def numpy_choice_values(ev, rc, theta11, beta):
    s = np.arange(len(ev))
    v_keep = -0.001 * theta11 * s + beta * ev
    v_replace = -rc + beta * ev[0]
    return v_keep, v_replace


def numpy_bellman(ev, rc, theta11, P, beta):
    v_keep, v_replace = numpy_choice_values(ev, rc, theta11, beta)
    return P @ np.logaddexp(v_keep, v_replace)


def numpy_expected_value(rc, theta11, P, beta):
    """EV by Newton–Kantorovich on EV − T(EV), and dEV/d(RC, θ₁₁) by the implicit derivative."""
    n = len(P)
    ev = np.zeros(n)
    for _ in range(50):
        v_keep, v_replace = numpy_choice_values(ev, rc, theta11, beta)
        p_keep = 1.0 / (1.0 + np.exp(v_replace - v_keep))
        dT = beta * P * p_keep  # ∂T/∂EV: keep moves with P, replace restarts at state 0
        dT[:, 0] += beta * P @ (1.0 - p_keep)
        F = ev - P @ np.logaddexp(v_keep, v_replace)
        if np.max(np.abs(F)) < 1e-12:
            break
        ev = ev - np.linalg.solve(np.eye(n) - dT, F)
    dT_dtheta = np.stack([P @ -(1.0 - p_keep), P @ (-0.001 * np.arange(n) * p_keep)], axis=1)
    dev = np.linalg.solve(np.eye(n) - dT, dT_dtheta)
    return ev, dev


def numpy_loglik_and_gradient(rc, theta11, P, beta, data):
    ev, dev = numpy_expected_value(rc, theta11, P, beta)
    s, d = data.state, data.decision
    z = -rc + 0.001 * theta11 * s + beta * (ev[0] - ev[s])
    loglik = np.sum(np.where(d == 1, -np.logaddexp(0, -z), -np.logaddexp(0, z)))
    dz = np.stack([-np.ones_like(z), 0.001 * s], axis=1) + beta * (dev[0] - dev[s])
    return loglik, (d - 1.0 / (1.0 + np.exp(-z))) @ dz


# --- the Bellman fixed point ----------------------------------------------------------------


def test_bellman_operator_matches_numpy(P):
    ev = np.random.default_rng(0).normal(-1000.0, 5.0, size=90)
    ev_var = pt.vector("ev", shape=(90,))
    rc, theta11 = 9.0, 3.0
    value = bellman_update(ev_var, rc, theta11, P, 0.9999).eval({ev_var: ev})
    np.testing.assert_allclose(value, numpy_bellman(ev, rc, theta11, P, 0.9999), rtol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.9999, 0.99, 0.0])
@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_newton_solves_the_bellman_equation_to_1e_10(P, beta, relative):
    rc, theta11 = pt.dscalars("rc", "theta11")
    ev, success, solution = expected_value(rc, theta11, P, beta, relative=relative)
    info = pmo.solution_info(solution)
    fn = pytensor.function([rc, theta11], [ev, success, info.n_iterations])
    for point in [(10.075, 2.293), (7.6, 71.5), (2.0, 0.1)]:
        ev_value, converged, n_iterations = fn(*point)
        assert converged and 1 <= n_iterations <= 10, (point, n_iterations)
        assert np.max(np.abs(ev_value - numpy_bellman(ev_value, *point, P, beta))) < TOL
        reference, _ = numpy_expected_value(*point, P, beta)
        np.testing.assert_allclose(ev_value, reference, rtol=1e-12, atol=1e-10)


@pytest.mark.slow
def test_value_iteration_and_anderson_agree_with_newton_at_moderate_beta(P):
    """β = 0.9: plain iteration converges (in ~250 sweeps); all three methods give one EV."""
    rc, theta11 = pt.dscalars("rc", "theta11")
    values = {}
    for method in ("iteration", "anderson", "newton"):
        ev, success, _ = expected_value(rc, theta11, P, 0.9, relative=False, method=method)
        values[method], converged = pytensor.function([rc, theta11], [ev, success])(9.0, 3.0)
        assert converged, method
    np.testing.assert_allclose(values["iteration"], values["newton"], atol=1e-9)
    np.testing.assert_allclose(values["anderson"], values["newton"], atol=1e-9)


def test_relative_value_function_is_well_conditioned(P):
    """I − ∂T/∂EV has eigenvalue 1 − β along the constant vector; the recentred map does not."""
    beta, n = 0.9999, 90
    ev, _ = numpy_expected_value(10.075, 2.293, P, beta)
    v_keep, v_replace = numpy_choice_values(ev, 10.075, 2.293, beta)
    p_keep = 1.0 / (1.0 + np.exp(v_replace - v_keep))
    dT = beta * P * p_keep
    dT[:, 0] += beta * P @ (1.0 - p_keep)
    dH = dT - dT[0]  # H(h) = T(h) − T(h)(0)
    cond_ev = np.linalg.cond(np.eye(n) - dT)
    cond_h = np.linalg.cond(np.eye(n) - dH)
    assert cond_ev > 1e4 and cond_h < 1e3, (cond_ev, cond_h)


def test_failure_is_reported_not_raised(P):
    """At β = 0.9999 value iteration needs ~2·10⁵ sweeps: 1000 leave `success` False."""
    rc, theta11 = pt.dscalars("rc", "theta11")
    ev, success, solution = expected_value(
        rc, theta11, P, 0.9999, relative=False, method="iteration", max_iter=1000
    )
    info = pmo.solution_info(solution)
    converged, n_iterations, residual = pytensor.function(
        [rc, theta11], [success, info.n_iterations, info.value]
    )(10.0, 2.0)
    assert not converged and n_iterations == 1000 and residual > 1e-3


# --- the likelihood's implicit gradient -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_loglik_gradient_matches_analytic_nfxp_and_finite_differences(data, P, relative):
    theta = pt.vector("theta", shape=(2,))
    beta = 0.9999
    ev, _, _ = expected_value(theta[0], theta[1], P, beta, relative=relative)
    loglik = choice_log_likelihood(ev, theta[0], theta[1], beta, data.state, data.decision).sum()
    fn = pytensor.function([theta], [loglik, pt.grad(loglik, theta)])
    point = np.array([9.0, 2.6])
    value, gradient = fn(point)
    reference_value, reference_gradient = numpy_loglik_and_gradient(*point, P, beta, data)
    # the inner solve stops at residual 1e-10, which moves EV(s) − EV(0) by up to ~1e-8
    # (‖(I − ∂H/∂h)⁻¹‖ ~ 10²): the log-likelihood (~170) agrees to ~1e-10 relative.
    assert value == pytest.approx(reference_value, rel=1e-9)
    np.testing.assert_allclose(gradient, reference_gradient, rtol=1e-7)
    # central differences: step 1e-4 balances truncation (~h²·|ℓ'''|) and rounding (~eps·ℓ/h)
    h = 1e-4
    fd = [(fn(point + h * e)[0] - fn(point - h * e)[0]) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(gradient, fd, rtol=1e-6)


@pytest.mark.slow
def test_pymc_model_logp_is_the_choice_likelihood(data, P):
    model = rust_model(data, 0.9999, flat_priors=True)
    point = {"RC_log__": np.log(9.0), "theta11_log__": np.log(2.6)}
    logp = model.compile_logp(jacobian=False)(point)
    dlogp = model.compile_dlogp(jacobian=False)(point)
    reference_value, reference_gradient = numpy_loglik_and_gradient(9.0, 2.6, P, 0.9999, data)
    assert logp == pytest.approx(reference_value, rel=1e-9)  # see the test above
    # in log coordinates: ∂ℓ/∂log θ = θ ∂ℓ/∂θ
    np.testing.assert_allclose(dlogp, reference_gradient * [9.0, 2.6], rtol=1e-7)


# --- Table IX -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.9999, 0.0])
def test_maximum_likelihood_reproduces_table_ix(data, beta):
    published = TABLE_IX[beta]
    fit = RustLikelihood(data, beta).fit(x0=(5.0, 5.0) if beta else (5.0, 50.0))
    assert fit.success
    assert fit.max_inner_residual < TOL and fit.max_inner_iterations <= 10
    # tolerances of the README; the published digits are rounded to 3-4 decimals
    assert fit.rc == pytest.approx(published["rc"], abs=1e-2)
    assert fit.theta11 == pytest.approx(published["theta11"], abs=1e-3)
    assert fit.log_likelihood == pytest.approx(published["loglik"], abs=1e-2)
    if beta:
        assert fit.choice_log_likelihood == pytest.approx(-163.584, abs=1e-3)
    # BHHH standard errors, to the published digits (±1 in the last one)
    se_digits = (1e-3, 1e-3) if beta else (1e-4, 1e-3)
    for se, reference, digit in zip(fit.se, published["se"], se_digits, strict=True):
        assert se == pytest.approx(reference, abs=digit)


def test_pymc_model_rejects_an_unconverged_bellman_solve(data):
    """With too few value-iteration sweeps the solve fails: logp is −inf, never silently used."""
    model = rust_model(data, 0.9999, method="iteration", max_iter=50, relative=False)
    point = {"RC_log__": np.log(9.0), "theta11_log__": np.log(2.6)}
    assert model.compile_logp()(point) == -np.inf
    with pytest.raises(ValueError, match="`on_failure` must be one of"):
        rust_model(data, 0.9999, on_failure="ignore")
