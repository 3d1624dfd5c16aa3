"""The fast paths on the graphs users write (issue 13): structure detection, Kronecker MvNormal.

Run ``python benchmarks/bench_user_graphs.py`` (about a minute on 2 cores). A script, not a
test: it prints markdown tables of times and ratios measured in the same run (calls of the
compared functions interleaved, the fastest of several batches kept: other processes on a
shared machine only ever add time) and exits 0 whatever the timings, 1 only if a fast path's
value disagrees with its reference.

Table 1 — Poisson random intercepts, G = 300, written plainly: ``x = pt.vector("x")``, the
objective ``-((y*(mu+x) - exp(mu+x)).sum() - 0.5*(x**2).sum()/sg**2)``,
``pmo.minimize(obj, x, x0=pt.zeros(G), method="newton")``; the timed function returns
``(x_star**2).sum()`` and its gradient with respect to (mu, sg). Rows: the default structure
(``"auto"``), ``structure="diagonal"``, ``structure="dense"`` and BFGS. Target: default within
1.5x of diagonal. Also the build-time cost of the detection (the structural reading alone, and
``minimize``'s whole graph construction with and without it).

Table 2 — ``pm.logp`` of PyMC's MvNormal with a Kronecker covariance, 900 dimensions
(30 × 30 factors, three factors 10 × 10 × 9), value and gradient with respect to the factors and
x. "before" is the graph built and compiled after ``pmo.disable_rewrites()`` (what PyTensor and
PyMC do without pymc_optim), "after" the same code with the rewrites on. Target: ≥ 20x, values
equal to 1e-8 (relative). ``pm.KroneckerNormal`` (PyMC's own Kronecker density) must not be
slowed down. Also a block-diagonal covariance (30 blocks of 30).

Table 1b — b = 3 correlated effects per group, G = 300, written with a (G, 3) matrix x whose
rows are independent: the default structure against the explicit block-diagonal one and dense.

Table 3 — constrained Newton-KKT, n = 300, written plainly (``x = pt.vector("x")``,
``x0=pt.zeros(n)``, default arguments): a separable objective Σ w eˣ + ½x² − a x under Σ x = c
and Σ_{i<10} eˣ = 12 (the Hessian of the Lagrangian is diagonal), and the same with rows of 3
correlated elements (``x.reshape((-1, 3))``, block-diagonal) under two dense linear
constraints; value and gradient of (x*·w) with respect to (a, c). Rows: the default
(``"auto"``: Schur complement on the constraints), the explicit structure, and
``structure="dense"`` (the (n + m)² KKT matrix).

Times are from `_timing.time_interleaved` (contenders' batches interleaved, order alternating);
ratios are medians of the paired per-repeat ratios.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from _timing import ratio, time_interleaved

import pymc_optim as pmo
from pymc_optim.linalg.detect import hessian_structure
from pymc_optim.problems.minimize import minimize


def interleaved(fns, repeats=5, batch=0.2):
    """(fastest ms per call of each function, paired ratios of each to the first), batches of
    the functions interleaved (`_timing.time_interleaved`)."""
    times = time_interleaved(dict(enumerate(fns)), repeats, batch)
    best = [min(times[k]) * 1e3 for k in range(len(fns))]
    return best, [ratio(times, k, 0) for k in range(len(fns))]


def relative_error(got, want) -> float:
    got = [np.asarray(g) for g in got]
    want = [np.asarray(w) for w in want]
    return max(
        float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-300))
        for g, w in zip(got, want, strict=True)
    )


def _same_values(values, ok: bool) -> bool:
    """`ok`, and False (with a message) if a structure changed the value or gradient."""
    for value in values[1:]:
        if relative_error(value, values[0]) > 1e-8:
            print("CHECK FAILED: a structure changed the value or gradient")
            ok = False
    return ok


def table_structure(ok: bool) -> bool:
    G = 300
    rng = np.random.default_rng(1)
    y = rng.poisson(np.exp(0.5 + rng.normal(0, 0.7, G))).astype(float)
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    x = pt.vector("x")
    obj = -((y * (mu + x) - pt.exp(mu + x)).sum() - 0.5 * (x**2).sum() / sg**2)

    t0 = time.perf_counter()
    for _ in range(100):
        hessian_structure(obj, [x])
    detect_ms = (time.perf_counter() - t0) / 100 * 1e3

    fns, structures, build = [], [], []
    for label, kwargs in [
        ("default (auto)", {"method": "newton"}),
        ('structure="diagonal"', {"method": "newton", "structure": "diagonal"}),
        ('structure="dense"', {"method": "newton", "structure": "dense"}),
        ("BFGS (default structure)", {"method": "BFGS"}),
    ]:
        t0 = time.perf_counter()
        x_star, _ = minimize(obj, x, x0=pt.zeros(G), **kwargs)
        build.append((time.perf_counter() - t0) * 1e3)
        out = (x_star**2).sum()
        fn = pytensor.function([mu, sg], [out, *pt.grad(out, [mu, sg])])
        structures.append(x_star.owner.op.condition.structure.kind)
        fns.append((label, lambda fn=fn: fn(0.4, 0.8)))
    values = [fn() for _, fn in fns]
    # the explicit structure first: the ratios are to it
    times, ratios = interleaved([fns[1][1], fns[0][1], *(fn for _, fn in fns[2:])])
    times[0], times[1], ratios[0], ratios[1] = times[1], times[0], ratios[1], ratios[0]
    print("\n## Table 1: Poisson random intercepts G = 300, value + gradient of a function of x*\n")
    print("| variant | structure used | ms per call | / diagonal (paired) | build ms |")
    print("|---|---|---|---|---|")
    for (label, _), kind, ms, r, b in zip(fns, structures, times, ratios, build, strict=True):
        print(f"| {label} | {kind} | {ms:.3f} | {r:.2f} | {b:.1f} |")
    print(
        f"\nStructural detection: {detect_ms:.3f} ms per call on this objective "
        f"({sum(1 for _ in pytensor.graph.traversal.apply_ancestors([obj]))} nodes); it does "
        "not depend on G."
    )
    for big in (10_000, 1_000_000):
        xb = pt.vector("xb")
        yb = np.ones(big)
        ob = -((yb * (mu + xb) - pt.exp(mu + xb)).sum() - 0.5 * (xb**2).sum() / sg**2)
        best = np.inf
        for _ in range(20):  # the fastest of 20 calls: a single call carries the machine's noise
            t0 = time.perf_counter()
            kind = hessian_structure(ob, [xb]).kind
            best = min(best, time.perf_counter() - t0)
        print(f"G = {big}: {kind}, {best * 1e3:.2f} ms")
    return _same_values(values, ok)


def table_block_structure(ok: bool) -> bool:
    """Table 1b: b = 3 correlated effects per group, x a (G, 3) matrix, rows independent."""
    G, b = 300, 3
    rng = np.random.default_rng(3)
    counts = rng.poisson(2.0, size=(G, b))
    precision = np.linalg.inv(np.array([[1.0, 0.5, 0.2], [0.5, 1.25, -0.2], [0.2, -0.2, 1.13]]))
    mu, sg = pt.scalar("mu"), pt.scalar("sg")
    X = pt.matrix("X")
    obj = -(
        pm.logp(pm.Poisson.dist(pt.exp(mu + X)), counts).sum()
        - 0.5 * ((X @ precision) * X).sum() / sg**2
    )
    fns, structures = [], []
    for label, kwargs in [
        (
            'structure="block_diagonal", block_size=3',
            {"structure": "block_diagonal", "block_size": 3},
        ),
        ("default (auto)", {}),
        ('structure="dense"', {"structure": "dense"}),
    ]:
        x_star, _ = minimize(obj, X, x0=pt.zeros((G, b)), method="newton", **kwargs)
        out = (x_star**2).sum()
        fn = pytensor.function([mu, sg], [out, *pt.grad(out, [mu, sg])])
        condition = x_star.owner.op.condition.structure
        structures.append(f"{condition.kind} {condition.block_size or ''}".strip())
        fns.append((label, lambda fn=fn: fn(0.4, 0.8)))
    values = [fn() for _, fn in fns]
    times, ratios = interleaved([fn for _, fn in fns])
    print(f"\n## Table 1b: {b} correlated effects per group, G = {G}, x a (G, {b}) matrix\n")
    print("| variant | structure used | ms per call | / explicit block (paired) |")
    print("|---|---|---|---|")
    for (label, _), kind, ms, r in zip(fns, structures, times, ratios, strict=True):
        print(f"| {label} | {kind} | {ms:.3f} | {r:.2f} |")
    return _same_values(values, ok)


def table_kkt(ok: bool) -> bool:
    """Table 3: Newton-KKT with a diagonal / block-diagonal Hessian of the Lagrangian."""
    n = 300
    w = np.linspace(0.5, 2.0, n)
    P = np.array([[2.0, 0.5, 0.1], [0.5, 1.5, -0.2], [0.1, -0.2, 1.0]])
    C = np.random.default_rng(4).normal(size=(2, n))
    x, a, c = pt.vector("x"), pt.vector("a"), pt.scalar("c")
    rows = x.reshape((-1, 3))
    cases = {
        "diagonal H, 2 constraints": (
            (w * pt.exp(x) + 0.5 * x**2 - a * x).sum(),
            [{"type": "eq", "fun": x.sum() - c}, {"type": "eq", "fun": pt.exp(x[:10]).sum() - 12}],
            {"structure": "diagonal"},
        ),
        "block-diagonal H (b = 3), 2 constraints": (
            ((rows @ P) * rows).sum() + pt.exp(x).sum() - (a * x).sum(),
            {"type": "eq", "fun": pt.as_tensor(C) @ x - pt.stack([c, -c])},
            {"structure": "block_diagonal", "block_size": 3},
        ),
    }
    print(f"\n## Table 3: constrained Newton-KKT, n = {n}, value + gradient of a function of x*\n")
    print("| problem | variant | structure used | ms per call | / explicit (paired) |")
    print("|---|---|---|---|---|")
    a_val = np.linspace(-1.0, 1.0, n)
    for problem, (objective, constraints, explicit) in cases.items():
        fns, used = [], []
        for label, kwargs in [
            ("explicit " + explicit["structure"], explicit),
            ("default (auto)", {}),
            ('structure="dense"', {"structure": "dense"}),
        ]:
            x_star, _ = minimize(
                objective,
                x,
                x0=pt.zeros(n),
                method="newton",
                constraints=constraints,
                **kwargs,
            )
            structure = x_star.owner.op.condition.structure
            hessian = getattr(structure, "hessian", None)
            used.append(structure.kind + (f" ({hessian.kind})" if hessian else ""))
            out = (x_star * w).sum()
            fn = pytensor.function([a, c], [out, *pt.grad(out, [a, c])])
            fns.append((label, lambda fn=fn: fn(a_val, 0.7)))
        values = [fn() for _, fn in fns]
        times, ratios = interleaved([fn for _, fn in fns], repeats=5, batch=0.2)
        for (label, _), kind, ms, r in zip(fns, used, times, ratios, strict=True):
            print(f"| {problem} | {label} | {kind} | {ms:.3f} | {r:.2f} |")
        ok = _same_values(values, ok)
    return ok


def _spd(rng, n):
    m = rng.normal(size=(n, n))
    return m @ m.T / n + np.eye(n)


def _mvnormal_case(name, rng):
    """(inputs, values, a function building the log density) for one case."""
    x = pt.vector("x", shape=(900,))
    if name == "kron of three factors":
        shapes = (10, 10, 9)
    elif name.startswith("cov=block_diag"):
        shapes = (30,) * 30
    else:
        shapes = (30, 30)
    factors = [pt.matrix(f"F{i}", shape=(s, s)) for i, s in enumerate(shapes)]
    values = [_spd(rng, s) for s in shapes] + [rng.normal(size=900)]

    def kron(mats):
        out = mats[0]
        for m in mats[1:]:
            out = pt.linalg.kron(out, m)
        return out

    def build():
        if name == "cov=kron(A, B)" or name == "kron of three factors":
            dist = pm.MvNormal.dist(mu=0, cov=kron(factors))
        elif name == "chol=kron(chol A, chol B)":
            dist = pm.MvNormal.dist(mu=0, chol=kron([pt.linalg.cholesky(f) for f in factors]))
        elif name == "tau=kron(A, B)":
            dist = pm.MvNormal.dist(mu=0, tau=kron(factors))
        elif name == "cov=block_diag(30 blocks of 30)":
            dist = pm.MvNormal.dist(mu=0, cov=pt.linalg.block_diag(*factors))
        elif name == "pm.KroneckerNormal(covs=[A, B])":
            dist = pm.KroneckerNormal.dist(mu=pt.zeros(900), covs=factors)
        logp = pm.logp(dist, x)
        return pytensor.function([*factors, x], [logp, *pt.grad(logp, [*factors, x])])

    return build, values


def _kernel(points, lengthscale):
    """Squared-exponential kernel (+ 1e-3 jitter) on a 1-d grid."""
    d2 = (points[:, None] - points[None, :]) ** 2
    return pt.exp(-0.5 * d2 / lengthscale**2) + 1e-3 * np.eye(points.size)


def _model_case(name, rng):
    """compile_logp + compile_dlogp / logp_dlogp_function of a space–time prior in a model."""
    grid = np.linspace(0, 1, 30)
    point_x = rng.normal(size=900)

    def build():
        with pm.Model() as model:
            ell_t = pm.HalfNormal("ell_t")
            ell_s = pm.HalfNormal("ell_s")
            cov = pt.linalg.kron(_kernel(grid, ell_t), _kernel(grid, ell_s))
            pm.MvNormal("x", mu=0, cov=cov)
        point = {"ell_t_log__": np.log(0.3), "ell_s_log__": np.log(0.5), "x": point_x}
        if name == "model.compile_logp + compile_dlogp":
            logp, dlogp = model.compile_logp(), model.compile_dlogp()
            return lambda: (logp(point), dlogp(point))
        fn = model.logp_dlogp_function(ravel_inputs=True)
        fn.set_extra_values({})
        flat = np.concatenate([np.atleast_1d(point[v.name]) for v in model.value_vars])
        return lambda: fn(flat)

    return build, []


def table_kronecker(ok: bool) -> bool:
    rng = np.random.default_rng(2)
    cases = [
        "cov=kron(A, B)",
        "chol=kron(chol A, chol B)",
        "tau=kron(A, B)",
        "kron of three factors",
        "model.compile_logp + compile_dlogp",
        "model.logp_dlogp_function",
        "cov=block_diag(30 blocks of 30)",
        "pm.KroneckerNormal(covs=[A, B])",
    ]
    print("\n## Table 2: MvNormal with a Kronecker covariance, N = 900, value + gradient\n")
    print("| case | before ms | after ms | before / after (paired) | max rel. difference |")
    print("|---|---|---|---|---|")
    for name in cases:
        if name.startswith("model."):
            build, values = _model_case(name, rng)
        else:
            build, values = _mvnormal_case(name, rng)
        pmo.disable_rewrites()
        try:
            before = build()
        finally:
            pmo.enable_rewrites()
        after = build()
        if values:
            b_fn, a_fn = (lambda f=before, v=values: f(*v)), (lambda f=after, v=values: f(*v))
        else:
            b_fn, a_fn = before, after
        want, got = _flatten(b_fn()), _flatten(a_fn())
        error = relative_error(got, want)
        (ta, tb), (_, r) = interleaved([a_fn, b_fn], repeats=3, batch=0.3)
        print(f"| {name} | {tb:.2f} | {ta:.2f} | {r:.1f} | {error:.1e} |")
        if error > 1e-8:
            print(f"CHECK FAILED: {name}: values differ by {error:.1e}")
            ok = False
    return ok


def _flatten(out):
    """Every array of `out`; square matrices (gradients with respect to a covariance factor)
    symmetrized: only symmetric directions are meaningful for a symmetric matrix argument, and
    the dense and factored Cholesky gradients differ in their antisymmetric part."""
    if isinstance(out, tuple | list):
        return [v for o in out for v in _flatten(o)]
    out = np.asarray(out)
    if out.ndim == 2 and out.shape[0] == out.shape[1]:
        out = (out + out.T) / 2
    return [out]


def main() -> int:
    warnings.simplefilter("ignore")
    ok = table_structure(True)
    ok = table_block_structure(ok)
    ok = table_kkt(ok)
    ok = table_kronecker(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
