"""Cost of one Laplace-marginal logp+gradient against one full-model logp+gradient (issue 14).

Run ``python benchmarks/bench_laplace_call.py`` (about a minute on 2 cores; ``--quick`` for a
smoke run). A script, not a test: it prints markdown tables and exits 0 whatever the timings.

Poisson random intercepts (the model of ``bench_laplace.py``): G = 300 groups, 5 counts each,
``mu ~ N(0, 2)``, ``sigma ~ HalfNormal(1)``, ``u_g ~ N(0, sigma)``, ``y ~ Poisson(exp(mu + u))``;
the marginal is ``pmo.marginalize_laplace(model, "u", hessian_structure="diagonal")``, once with
``warm_start=True`` (the default) and once with ``warm_start=False``.

For each backend (NUMBA = PyTensor 3's default, what ``pm.sample`` and nutpie compile; C =
``Mode(linker="cvm")``) it times ``model.logp_dlogp_function(ravel_inputs=True)`` of the two
marginals and of the full (centered) model, one batch of calls each in turn
(``_timing.time_interleaved``), every call at the next of 20 points θ near the posterior
(independent jitter of about the posterior's scale, so a warm start comes from a different
posterior point, as at the start of a NUTS trajectory, never from the same θ). It reports the
median of paired ratios to the full model (issue 14 item 5's target: ≤ 4x) and the NewtonOp's
iterations and evaluations per solve.

In C it also splits one warm marginal call (issue 14 item 4): the time in the compiled inner
functions (their ``fn.vm()``), in the rest of the Newton solve (the numpy loop and the Op's
bookkeeping), and in the outer graph (x* → log det H, the implicit pullback), each in units of
one full-model logp+gradient of the same run; and times one call of the loop's inner system
function through ``Function.__call__``, through the loop's ``direct_call`` and as ``fn.vm()``
alone (the per-call overhead is the difference).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import git_revision, ratio, time_interleaved  # noqa: E402

G, PER_GROUP, MU_TRUE, SIGMA_TRUE, SEED = 300, 5, 0.5, 0.7, 1
N_POINTS = 20


def build(mode: str):
    import numpy as np
    import pymc as pm

    import pymc_optim as pmo

    rng = np.random.default_rng(G)
    group = np.repeat(np.arange(G), PER_GROUP)
    u = rng.normal(0.0, SIGMA_TRUE, G)
    y = rng.poisson(np.exp(MU_TRUE + u[group]))

    def full():
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 2.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            u = pm.Normal("u", 0.0, sigma, shape=G)
            pm.Poisson("y", pm.math.exp(mu + u[group]), observed=y)
        return model

    jitter = np.random.default_rng(SEED)
    thetas = [
        {
            "mu": 0.48 + 0.05 * jitter.standard_normal(),
            "sigma_log__": np.log(0.68) + 0.1 * jitter.standard_normal(),
        }
        for _ in range(N_POINTS)
    ]
    contenders = {}
    for label, model in [
        ("full", full()),
        ("marginal, warm", pmo.marginalize_laplace(full(), "u", hessian_structure="diagonal")),
        (
            "marginal, cold",
            pmo.marginalize_laplace(full(), "u", hessian_structure="diagonal", warm_start=False),
        ),
    ]:
        fn = model.logp_dlogp_function(ravel_inputs=True, mode=mode)
        fn.set_extra_values({})
        points = [
            np.concatenate(
                [
                    np.atleast_1d(t[v.name]) if v.name in t else 0.3 * np.ones(G)
                    for v in model.value_vars
                ]
            )
            for t in thetas
        ]
        contenders[label] = (model, fn, points)
    return contenders


def cycling(fn, points):
    state = {"i": 0}

    def call():
        i = state["i"] = (state["i"] + 1) % len(points)
        return fn(points[i])

    return call


def newton_counts(model, fn, points):
    """Mean Newton iterations and evaluations per solve along the points, read from the Op."""
    import numpy as np
    from pytensor.graph.traversal import ancestors

    node = next(
        v.owner
        for v in ancestors(model.potentials)
        if v.owner is not None and type(v.owner.op).__name__ == "NewtonOp"
    )
    op = node.op
    counts = []
    original = op.solve

    def spy(*args):
        out = original(*args)
        counts.append([int(np.sum(out[2])), int(np.sum(out[3]))])
        return out

    op.solve = spy  # perform looks solve up on the instance
    try:
        for p in points:
            fn(p)
    finally:
        del op.solve
    if not counts:  # a compiled loop (numba) never calls `solve`: read the Op's outputs
        counts = compiled_counts(model, node, fn, points)
    return op, np.mean(counts, axis=0)


def compiled_counts(model, node, fn, points):
    """Iterations and evaluations per solve along the points, from a function of the Op's
    counters compiled in `fn`'s mode: it shares `fn`'s warm-start state (the solver's, kept per
    thread), so along the same points it starts where `fn` would."""
    import numpy as np
    import pytensor

    k = node.op.n_controls
    outputs = model.replace_rvs_by_values(node.outputs[k + 1 : k + 3])
    mode = fn._pytensor_function.maker.mode
    counters = pytensor.function(model.value_vars, outputs, mode=mode, on_unused_input="ignore")
    sizes = [int(np.prod(v.type.shape)) for v in model.value_vars]
    splits = np.cumsum(sizes)[:-1]
    counts = []
    for p in points:
        values = zip(np.split(np.asarray(p), splits), model.value_vars, strict=True)
        iterations, evaluations = counters(*(v.reshape(var.type.shape) for v, var in values))
        counts.append([int(np.sum(iterations)), int(np.sum(evaluations))])
    return counts


def breakdown(op, fn, points, calls):
    """Seconds per marginal call: in inner functions, in the rest of the solve, in total."""
    inner = [0.0]
    originals = dict(op.__dict__.get("_direct", {}))

    def timed(call):
        def wrapped(*args):
            t0 = time.perf_counter()
            out = call(*args)
            inner[0] += time.perf_counter() - t0
            return out

        return wrapped

    solve_time = [0.0]
    original_solve = op.solve

    def solve(*args):
        t0 = time.perf_counter()
        out = original_solve(*args)
        solve_time[0] += time.perf_counter() - t0
        return out

    op.__dict__["_direct"] = {k: (f, timed(c)) for k, (f, c) in originals.items()}
    op.solve = solve
    try:
        t0 = time.perf_counter()
        for i in range(calls):
            fn(points[i % len(points)])
        total = time.perf_counter() - t0
    finally:
        op.__dict__["_direct"] = originals
        del op.solve
    return inner[0] / calls, (solve_time[0] - inner[0]) / calls, total / calls


def call_overhead(op, fn, points, calls):
    """Seconds per call of the Newton loop's inner system function, called three ways: through
    ``Function.__call__`` (``trust_input=True``), through the loop's `direct_call` (what the
    loop does), and its ``fn.vm()`` alone with the inputs already in place (the computation)."""
    from pymc_optim.backends.newton import direct_call

    captured = {}
    original_solve = op.solve

    def spy(fns, x0s, params, extras):
        captured.update(fn=fns["system"], args=(x0s[0], *params))
        return original_solve(fns, x0s, params, extras)

    op.solve = spy
    try:
        fn(points[0])
    finally:
        del op.solve
    system, args = captured["fn"], captured["args"]
    direct = direct_call(system)

    def per_call(call):
        call()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - t0) / calls

    times = {
        "Function.__call__ (trust_input=True)": per_call(lambda: system(*args)),
        "direct_call (the loop's)": per_call(lambda: direct(*args)),
    }
    for container, arg in zip(system.input_storage, args, strict=True):
        container.storage[0] = arg  # (the outputs stay in place between calls: a lower bound)
    times["fn.vm() alone"] = per_call(system.vm)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    repeats = 3 if args.quick else args.repeats
    from pytensor.compile.mode import Mode

    import pymc_optim

    print(f"pymc_optim {git_revision(pymc_optim.__file__)}; Poisson random intercepts, G = {G}")
    print(f"median of {repeats} paired ratios; batches interleaved\n")
    print("| backend | contender | µs per logp+grad | / full | Newton it. | evals |")
    print("|---|---|---|---|---|---|")
    split = None
    # PyTensor 3 compiles with numba by default: the C backend is asked for by its linker
    for mode, label in [(Mode(linker="cvm"), "C"), ("NUMBA", "NUMBA")]:
        contenders = build(mode)
        counts = {}
        for name, (model, fn, points) in contenders.items():
            if name != "full":
                counts[name] = newton_counts(model, fn, points)
        calls = {name: cycling(fn, points) for name, (_, fn, points) in contenders.items()}
        times = time_interleaved(calls, repeats, 0.2)
        for name in contenders:
            us = sorted(times[name])[len(times[name]) // 2] * 1e6
            r = ratio(times, name, "full")
            it, ev = counts[name][1] if name in counts else ("", "")
            it = f"{it:.2f}" if it != "" else ""
            ev = f"{ev:.2f}" if ev != "" else ""
            print(f"| {label} | {name} | {us:.1f} | {r:.2f}x | {it} | {ev} |", flush=True)
        if label == "C":
            op = counts["marginal, warm"][0]
            _, fn, points = contenders["marginal, warm"]
            full_s = sorted(times["full"])[len(times["full"]) // 2]
            split = breakdown(op, fn, points, 100 if args.quick else 1000), full_s
            overhead = call_overhead(op, fn, points, 200 if args.quick else 2000)
    if split is not None:
        (inner, loop, total), full_s = split
        outer = total - inner - loop
        print("\nC backend, one warm marginal logp+gradient split (units: one full logp+grad):\n")
        print("| part | µs | / full |")
        print("|---|---|---|")
        for part, t in [
            ("compiled inner functions (fn.vm())", inner),
            ("rest of the Newton solve (numpy loop, Op bookkeeping)", loop),
            ("outer graph (log det, implicit pullback, PyMC's wrapper)", outer),
            ("total (timer included)", total),
        ]:
            print(f"| {part} | {t * 1e6:.1f} | {t / full_s:.2f} |")
        print("\nC backend, one call of the loop's inner system function (issue 14 item 4):\n")
        print("| called through | µs | / full |")
        print("|---|---|---|")
        for way, t in overhead.items():
            print(f"| {way} | {t * 1e6:.1f} | {t / full_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
