"""method='newton' (graph-native) agrees with scipy and closed forms, for every structure."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from cases import counters, newton_node, poisson_intercepts, raveled, theta_point, warm_history
from numpy.testing import assert_allclose
from pytensor.graph import vectorize_graph

import pymc_optim as pmo


def softplus_problem():
    """min Σ exp(x) − a x + x²/2: separable, x* solves exp(x) + x = a."""
    x, a = pt.vector("x"), pt.vector("a")
    return (pt.exp(x) - a * x + 0.5 * x**2).sum(), x, a


@pytest.mark.parametrize(
    "structure, block_size", [("dense", None), ("diagonal", None), ("block_diagonal", 2)]
)
def test_minimize_newton_matches_bfgs_for_every_structure(structure, block_size):
    objective, x, a = softplus_problem()
    a_val = np.array([1.0, 2.0, 3.0, 4.0])
    results = []
    for method in ["newton", "BFGS"]:
        x_star, ok = pmo.minimize(
            objective,
            x,
            x0=np.zeros(4),
            method=method,
            structure=structure,
            block_size=block_size,
            optimizer_kwargs={"options": {"gtol": 1e-12}} if method == "BFGS" else None,
        )
        results.append(pytensor.function([a], [x_star, ok, pt.grad(x_star.sum(), a)])(a_val))
    (xn, okn, gn), (xb, okb, gb) = results
    assert okn and okb
    assert_allclose(xn, xb, atol=1e-8)
    assert_allclose(np.exp(xn) + xn, a_val, atol=1e-8)
    assert_allclose(gn, 1 / (np.exp(xn) + 1), rtol=1e-8)  # dx*/da = 1/(e^x + 1)
    assert_allclose(gn, gb, rtol=1e-6)


def test_block_structure_couples_within_blocks():
    """A block-diagonal Hessian with non-zero off-diagonal entries inside each 2x2 block."""
    x, a = pt.vector("x"), pt.vector("a")
    pairs = x.reshape((-1, 2))
    objective = (pt.exp(pairs).sum() + 0.5 * (pairs[:, 0] - pairs[:, 1]) ** 2).sum() - (a * x).sum()
    a_val = np.array([1.0, 2.0, 3.0, 5.0, 2.5, 2.0])
    out = {}
    for structure, block_size in [("dense", None), ("block_diagonal", 2)]:
        x_star, ok = pmo.minimize(
            objective,
            x,
            x0=np.zeros(6),
            method="newton",
            structure=structure,
            block_size=block_size,
        )
        out[structure] = pytensor.function([a], [x_star, ok, pt.grad((x_star**2).sum(), a)])(a_val)
    assert out["dense"][1] and out["block_diagonal"][1]
    assert_allclose(out["dense"][0], out["block_diagonal"][0], atol=1e-10)
    assert_allclose(out["dense"][2], out["block_diagonal"][2], rtol=1e-10)


def test_root_and_scalar_newton():
    x, a = pt.vector("x"), pt.vector("a")
    x_star, ok = pmo.root(x**3 + x - a, x, x0=np.zeros(2), method="newton", structure="diagonal")
    value, success, grad = pytensor.function([a], [x_star, ok, pt.grad(x_star.sum(), a)])(
        np.array([2.0, 10.0])
    )
    assert success
    assert_allclose(value, [1.0, 2.0], atol=1e-10)
    assert_allclose(grad, 1 / (3 * value**2 + 1), rtol=1e-10)

    s, c = pt.scalar("s"), pt.scalar("c")
    s_star, ok = pmo.root_scalar(s**3 - c, s, x0=1.0, method="newton")
    assert_allclose(pytensor.function([c], s_star)(27.0), 3.0, atol=1e-10)
    m_star, ok = pmo.minimize_scalar((s - c) ** 2 + pt.exp(s), s, x0=0.0, method="newton")
    value = pytensor.function([c], m_star)(2.0)
    assert_allclose(2 * (value - 2.0) + np.exp(value), 0.0, atol=1e-8)


def test_failure_is_data():
    """max_iter reached, NaN objective and a singular Jacobian give success=False, no crash."""
    x, a = pt.vector("x"), pt.scalar("a")
    x_star, ok = pmo.minimize(
        (pt.exp(x) - a * x).sum(),
        x,
        x0=np.zeros(2),
        method="newton",
        optimizer_kwargs={"max_iter": 1},
    )
    value, success = pytensor.function([a], [x_star, ok])(100.0)
    assert not success and np.all(np.isfinite(value))

    x_star, ok = pmo.minimize((pt.log(x) * a + x**2).sum(), x, x0=-np.ones(2), method="newton")
    _, success = pytensor.function([a], [x_star, ok])(1.0)
    assert not success

    # x² + a = 0 at x0 = 0: the Jacobian 2x is singular at the start
    x_star, ok = pmo.root(x**2 + a, x, x0=np.zeros(2), method="newton")
    value, success = pytensor.function([a], [x_star, ok])(1.0)
    assert not success and np.all(np.isfinite(value))


def test_newton_options_are_checked():
    objective, x, _ = softplus_problem()
    with pytest.raises(ValueError, match="takes only 'tol' and 'max_iter'"):
        pmo.minimize(objective, x, method="newton", optimizer_kwargs={"gtol": 1e-3})
    with pytest.raises(ValueError, match="needs `block_size`"):
        pmo.minimize(objective, x, method="newton", structure="block_diagonal")
    with pytest.raises(ValueError, match="`structure` must be one of"):
        pmo.minimize(objective, x, method="newton", structure="banded")


@pytest.mark.parametrize(
    "structure, block_size", [("dense", None), ("diagonal", None), ("block_diagonal", 2)]
)
def test_a_stationary_point_that_is_not_a_minimum_is_not_success(structure, block_size):
    """At x = 0, ((x² − 1)²) is stationary (F = 0) with negative curvature: a local maximum.
    Only a positive definite Hessian makes a stationary point a minimum."""
    x, a = pt.vector("x"), pt.vector("a")
    objective = (((x - a) ** 2 - 1) ** 2).sum()
    x_star, ok = pmo.minimize(
        objective, x, x0=np.zeros(4), method="newton", structure=structure, block_size=block_size
    )
    info = pmo.solution_info(x_star)
    fn = pytensor.function([a], [x_star, ok, info.n_iterations])
    value, success, n_iterations = fn(np.zeros(4))
    assert not success
    assert_allclose(value, 0.0)  # where it stopped: F = 0 there
    assert n_iterations == 0
    # started off the maximum, it leaves it and finds the minima x = ±1 (+ a)
    value, success, _ = fn(np.array([0.3, -0.3, 0.3, -0.3]))
    assert success
    # max|F| ≤ 1e-8 with curvature 8 at the minimum: |x − x*| ≤ 1.25e-9
    assert_allclose(np.abs(value - np.array([0.3, -0.3, 0.3, -0.3])), 1.0, atol=1.25e-9)


def test_scalar_minimization_at_a_maximum_is_not_success():
    s, c = pt.scalar("s"), pt.scalar("c")
    s_star, ok = pmo.minimize_scalar(((s - c) ** 2 - 1) ** 2, s, x0=0.0, method="newton")
    assert not pytensor.function([c], ok)(0.0)


def test_the_rounding_stop_does_not_depend_on_a_constant_offset():
    """1e12 + f(x) has the minimizer of f; its decrease is invisible next to 1e12 from the first
    steps on, so Newton must go on with full steps that reduce the gradient, not stop."""
    x, c = pt.vector("x"), pt.scalar("c")
    f = 1e-7 * pt.cosh(x - 10.0).sum()
    results = []
    for objective in [f + c, 1e12 + f + c]:
        # tol on F = 1e-7 sinh(x − 10): |x − 10| ≤ tol / 1e-7 = 1e-6 at convergence
        x_star, ok = pmo.minimize(
            objective, x, x0=np.zeros(3), method="newton", optimizer_kwargs={"tol": 1e-13}
        )
        info = pmo.solution_info(x_star)
        results.append(pytensor.function([c], [x_star, ok, info.n_iterations])(0.0))
    (x_plain, ok_plain, it_plain), (x_offset, ok_offset, it_offset) = results
    assert ok_plain and ok_offset
    assert_allclose(x_offset, 10.0, atol=1e-6)
    assert_allclose(x_offset, x_plain, atol=1e-6)
    assert it_offset > 1


def test_newton_ends_with_a_final_step_past_the_tolerance():
    """After max|F| ≤ tol, Newton takes one more step with the F and A it already has (no
    evaluation), so the solution is exact to ~tol² rather than to tol: for F = eˣ − a the step
    leaves F²/(2a), ≤ tol²/(2·min a). Without it the iterate where |F| crossed tol = 1e-2 is
    returned, with |F| between 9e-4 and 3e-3 here."""
    x, a = pt.vector("x"), pt.vector("a")
    tol = 1e-2
    x_star, ok = pmo.minimize(
        (pt.exp(x) - a * x).sum(), x, x0=np.zeros(3), method="newton", optimizer_kwargs={"tol": tol}
    )
    a_val = np.array([2.0, 3.0, 5.0])
    value, success = pytensor.function([a], [x_star, ok])(a_val)
    assert success
    assert np.max(np.abs(np.exp(value) - a_val)) <= tol**2 / (2 * a_val.min())


# --- warm start (the Laplace marginal's inner solves) ----------------------------------------
def test_laplace_warm_start_agrees_with_the_cold_start_whatever_the_history():
    """The marginal's value and gradient at θ do not depend on what was evaluated before, along
    random histories that mix a sampler's small moves with far jumps (the start of a new
    trajectory, warm-up's first steps): bit for bit against the same warm-starting marginal
    with its history cleared (`canonical_step`: the warm and the cold solve end on the same
    grid point unless they straddle one, ≈ 1e-8 per element), and to rounding against
    ``warm_start=False`` (which ends at its own last bits; both modes are exact to ~1e-15, the
    gradient's implicit solve adds cond(H) ≈ 10 of rounding: 1e-12 relative, where stopping at
    max|F| ≤ tol without the final Newton step left 4e-11 in value and 4e-10 in gradient)."""
    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    fresh = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    cold = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=False)
    assert newton_node(warm).op.warm_start and not newton_node(cold).op.warm_start
    f_warm = warm.logp_dlogp_function(ravel_inputs=True)
    f_fresh = fresh.logp_dlogp_function(ravel_inputs=True)
    f_cold = cold.logp_dlogp_function(ravel_inputs=True)
    for f in (f_warm, f_fresh, f_cold):
        f.set_extra_values({})
    fresh_history = warm_history(f_fresh)
    # the compiled function runs the numpy loop (perform) on the Op that warm-starts
    ops = [n.op for n in f_warm._pytensor_function.maker.fgraph.toposort()]
    assert newton_node(warm).op in ops

    rng = np.random.default_rng(14)
    centre = np.array([0.5, np.log(0.7)])
    here = centre.copy()
    for _ in range(40):
        for _ in range(rng.integers(1, 4)):  # the history: 1–3 evaluations
            far = rng.random() < 0.25
            here = rng.normal(centre, 1.5) if far else here + rng.normal(0.0, 0.1, 2)
            f_warm(raveled(warm, *here))
        target = rng.normal(centre, 0.3)
        value_warm, grad_warm = f_warm(raveled(warm, *target))
        fresh_history.clear()
        value_fresh, grad_fresh = f_fresh(raveled(fresh, *target))
        value_cold, grad_cold = f_cold(raveled(cold, *target))
        assert np.isfinite(value_cold) and np.all(np.isfinite(grad_cold))
        assert value_warm == value_fresh
        np.testing.assert_array_equal(grad_warm, grad_fresh)
        assert_allclose(value_warm, value_cold, rtol=1e-12)
        assert_allclose(grad_warm, grad_cold, rtol=1e-12, atol=1e-12 * np.abs(grad_cold).max())


@pytest.mark.parametrize("mode", [None, "NUMBA"])
def test_laplace_warm_start_is_taken(mode):
    """At the θ just evaluated, the warm solve starts at its mode: no Newton step, two
    evaluations (at the start, and `canonical_step`'s); the cold solve repeats its iterations.
    Along a small move it needs fewer. The numpy loop (the C backend's `perform`) and the
    compiled numba loop alike."""
    if mode == "NUMBA":
        pytest.importorskip("numba")
    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    cold = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=False)
    c_warm, c_cold = counters(warm, mode=mode), counters(cold, mode=mode)
    theta, moved = (0.4, np.log(0.6)), (0.45, np.log(0.65))
    ok, it_first, _ = c_warm(*theta)
    assert ok and it_first > 2
    ok, it_again, ev_again = c_warm(*theta)
    assert ok and it_again == 0 and ev_again == 2
    assert c_cold(*theta)[1] == c_cold(*theta)[1] == it_first
    ok, it_moved, _ = c_warm(*moved)
    assert ok and 0 < it_moved < c_cold(*moved)[1]


def test_laplace_warm_start_falls_back_to_the_cold_start():
    """A stored mode from which Newton fails (exp(800) overflows: the merit is not finite at
    the start) is abandoned: the solve is repeated from the initial point and gives the result
    of a solve without history exactly; the counters hold both solves and `canonical_step`."""
    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    cold = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=False)
    f_warm, f_cold = (m.compile_logp(vars=m.potentials) for m in (warm, cold))
    c_warm, c_cold = counters(warm), counters(cold)
    theta = theta_point(warm, 0.4, np.log(0.6))
    bad = [(np.zeros(3), np.full(30, 800.0))]  # one stored solve: no secant, this start
    warm_history(c_warm)[:] = bad
    ok, iterations, evaluations = c_warm(*theta.values())
    ok_cold, it_cold, ev_cold = c_cold(*theta.values())
    assert ok and ok_cold
    # the failed start: 1 evaluation, and 1 for the canonical step
    assert iterations == it_cold and evaluations == ev_cold + 2
    stored = warm_history(f_warm)
    stored.clear()
    without_history = f_warm(theta)
    stored[:] = bad
    assert f_warm(theta) == without_history
    assert_allclose(without_history, f_cold(theta), rtol=1e-12)
    # a successful solve stored its (finite) mode
    assert np.all(np.abs(stored[-1][1]) < 10)


def test_laplace_warm_start_state_is_not_pickled():
    """The stored mode belongs to the process: a pickled marginal (what pm.sample sends to its
    worker processes) starts cold and agrees with the original."""
    import pickle

    import cloudpickle

    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    f = warm.compile_logp(vars=warm.potentials)
    theta = theta_point(warm, 0.4, np.log(0.6))
    reference = f(theta)
    assert warm_history(f)
    op = newton_node(warm).op
    for copy in (pickle.loads(pickle.dumps(op)), cloudpickle.loads(cloudpickle.dumps(op))):
        assert copy.warm_start and "_direct" not in copy.__dict__
    f_copy = cloudpickle.loads(cloudpickle.dumps(f))
    assert not warm_history(f_copy)
    assert_allclose(f_copy(theta), reference, rtol=1e-8)
    model = cloudpickle.loads(cloudpickle.dumps(warm))
    assert_allclose(model.compile_logp(vars=model.potentials)(theta), reference, rtol=1e-8)


def test_laplace_warm_start_argument_is_checked():
    with pytest.raises(TypeError, match="`warm_start` must be True or False; got 'yes'"):
        pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start="yes")


@pytest.mark.slow
def test_laplace_warm_start_under_pm_sample_with_two_processes():
    """pm.sample with cores=2 (the marginal pickled into two worker processes, each warm-
    starting from its own history) draws what cold starts draw: the same tree sizes, and the
    draws within 1e-6. A warm start changes the potential by ~1e-10 relative (the test above
    asserts 1e-8), and along a chain of 2 × 100 short trajectories rounding-sized differences
    grow but stay far below 1e-6; a flipped accept or U-turn decision would differ by O(1)."""
    import pymc as pm

    draws = {}
    for warm_start in (True, False):
        marginal = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=warm_start)
        with marginal:
            idata = pm.sample(
                draws=100, tune=100, chains=2, cores=2, random_seed=5, progressbar=False
            )
        draws[warm_start] = idata
    for name in ("mu", "sigma"):
        assert_allclose(
            draws[True].posterior[name].values, draws[False].posterior[name].values, rtol=1e-6
        )
    np.testing.assert_array_equal(
        draws[True].sample_stats["tree_depth"].values,
        draws[False].sample_stats["tree_depth"].values,
    )


def test_newton_converges_when_the_merit_is_a_long_sum():
    """A Bernoulli-logit Laplace merit sums 6,000 terms: its rounding (~35 ulp) hides the last
    Newton steps' decrease, which the stop rule must see as rounding (`ROUNDING`) rather than
    backtrack on noise until the line search fails (2.5 % of solves failed at 16 ulp)."""
    import pymc as pm

    rng = np.random.default_rng(300)
    n_groups = 300
    group = np.repeat(np.arange(n_groups), 20)
    y = rng.binomial(1, 1 / (1 + np.exp(-rng.normal(0.0, 0.7, n_groups)[group])))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=n_groups)
        pm.Bernoulli("y", logit_p=mu + u[group], observed=y)
    marginal = pmo.marginalize_laplace(model, "u", warm_start=False)
    count = counters(marginal)
    draws = rng.normal([0.0, -0.46], [0.1, 0.05], size=(200, 2))
    results = np.array([count(*theta) for theta in draws])
    assert results[:, 0].all(), f"{(~results[:, 0].astype(bool)).sum()} of 200 solves failed"
    assert results[:, 1].max() <= 8  # quadratic convergence from u = 0, no long line searches


def test_laplace_warm_start_follows_a_straight_path():
    """Along equally spaced θ on a line (a leapfrog trajectory's shape), the start moved along
    the last two modes' secant needs fewer Newton steps than the last mode itself."""
    path = [(0.3 + 0.02 * k, np.log(0.6) + 0.03 * k) for k in range(6)]
    iterations = {}
    for predictor in (True, False):
        warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
        newton_node(warm).op.predictor = predictor
        count = counters(warm)
        iterations[predictor] = [int(count(*theta)[1]) for theta in path]
    assert iterations[True][:2] == iterations[False][:2]  # no secant before two solves
    assert sum(iterations[True][2:]) < sum(iterations[False][2:])


@pytest.mark.parametrize("mode", [None, "NUMBA", "JAX"])
def test_a_trial_step_that_breaks_a_parameter_check_is_a_rejected_step(mode):
    """pm.NegativeBinomial's logp rebuilds mu = α(1 − p)/p from p = α/(α + eᵘ) and checks
    `mu > 0`. From u = 10 with a zero count and a weak prior the Newton step is about −10⁶ (the
    curvature is ~e⁻¹⁰ + 1/σ²): at the trial point p rounds to 1, mu to 0, and the check fails.
    As PyMC compiles a logp, the check gives −inf there (the merit +inf), so the line search
    backtracks and the solve converges; the check used to raise, and the whole solve ended as
    invalid (at a posterior point, "Bad initial energy" in pm.sample). Under numba the line
    search's merit accepted u ≈ −480, where the merit's own compiled graph is finite and the
    system's, rounded otherwise, is not: a point where the system is not finite is a rejected
    step too."""
    import pymc as pm

    if mode is not None:
        pytest.importorskip(mode.lower())
    u, alpha = pt.vector("u", shape=(2,)), pt.scalar("alpha")
    counts = np.array([0, 3])
    objective = -pm.logp(pm.NegativeBinomial.dist(mu=pt.exp(u), alpha=alpha), counts).sum()
    objective = objective + 0.5 * (u**2).sum() / 1e6  # a weak N(0, 1000²) prior
    u_star, ok = pmo.minimize(objective, u, x0=np.array([10.0, 1.0]), method="newton")
    iterations = pmo.solution_info(u_star).n_iterations
    alphas = pt.vector("alphas")  # a batch of problems: the stacked loop
    batched = vectorize_graph([u_star, ok, iterations], {alpha: alphas})
    fn = pytensor.function([alpha], [u_star, ok, iterations], mode=mode)
    fn_batch = pytensor.function([alphas], batched, mode=mode)
    for a, (got, success, n_iterations) in [
        (1.0, fn(1.0)),
        *zip([1.0, 2.0], zip(*fn_batch(np.array([1.0, 2.0])), strict=True), strict=True),
    ]:
        assert success and n_iterations > 0
        # the stationarity condition of each element by hand: (y + α) eᵘ/(α + eᵘ) − y + u/σ² = 0
        score = (counts + a) * np.exp(got) / (a + np.exp(got)) - counts + got / 1e6
        assert_allclose(score, 0.0, atol=1e-8)


def test_float32_controls_converge_at_a_tolerance_float32_can_reach():
    """In float32 the residual of a solution is rounding noise well above 1e-8: the default
    tolerance becomes the same multiple of √eps (2.3e-4), and the solves succeed (they ran
    max_iter steps and failed)."""
    a = pt.vector("a", dtype="float32")
    x = pt.vector("x", dtype="float32")
    a_value = np.array([1.0, 2.0], dtype="float32")
    x_star, ok = pmo.minimize(
        ((x - a) ** 2).sum() + (x**4).sum(), x, x0=np.zeros(2, "float32"), method="newton"
    )
    assert x_star.owner.op.tol == pytest.approx(1e-8 * np.sqrt(2.0**29))
    root, root_ok = pmo.root(x**3 - a, x, x0=np.ones(2, "float32"), method="newton")
    fixed, fixed_ok = pmo.fixed_point(0.5 * x + a, x, x0=np.zeros(2, "float32"), method="newton")
    values = pytensor.function([a], [x_star, ok, root, root_ok, fixed, fixed_ok])(a_value)
    assert all(bool(values[i]) for i in (1, 3, 5))
    assert_allclose(2 * (values[0] - a_value) + 4 * values[0] ** 3, 0.0, atol=1e-5)
    assert_allclose(values[2], np.cbrt(a_value), rtol=1e-6)
    assert_allclose(values[4], 2 * a_value, rtol=1e-6)
    # float64 keeps the tolerance it is given
    x64 = pt.vector("x64")
    x64_star, _ = pmo.minimize(((x64 - 1.0) ** 2).sum(), x64, x0=np.zeros(2), method="newton")
    assert x64_star.owner.op.tol == 1e-8
