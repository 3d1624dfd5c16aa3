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
