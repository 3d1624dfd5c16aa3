"""What ``import pymc_optim`` changes in PyTensor and PyMC, and that ``pmo.disable_rewrites()``
undoes it: graphs that hold none of pymc_optim's Ops compile, in a fresh interpreter, exactly as
they do in one that never imported pymc_optim, and PyMC's functions are PyMC's own.

Each side runs in its own interpreter (``import pymc_optim`` cannot be undone in-process), in
the C backend and in PyTensor's default numba mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Unrelated graphs, each one a rewrite of the package used to change (compiled graphs), and the
# PyTensor / PyMC objects the package used to replace (printed as module.qualname).
PROBE = """
import json, sys
import numpy as np
import pymc as pm
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.graph import vectorize_graph
from pytensor.tensor.elemwise import Elemwise

linker, with_package = sys.argv[1], sys.argv[2] == "1"
if with_package:
    import pymc_optim as pmo

    pmo.disable_rewrites()


def graphs():
    x, v, c = pt.vector("x"), pt.vector("v"), pt.scalar("c")
    m = pt.matrix("m")
    mu, cov, value = pt.vector("mu"), pt.matrix("cov"), pt.vector("value")
    yield "fused elementwise", [x], [pt.exp(x) * x + x]
    # one variable at several inputs of a fused node (what equal subgraphs merged after fusion
    # leave behind)
    a, b, d = (ps.float64(name) for name in "abd")
    composite = ps.Composite([a, b, d], [ps.exp(a) * b + ps.log(d) * a, a - b * d])
    s, t = pt.cumsum(x), pt.cumsum(v)
    yield "repeated composite inputs", [x, v], Elemwise(composite)(s, s, t)
    yield "AllocDiag in a product", [v, m], [pt.diag(v) @ m, (pt.diag(v) * m).sum()]
    useless = pt.switch(pt.lt(1, 0), x, x) + pt.switch(c > 0, x, x) + pt.switch(1, x, 2 * x)
    yield "useless switches", [x, c], [useless]
    logp = pm.logp(pm.MvNormal.dist(mu, cov), value)
    yield "MvNormal logp and gradient", [mu, cov, value], [logp, *pt.grad(logp, [mu, cov])]
    # the gradient of a concatenation, batched along sizes with broadcastable batch axes
    y = pt.concatenate([pt.cos(x[:2]) * c, pt.sin(x[2:]) * c**2])
    batch = pt.vector("batch")
    yield "batched Split", [x, batch], [vectorize_graph(pt.grad((y**2).sum(), x), {c: batch})]


from pytensor.tensor.rewriting.basic import local_useless_switch
from pymc.distributions.multivariate import MvNormalRV
from pymc.logprob.abstract import _logprob
import pymc.sampling.forward


def name(fn):
    fn = getattr(fn, "fn", fn)
    wrapped = " (wrapped)" if hasattr(fn, "__wrapped__") else ""
    return f"{fn.__module__}.{fn.__qualname__}{wrapped}"


found = {
    "local_useless_switch": name(local_useless_switch),
    "MvNormal _logprob": name(_logprob.dispatch(MvNormalRV)),
    "pm.sample_posterior_predictive": name(pm.sample_posterior_predictive),
    "pymc.sampling.forward.sample_posterior_predictive": name(
        pymc.sampling.forward.sample_posterior_predictive
    ),
}
mode = "NUMBA" if linker == "numba" else pytensor.compile.mode.Mode(linker=linker)
for label, inputs, outputs in graphs():
    fn = pytensor.function(inputs, outputs, mode=mode)
    found[label] = pytensor.dprint(fn.maker.fgraph, file="str", print_type=True)
