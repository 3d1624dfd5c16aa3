"""The graph-native solvers run natively under numba: no object mode, same numbers as the default.

Each solve is compiled under the default mode and under ``mode="NUMBA"``; solutions, success
flags, iteration and evaluation counts and implicit gradients must agree. Numba compiles slowly
(pytensor caches what it can on disk): few problems, each exercising several features.
"""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import pymc_optim as pmo

pytest.importorskip("numba")

RTOL = 1e-10


def object_mode_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "object mode" in str(w.message)]


def run(inputs, value_sets, outputs, mode):
    """Compile under `mode`, evaluate at each set of values; also return object-mode warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = pytensor.function(inputs, outputs, mode=mode, on_unused_input="ignore")
        results = [[np.asarray(r) for r in fn(*values)] for values in value_sets]
    return results, object_mode_warnings(caught)


def diagnostics(x_star, success, params=()):
    """Solution(s), success, counters and, given `params`, the implicit gradient of a loss."""
    xs = x_star if isinstance(x_star, list) else [x_star]
    info = pmo.solution_info(x_star)
    outs = [*xs, success, info.n_iterations, info.n_evaluations]
    if params:
        loss = sum((xi * (1.0 + pt.arange(xi.size).reshape(xi.shape))).sum() for xi in xs)
        outs += pt.grad(loss, list(params), disconnected_inputs="ignore")
    return outs


def check_agreement(problems: dict, inputs, value_sets):
    """Each problem's outputs agree between the default mode and NUMBA; NUMBA is native.

    One function per mode holds all `problems`, evaluated at every set of values (numba compiles
    once). Returns the NUMBA outputs as ``got[i][name]`` for the i-th set of values.
    """
    names = [name for name, outs in problems.items() for _ in outs]
    outputs = [out for outs in problems.values() for out in outs]
    want, _ = run(inputs, value_sets, outputs, mode=None)
    got, object_mode = run(inputs, value_sets, outputs, mode="NUMBA")
    assert not object_mode, object_mode
    by_name = []
    for i, (got_i, want_i) in enumerate(zip(got, want, strict=True)):
        by_name.append({})
        for name, g, w in zip(names, got_i, want_i, strict=True):
            msg = f"{name}, values #{i}"
            assert (g.dtype, g.shape) == (w.dtype, w.shape), msg
            if w.dtype.kind in "bi":  # success flags and counters: identical
                assert_array_equal(g, w, err_msg=msg)
            else:  # NaN where the default mode has NaN
                assert_allclose(g, w, rtol=RTOL, atol=1e-14, err_msg=msg)
            by_name[i].setdefault(name, []).append(g)
    return by_name


def newton_problem(name: str):
    """A graph-native Newton solve with three parameters: (x_star, success), parameters."""
    a, b, C = pt.vector("a", shape=(4,)), pt.scalar("b"), pt.matrix("C", shape=(2, 2))
    x = pt.vector("x", shape=(4,))
    separable = (pt.exp(x) - a * x + 0.5 * b * x**2).sum()
    y, s, u = pt.vector("y"), pt.scalar("s"), pt.scalar("u")  # y without a static shape
    newton = {"method": "newton"}
    if name == "minimize-dense-two-controls":
        objective = 0.5 * (y @ C @ y) - (a[:2] * y).sum() + pt.cosh(s - b) + 0.1 * s * y.sum()
        solve = pmo.minimize(objective, [y, s], x0=[np.zeros(2), 0.0], **newton)
    elif name == "minimize-diagonal":
        solve = pmo.minimize(separable, x, x0=np.zeros(4), structure="diagonal", **newton)
    elif name == "minimize-block_diagonal":  # coupled within 2x2 blocks
        pairs = x.reshape((2, 2))
        solve = pmo.minimize(
            separable + 0.3 * (pairs[:, 0] * pairs[:, 1]).sum(),
            x,
            x0=np.zeros(4),
            structure="block_diagonal",
            block_size=2,
            **newton,
        )
    elif name == "root-dense":
        solve = pmo.root(x**3 + b * x + 0.1 * x[::-1] - a, x, x0=np.ones(4), **newton)
    elif name == "root_scalar":
        solve = pmo.root_scalar(u**3 + b * u - a.sum(), u, x0=1.0, **newton)
    elif name == "minimize_scalar":
        solve = pmo.minimize_scalar(pt.exp(u) - a[1] * u + b * u**2, u, x0=0.0, **newton)
    return solve, [a, b, C]


GOOD = [np.array([1.0, 2.0, 0.5, 3.0]), 0.8, np.array([[2.0, 0.3], [0.3, 1.5]])]
NAN = [np.array([1.0, np.nan, 0.5, 3.0]), 0.8, GOOD[2]]  # the problem is NaN at x0


@pytest.mark.parametrize(
    "name",
    [
        "minimize-dense-two-controls",
        "minimize-diagonal",
        "minimize-block_diagonal",
        "root-dense",
        "root_scalar",
        "minimize_scalar",
    ],
)
def test_newton_is_native_and_agrees(name):
    (x_star, success), params = newton_problem(name)
    good, nan = check_agreement({name: diagnostics(x_star, success, params)}, params, [GOOD, NAN])
    n_controls = 2 if "two-controls" in name else 1
    success, n_iterations = good[name][n_controls : n_controls + 2]
    assert success and n_iterations >= 2
    success, n_iterations = nan[name][n_controls : n_controls + 2]
    assert not success and n_iterations == 0


def test_fixed_point_is_native_and_agrees():
    a, b = pt.vector("a", shape=(3,)), pt.scalar("b")
    x = pt.vector("x", shape=(3,))
    problems = {
        method: diagnostics(
            *pmo.fixed_point(b * pt.cos(a * x), x, x0=np.zeros(3), method=method), [a, b]
        )
        for method in ["iteration", "anderson", "newton"]
    }
    good = [np.array([1.0, 0.5, 0.7]), 0.9]  # b·a < 1: T is a contraction
    nan = [np.array([1.0, np.nan, 0.7]), 0.9]
    good, nan = check_agreement(problems, [a, b], [good, nan])
    assert all(outs[1] for outs in good.values())
    assert good["newton"][2] < good["anderson"][2] < good["iteration"][2]  # n_iterations
    assert not any(outs[1] for outs in nan.values())


def test_failed_solves_fail_the_same_way():
    """max_iter reached, a singular system, an invalid parameter: success False, no raise, the
    same counters and last iterate in both backends."""
    import pymc as pm

    a, sigma = pt.vector("a", shape=(3,)), pt.scalar("sigma")
    x = pt.vector("x", shape=(3,))
    problems = {
        "newton-max_iter": diagnostics(
            *pmo.root(
                x**3 + x - a,
                x,
                x0=np.full(3, 5.0),
                method="newton",
                optimizer_kwargs={"max_iter": 2},
            )
        ),
        "iteration-max_iter": diagnostics(
            *pmo.fixed_point(0.9 * pt.cos(a * x), x, x0=0.0, max_iter=3)
        ),
        # x² + 1 = 0 has no root: the first step lands on x = 0, where A = 2x is singular
        "newton-singular": diagnostics(*pmo.root(x**2 + a**2, x, x0=1.0, method="newton")),
        # sigma < 0: PyMC's parameter check fails at every x; as in a logp PyMC compiles, it is
        # −inf (the merit +inf) rather than an exception, so the solve stops at its start
        "newton-invalid-parameter": diagnostics(
            *pmo.minimize(
                -pm.logp(pm.Normal.dist(a, sigma), x).sum(), x, x0=np.zeros(3), method="newton"
            )
        ),
    }
    (got,) = check_agreement(problems, [a, sigma], [[np.ones(3), -1.0]])
    assert not any(outs[1] for outs in got.values())
    assert got["newton-max_iter"][2] == 2
    assert got["iteration-max_iter"][2] == 3
    assert got["newton-singular"][2] == 1
    assert_array_equal(got["newton-singular"][0], np.zeros(3))
    assert got["newton-invalid-parameter"][2] == 0
    assert_array_equal(got["newton-invalid-parameter"][0], np.zeros(3))


def test_failure_counting_is_native():
    """`CountFailures` (what `on_failure` puts after a solve's success) compiles in nopython
    mode: no object-mode warning, success passed through, one count per failed evaluation and
    none for a successful one, as `perform` counts."""
    from pymc_optim.model.failure import FAILED_EVALUATIONS, count_failures

    x = pt.vector("x")
    label = "test_failure_counting_is_native"
    success = count_failures(pt.all(x > 0), label)
    before = FAILED_EVALUATIONS[label]
    results, object_mode = run(
        [x], [[np.ones(2)], [-np.ones(2)], [-np.ones(2)]], [success], "NUMBA"
    )
    assert not object_mode
    assert [bool(r[0]) for r in results] == [True, False, False]
    assert FAILED_EVALUATIONS[label] - before == 2


def test_the_warn_policy_is_native():
    """`WarnOnFailure` (``on_failure="warn"``) compiles in nopython mode and warns, as
    `perform` does, at each failed evaluation, passing the value through."""
    from pymc_optim import PymcOptimWarning
    from pymc_optim.graph.failure_ops import WarnOnFailure

    x = pt.vector("x")
    value = WarnOnFailure("the test solve failed")(x * 2.0, pt.all(x > 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = pytensor.function([x], value, mode="NUMBA")
        assert not object_mode_warnings(caught)
        assert_array_equal(fn(np.ones(2)), [2.0, 2.0])
        assert not [w for w in caught if issubclass(w.category, PymcOptimWarning)]
        assert_array_equal(fn(-np.ones(2)), [-2.0, -2.0])
    messages = [str(w.message) for w in caught if issubclass(w.category, PymcOptimWarning)]
    assert messages == ["the test solve failed; using its last iterate."]


def test_failure_counting_counts_from_numbas_disk_cache(tmp_path):
    """The compiled count is cacheable on disk: a second process loads it (compiling nothing
    of it) and its failures are counted there, under the label."""
    import subprocess
    import sys

    script = (
        "import numpy as np, pytensor, pytensor.tensor as pt\n"
        "from numba.core import event\n"
        "from pymc_optim.model.failure import FAILED_EVALUATIONS, count_failures\n"
        "compiled = []\n"
        "class Listener(event.Listener):\n"
        "    def on_start(self, ev): compiled.append(ev.data['dispatcher'].py_func.__qualname__)\n"
        "    def on_end(self, ev): pass\n"
        "event.register('numba:compile', Listener())\n"
        "x = pt.vector('x')\n"
        "f = pytensor.function([x], count_failures(pt.all(x > 0), 'cached'), mode='NUMBA')\n"
        "f(np.ones(2)); f(-np.ones(2)); f(-np.ones(2))\n"
        "print(FAILED_EVALUATIONS['cached'], 'count_failures' in str(compiled))\n"
    )
    env = {
        **__import__("os").environ,
        "PYTENSOR_FLAGS": f"base_compiledir={tmp_path / 'pytensor'}",
        "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
    }
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert runs == [["2", "True"], ["2", "False"]]


@pytest.mark.slow
def test_nutpie_samples_a_graph_native_minimize_natively():
    pytest.importorskip("nutpie")
    import pymc as pm

    with pm.Model():
        mu = pm.Normal("mu", 0.0, 1.0, shape=3)
        x = pt.vector("x", shape=(3,))
        x_star, success = pmo.minimize(
            (pt.exp(x) - mu * x + 0.5 * x**2).sum(),
            x,
            x0=np.zeros(3),
            method="newton",
            structure="diagonal",
        )
        pm.Deterministic("converged", success)
        pm.Normal("y", x_star, 0.5, observed=np.array([0.2, 0.5, 0.9]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pm.sample(
                nuts_sampler="nutpie",
                draws=100,
                tune=100,
                chains=2,
                random_seed=1,
                progressbar=False,
            )
    assert not object_mode_warnings(caught)
    posterior = idata.posterior
    assert posterior.sizes["chain"] == 2 and posterior.sizes["draw"] == 100
    assert bool(posterior["converged"].all())
    assert np.isfinite(posterior["mu"].values).all()


@pytest.mark.slow
def test_sparse_newton_solves_by_the_sparse_cholesky_under_numba():
    """`structure=SparseStructure` (the sparse Laplace Hessian): the numba loop's Newton direction
    is the sparse Cholesky solve, as the numpy loop's, run natively (no object mode); solution,
    success, counters and implicit gradient equal the default mode's."""
    from pymc_optim.linalg.sparse import SparseStructure

    n = 6
    structure = SparseStructure.from_edges([(i, i + 1) for i in range(n - 1)], n)
    a, x = pt.vector("a", shape=(n,)), pt.vector("x", shape=(n,))
    objective = (pt.exp(x) - a * x).sum() + 0.5 * ((x[1:] - x[:-1]) ** 2).sum()
    x_star, success = pmo.minimize(
        objective, x, x0=np.zeros(n), method="newton", structure=structure
    )
    outputs = diagnostics(x_star, success, [a])
    values = [[np.array([1.0, 2.0, 0.5, 3.0, 1.5, 0.2])]]
    (want,), _ = run([a], values, outputs, mode=None)
    (got,), object_mode = run([a], values, outputs, mode="NUMBA")
    assert not object_mode, object_mode
    assert bool(want[1]) and want[2] > 1  # converged, in several Newton steps
    for g, w in zip(got, want, strict=True):
        if w.dtype.kind in "bi":
            assert_array_equal(g, w)
        else:
            assert_allclose(g, w, rtol=RTOL, atol=1e-14)
    # the solution is the minimizer: exp(x) − a + L x = 0 with L the path's Laplacian
    L = np.diag(np.r_[1.0, 2 * np.ones(n - 2), 1.0]) - np.eye(n, k=1) - np.eye(n, k=-1)
    assert_allclose(np.exp(got[0]) - values[0][0] + L @ got[0], 0.0, atol=1e-10)


def test_a_dense_newton_solve_runs_on_a_thread_with_a_small_stack():
    """nutpie runs chains on threads with 2 MiB stacks. OpenBLAS's threaded LU puts megabytes
    on its caller's stack (n ≥ 150 on 2 cores), and a dense Newton step of that size crashed
    the process there; the loop makes its LAPACK calls on one BLAS thread, whose LU does not."""
    import threading

    from pymc_optim.linalg import _cholesky

    if _cholesky.SET_BLAS_THREADS is None:
        pytest.skip("scipy's BLAS has no openblas_set_num_threads_local")
    n = 200
    rng = np.random.default_rng(0)
    M = np.eye(n) + rng.normal(0.0, 0.3 / np.sqrt(n), size=(n, n))  # dense, not symmetric
    x, a = pt.vector("x", shape=(n,)), pt.vector("a", shape=(n,))
    x_star, success = pmo.root(pt.dot(M, x) + 0.1 * pt.tanh(x) - a, x, x0=np.zeros(n),
                               method="newton")  # fmt: skip
    fn = pytensor.function([a], [x_star, success], mode="NUMBA")
    a_value = rng.normal(size=n)
    expected = fn(a_value)
    results = []
    threading.stack_size(2 * 1024 * 1024)
    try:
        thread = threading.Thread(target=lambda: results.append(fn(a_value)))
        thread.start()
        thread.join()
    finally:
        threading.stack_size(0)
    assert len(results) == 1 and bool(results[0][1])
    assert_allclose(results[0][0], expected[0], rtol=0, atol=1e-12)


# --- warm starts, the canonical step and chord steps -------------------------------------------
def test_laplace_warm_start_under_numba_does_not_depend_on_the_history():
    """Along random histories (small moves and far jumps), the numba marginal's value and
    gradient equal those of the same function with its state cleared, bit for bit (both end
    with the canonical step), and the default loop's to rounding (1e-12, as the default loop's
    own warm and cold solves agree)."""
    import pymc as pm
    from cases import poisson_intercepts, raveled

    from pymc_optim.backends import numba_runtime

    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    outputs = [
        warm.logp(),
        pt.concatenate([g.ravel() for g in pt.grad(warm.logp(), warm.value_vars)]),
    ]
    f_numba = pytensor.function(warm.value_vars, outputs, mode="NUMBA")
    f_default = pytensor.function(warm.value_vars, outputs)
    del pm
    rng = np.random.default_rng(14)
    centre = np.array([0.5, np.log(0.7)])
    here = centre.copy()
    for _ in range(20):
        for _ in range(rng.integers(1, 4)):
            far = rng.random() < 0.25
            here = rng.normal(centre, 1.5) if far else here + rng.normal(0.0, 0.1, 2)
            f_numba(*raveled(warm, *here))
        target = raveled(warm, *rng.normal(centre, 0.3))
        value, grad = f_numba(*target)
        numba_runtime._BUFFERS.clear()
        fresh_value, fresh_grad = f_numba(*target)
        assert value == fresh_value
        np.testing.assert_array_equal(grad, fresh_grad)
        want_value, want_grad = f_default(*target)
        assert_allclose(value, want_value, rtol=1e-12)
        assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-12 * np.abs(want_grad).max())


