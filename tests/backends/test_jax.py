"""Graph-native solvers give the same values and gradients under the C, NUMBA and JAX backends."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo

pytest.importorskip("jax")

MODES = ["FAST_RUN", "NUMBA", "JAX"]


def problems():
    x, a, b = pt.vector("x", shape=(3,)), pt.vector("a"), pt.scalar("b")
    values = {a: np.array([1.0, 0.5, 0.7]), b: 0.9}  # b·a < 1: T is a contraction
    yield (
        "minimize",
        pmo.minimize(
            (pt.exp(x) - a * x + 0.5 * b * x**2).sum(),
            x,
            x0=np.zeros(3),
            method="newton",
            structure="diagonal",
        ),
        (a, b),
        values,
    )
    yield "root", pmo.root(x**3 + b * x - a, x, x0=np.ones(3), method="newton"), (a, b), values
    yield (
        "fixed_point-iteration",
        pmo.fixed_point(b * pt.cos(a * x), x, x0=np.zeros(3)),
        (a, b),
        values,
    )
    yield (
        "fixed_point-anderson",
        pmo.fixed_point(b * pt.cos(a * x), x, x0=np.zeros(3), method="anderson"),
        (a, b),
        values,
    )
    yield (
        "fixed_point-newton",
        pmo.fixed_point(b * pt.cos(a * x), x, x0=np.zeros(3), method="newton"),
        (a, b),
        values,
    )
    s = pt.scalar("s")
    yield (
        "root_scalar",
        pmo.root_scalar(s**3 - a.sum() * b, s, x0=1.0, method="newton"),
        (a, b),
        values,
    )


@pytest.mark.parametrize("name", [p[0] for p in problems()])
def test_backends_agree(name):
    (_, (x_star, success), params, values) = next(p for p in problems() if p[0] == name)
    outputs = [x_star, success, *pt.grad(x_star.sum(), list(params))]
    results = {
        mode: pytensor.function(list(params), outputs, mode=mode)(*values.values())
        for mode in MODES
    }
    reference = results["FAST_RUN"]
    assert reference[1]
    for mode in ["NUMBA", "JAX"]:
        for got, want in zip(results[mode], reference, strict=True):
            assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-12, err_msg=mode)


def test_scipy_solvers_refuse_jax_with_a_fix():
    x, a = pt.vector("x"), pt.vector("a")
    x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=np.zeros(2))
    with pytest.raises(NotImplementedError, match="method='newton'"):
        pytensor.function([a], x_star, mode="JAX")


def test_scipy_solvers_run_under_numba():
    x, a = pt.vector("x"), pt.vector("a")
    x_star, _ = pmo.minimize(((x - a) ** 2).sum() + (x**4).sum(), x, x0=np.zeros(2))
    outputs = [x_star, pt.grad(x_star.sum(), a)]
    want = pytensor.function([a], outputs)([1.0, 2.0])
    got = pytensor.function([a], outputs, mode="NUMBA")([1.0, 2.0])
    for g, w in zip(got, want, strict=True):
        assert_allclose(g, w, rtol=1e-12)


def test_jax_autodiff_of_the_jaxified_graph_uses_the_implicit_rule():
    """numpyro/blackjax differentiate the jaxified log density with JAX itself."""
    import jax
    from pymc.sampling.jax import get_jaxified_graph

    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    x_star, _ = pmo.minimize(
        (pt.exp(x) - a * x + 0.5 * x**2).sum(), x, x0=np.zeros(3), method="newton"
    )
    loss = (x_star**2).sum()
    jax_fn = get_jaxified_graph([a], [loss])
    a_val = np.array([1.0, 2.0, 3.0])
    got = jax.grad(lambda v: jax_fn(v)[0])(a_val)
    want = pytensor.function([a], pt.grad(loss, a))(a_val)
    assert_allclose(np.asarray(got), want, rtol=1e-10)


def newton_cases():
    """Solves that exercise the decisions of the Newton loop, on static shapes (for JAX)."""
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    newton = {"method": "newton", "x0": np.zeros(3)}
    # a local maximum at the start (F = 0, negative curvature): no success
    yield "maximum", pmo.minimize((((x - a) ** 2 - 1) ** 2).sum(), x, **newton), a, np.zeros(3)
    # a constant offset that hides the decrease: full steps on max|F|, to the minimum
    offset = 1e12 + 1e-7 * pt.cosh(x - a).sum()
    yield (
        "offset",
        pmo.minimize(offset, x, **newton, optimizer_kwargs={"tol": 1e-13}),
        a,
        np.full(3, 10.0),
    )
    # log cosh: the full Newton step −tanh(x − a)/sech²(x − a) overshoots for |x − a| ≳ 1.1
    yield (
        "line_search",
        pmo.minimize(pt.log(pt.cosh(x - a)).sum(), x, **newton, structure="diagonal"),
        a,
        np.array([0.5, 1.5, 3.0]),
    )
    yield (
        "full_steps",
        pmo.minimize((pt.exp(x) - a * x).sum(), x, **newton, structure="diagonal"),
        a,
        np.array([0.8, 1.2, 1.5]),
    )


@pytest.mark.parametrize("name", [case[0] for case in newton_cases()])
def test_newton_decisions_agree_across_backends(name):
    """Curvature check, offset-independent stop, line search and one call per accepted step:
    the same solution, success and counts in the C, NUMBA and JAX loops."""
    _, (x_star, success), a, a_value = next(c for c in newton_cases() if c[0] == name)
    info = pmo.solution_info(x_star)
    outputs = [x_star, success, info.n_iterations, info.n_evaluations]
    results = {
        mode: [np.asarray(r) for r in pytensor.function([a], outputs, mode=mode)(a_value)]
        for mode in MODES
    }
    value, ok, n_iterations, n_evaluations = results["FAST_RUN"]
    for mode in ["NUMBA", "JAX"]:
        assert_allclose(results[mode][0], value, rtol=1e-12, atol=1e-14, err_msg=mode)
        assert [r.item() for r in results[mode][1:]] == [ok, n_iterations, n_evaluations], mode
    if name == "maximum":
        assert not ok and n_iterations == 0
    else:
        assert ok
    if name == "offset":
        assert_allclose(value, 10.0, atol=1e-6)  # |x − 10| ≤ tol / 1e-7
    if name == "line_search":
        assert_allclose(value, a_value, atol=1e-8)
        assert n_evaluations > n_iterations + 1  # merit-only trials were needed
    if name == "full_steps":
        assert_allclose(value, np.log(a_value), atol=1e-8)
        assert n_evaluations == n_iterations + 1  # one system call per iteration


def test_failures_are_counted_and_warned_under_jax_without_a_callback_on_success():
    """`CountFailures` and `WarnOnFailure` under JAX: one count (one warning) per failed call,
    none for a successful one, inside ``jax.jit`` and through ``jax.grad`` of the jaxified
    graph; a successful call makes no host callback (the report is in a branch taken only on
    failure, and XLA must not drop it)."""
    import warnings

    import jax
    from pytensor.link.jax.dispatch import jax_funcify

    from pymc_optim.model.failure import FAILED_EVALUATIONS, WarnOnFailure, count_failures

    x = pt.vector("x")
    label = "test_failures_are_counted_under_jax"
    success = count_failures(pt.all(x > 0), label)
    counted = pytensor.function([x], success, mode="JAX")
    before = FAILED_EVALUATIONS[label]
    assert [bool(counted(v)) for v in [np.ones(2), -np.ones(2), -np.ones(2)]] == [1, 0, 0]
    assert FAILED_EVALUATIONS[label] - before == 2

    warned = WarnOnFailure("the test solve failed")(x**2, pt.all(x > 0)).sum()
    fgraph = pytensor.graph.FunctionGraph([x], [warned], clone=True)
    value_and_grad = jax.jit(jax.value_and_grad(lambda v: jax_funcify(fgraph)(v)[0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad = value_and_grad(np.ones(2))
        jax.block_until_ready(grad)
        assert not caught
        value, grad = value_and_grad(-np.ones(2))
        jax.block_until_ready(grad)
    assert [str(w.message) for w in caught] == ["the test solve failed; using its last iterate."]
    assert_allclose(grad, [-2.0, -2.0])
    assert "debug_callback" not in str(jax.make_jaxpr(lambda v: jax_funcify(fgraph)(v))(np.ones(2)))


@pytest.mark.parametrize("solve", ["root", "minimize", "fixed_point"])
def test_newton_on_list_controls_without_static_shapes_runs_under_jax(solve):
    """u = pt.vector("u") and x0 = pt.zeros_like(a): the inner graph's split of the stacked
    controls had traced sizes, which jnp.split refused (an AttributeError at the first call);
    the inner functions are built with the shapes JAX traces with."""
    a, b = pt.vector("a"), pt.scalar("b")
    u, v = pt.vector("u"), pt.scalar("v")
    x0 = [pt.zeros_like(a), 1.0]
    if solve == "root":
        (u_star, v_star), ok = pmo.root(
            [u - a * v, v - b + 0.1 * u.sum()], [u, v], x0=x0, method="newton"
        )
    elif solve == "minimize":
        (u_star, v_star), ok = pmo.minimize(
            ((u - a * v) ** 2).sum() + (v - b) ** 2, [u, v], x0=x0, method="newton"
        )
    else:
        (u_star, v_star), ok = pmo.fixed_point(
            [a * v, b - 0.1 * u.sum()], [u, v], x0=x0, method="newton"
        )
    a_value, b_value = np.array([1.0, 2.0, 3.0]), 2.0
    results = {
        mode: pytensor.function([a, b], [u_star, v_star, ok], mode=mode)(a_value, b_value)
        for mode in ["FAST_RUN", "JAX"]
    }
    v_exact = b_value if solve == "minimize" else b_value / (1 + 0.1 * a_value.sum())
    for mode, (u_found, v_found, success) in results.items():
        assert bool(success), mode
        assert_allclose(v_found, v_exact, rtol=1e-10, err_msg=mode)
        assert_allclose(u_found, a_value * v_exact, rtol=1e-10, err_msg=mode)