print(json.dumps(found))
"""


def _environment() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _probe(linker: str, with_package: bool) -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), linker, "1" if with_package else "0"],
        capture_output=True,
        text=True,
        env=_environment(),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("linker", ["cvm", "numba"])
def test_disable_rewrites_leaves_pytensor_and_pymc_as_without_the_package(linker):
    if linker == "numba":
        pytest.importorskip("numba")
    without = _probe(linker, with_package=False)
    disabled = _probe(linker, with_package=True)
    assert without.keys() == disabled.keys()
    differ = [key for key in without if disabled[key] != without[key]]
    details = "\n\n".join(
        f"{k}:\n{without[k]}\n--- after disable_rewrites:\n{disabled[k]}" for k in differ
    )
    assert not differ, f"differ after pmo.disable_rewrites(): {differ}\n\n{details}"


# A Kronecker MvNormal density and its gradient, built before or after `import pymc_optim`, and
# compiled after it: Choleskys, solves and products of the factors only, values equal to the
# dense density's.
KRONECKER = """
import json, sys
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import scipy.stats
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.linalg import Cholesky, Solve, SolveTriangular
from pytensor.tensor.math import Dot

n_a, n_b = 6, 5
A, B = pt.matrix("A", shape=(n_a, n_a)), pt.matrix("B", shape=(n_b, n_b))
x = pt.vector("x", shape=(n_a * n_b,))


def build():
    logp = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(A, B)), x)
    return [logp, *pt.grad(logp, [A, B, x])]


if sys.argv[1] == "before":
    outputs = build()
    import pymc_optim
else:
    import pymc_optim

    outputs = build()
fn = pytensor.function([A, B, x], outputs)


def largest(kinds):
    # the largest axis of a matrix operand of the compiled graph's nodes of these kinds
    return max(
        max(i.type.shape)
        for node in fn.maker.fgraph.apply_nodes
        if isinstance(node.op.core_op if isinstance(node.op, Blockwise) else node.op, kinds)
        for i in node.inputs
        if i.type.ndim >= 2
    )


def spd(n, seed):
    m = np.random.default_rng(seed).normal(size=(n, n))
    return m @ m.T / n + np.eye(n)


a, b, v = spd(n_a, 1), spd(n_b, 2), np.random.default_rng(3).normal(size=n_a * n_b)
logp, d_a, d_b, d_x = fn(a, b, v)
# d logp / dΣ = -(Σ⁻¹ - Σ⁻¹ v vᵀ Σ⁻¹) / 2, pulled back through Σ = A ⊗ B
cov = np.kron(a, b)
u = np.linalg.solve(cov, v)
g = (-(np.linalg.inv(cov) - np.outer(u, u)) / 2).reshape(n_a, n_b, n_a, n_b)
want = [np.einsum("ikjl,kl->ij", g, b), np.einsum("ikjl,ij->kl", g, a), -u]
symmetric = lambda m: (m + m.T) / 2 if m.ndim == 2 else m
dense_logp = scipy.stats.multivariate_normal(np.zeros(cov.shape[0]), cov).logpdf(v)
print(json.dumps({
    "cholesky": largest(Cholesky),
    "solve or product": largest(Solve | SolveTriangular | Dot),
    "logp": [float(logp), float(dense_logp)],
    "gradient error": max(
        float(np.max(np.abs(symmetric(got) - w)) / np.max(np.abs(w)))
        for got, w in zip([d_a, d_b, d_x], want)
    ),
}))
"""


@pytest.mark.parametrize("order", ["before", "after"])
def test_kronecker_mvnormal_is_factored_whether_built_before_or_after_import(order):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KRONECKER), order],
        capture_output=True,
        text=True,
        env=_environment(),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # factors of 6 x 6 and 5 x 5: no Cholesky of A ⊗ B (30 x 30), and no solve or product with
    # 30 columns (the dense Cholesky's pullback, even through the factors, has 5 * 30 or 6 * 30)
    assert found["cholesky"] <= 6 and found["solve or product"] <= 6, found
    logp, dense_logp = found["logp"]
    assert logp == pytest.approx(dense_logp, rel=1e-10)
    # a gradient with respect to a symmetric matrix is meaningful in symmetric directions only
    assert found["gradient error"] < 1e-10