def test_laplace_warm_start_under_numba_falls_back_to_the_cold_start():
    """A stored mode from which Newton fails (exp(800) overflows at the start) is abandoned:
    the solve is repeated from the initial point, its counters hold both solves and the
    canonical step, and the finite mode it reaches replaces the stored one."""
    from cases import counters, poisson_intercepts

    from pymc_optim.backends import numba_runtime

    warm = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=True)
    cold = pmo.marginalize_laplace(poisson_intercepts(), "u", warm_start=False)
    c_warm, c_cold = counters(warm, mode="NUMBA"), counters(cold, mode="NUMBA")
    theta = (0.4, np.log(0.6))
    numba_runtime._BUFFERS.clear()
    assert c_warm(*theta)[0]
    ((state,),) = [list(buffers.values()) for buffers in numba_runtime._BUFFERS.values()]
    n_theta, n = int(state[1]), int(state[2])
    assert n == 30  # [count, len θ, len z], then (θ, z)
    state[0] = 1.0
    state[3 + n_theta : 3 + n_theta + n] = 800.0
    ok, iterations, evaluations = c_warm(*theta)
    ok_cold, it_cold, ev_cold = c_cold(*theta)
    assert ok and ok_cold
    assert iterations == it_cold and evaluations == ev_cold + 2
    assert np.all(np.abs(state[3 + n_theta : 3 + n_theta + n]) < 10)


def test_sequential_solve_takes_the_same_chord_steps_under_numba():
    """`sequential_solve` (latent draws along a tour): the numba loop takes the chord steps on
    the previous solve's Jacobian and returns the last iterate as the default loop does, with
    the same counters; a cold start (the Op's own x0) begins a new sequence."""
    from pymc_optim.backends.newton import sequential_solve

    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    C = np.array([[2.0, 0.5, 0.0], [0.5, 2.0, 0.5], [0.0, 0.5, 2.0]])
    objective = pt.exp(x).sum() - a @ x + 0.5 * x @ C @ x
    x_star, _ = pmo.minimize(objective, x, x0=np.zeros(3), method="newton")
    hessian = pt.diag(pt.exp(x_star)) + C
    start = pt.vector("start", shape=(3,))
    x_new, z, _, replacements = sequential_solve(x_star, start, hessian)
    info = [replacements[out] for out in x_star.owner.outputs[1:4]]
    functions = {
        mode: pytensor.function([a, start], [x_new, z, *info], mode=mode)
        for mode in (None, "NUMBA")
    }
    rng = np.random.default_rng(3)
    results = {mode: [] for mode in functions}
    for mode, f in functions.items():
        previous = np.zeros(3)  # the Op's x0: a cold start
        for step in range(8):
            a_value = np.array([1.0, 2.0, 0.5]) + 0.05 * step + 0.01 * rng.normal(size=3)
            out = f(a_value, previous if step % 4 else np.zeros(3))
            results[mode].append(out)
            previous = out[0]
        rng = np.random.default_rng(3)
    iterations = []
    for want, got in zip(results[None], results["NUMBA"], strict=True):
        assert_allclose(got[0], want[0], rtol=1e-12)
        assert_allclose(got[1], want[1], rtol=1e-10)
        assert [int(v) for v in got[2:]] == [int(v) for v in want[2:]]
        iterations.append(int(got[3]))
    # continued solves converge on chord steps alone (no Newton iteration); cold ones do not
    assert all(n > 0 for n in iterations[::4]) and 0 in iterations


def test_failure_counting_by_reason_is_native():
    """Under numba the count of a policy's flag carries its solve's status: each failed
    evaluation once under the reason of its first failed solve, as `perform` counts it, from
    a `CountFailures` node that has the status as its second input."""
    from pymc_optim.graph.failure_ops import CountFailures
    from pymc_optim.model.failure import (
        FAILED_EVALUATIONS,
        FAILED_EVALUATIONS_BY_REASON,
        apply_failure_policy,
    )

    a, x = pt.scalar("a"), pt.scalar("x")
    quadratic = (x - a) ** 2
    # NaN for a > 1 ("nonfinite"); for a < -1 a quartic that Newton does not finish in 3
    # iterations from 0 ("max_iter"); between them a quadratic, solved in one step
    objective = pt.switch(a > 1.0, np.nan, pt.switch(a < -1.0, quadratic**2 + quadratic, quadratic))
    x_star, success = pmo.minimize(
        objective, x, x0=0.0, method="newton", optimizer_kwargs={"max_iter": 3}
    )
    label = "test_failure_counting_by_reason_is_native"
    term = apply_failure_policy(
        -(x_star**2), success, "reject", "the test solve failed", label=label
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = pytensor.function([a], term, mode="NUMBA")
        assert not object_mode_warnings(caught)
    counts = [node for node in fn.maker.fgraph.apply_nodes if isinstance(node.op, CountFailures)]
    assert [len(node.inputs) for node in counts] == [2]

    def by_reason():
        return {r: n for (lab, r), n in FAILED_EVALUATIONS_BY_REASON.items() if lab == label}

    total, before = FAILED_EVALUATIONS[label], by_reason()
    values = [float(fn(v)) for v in [-2.0, 0.5, 2.0, -1.5, 3.0]]
    assert values[1] == -0.25 and np.isneginf([values[i] for i in (0, 2, 3, 4)]).all()
    increments = {r: n - before.get(r, 0) for r, n in by_reason().items()}
    assert {r: n for r, n in increments.items() if n} == {"max_iter": 2, "nonfinite": 2}
    assert FAILED_EVALUATIONS[label] - total == 4
