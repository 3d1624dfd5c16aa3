"""Benchmark of the scalar-specialization rewrite, and of what solver traces cost.

Run ``python benchmarks/bench_rewrites.py`` (about a minute) or ``--quick``. A script, not a test:
it prints markdown tables and exits 0 (1 only if a correctness check fails).

1. **Scalar specialization.** For one-unknown problems, a compiled function with the rewrite
   ``pymc_optim_scalar`` (scalar Newton) against the same graph compiled without it (the mode
   excluding the rewrite: scipy's BFGS / L-BFGS-B / hybr / lm through the unspecialized Op), in
   the same run, on the same inputs:

       minimize  f(x; a, b) = eˣ − a x + ½ b x²        (f' = eˣ − a + b x)
       root      F(x; a, b) = x³ + b x − a

   for x 0-d and of shape (1,), once returning x* only ("forward") and once x* with ∂x*/∂(a, b)
   ("+ gradient"), under PyTensor's default C backend and under numba (``--no-numba`` skips it;
   numba compiles each function in a few seconds). x* and the gradients of both are checked to
   agree (rtol 1e-6) before timing.

2. **Traces.** The same 3-unknown BFGS solve compiled with and without
   ``optimizer_kwargs={"trace": True}``, and the per-solve cost the untraced path pays for the
   option (a property lookup and one no-op `note` call), timed directly.

Timing: contenders alternate in batches of about ``--batch`` seconds with the garbage collector
off; a repeat's time is its batch mean per call; tables give medians over repeats of the times
and of the paired per-repeat ratios.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from _timing import paired_ratio, time_interleaved
from pytensor.compile.mode import get_mode

import pymc_optim as pmo
from pymc_optim.graph import trace as _trace
from pymc_optim.rewrites.scalar import SCALAR_REWRITE

#: PyTensor's default (C) backend, and numba, where the scipy-backed Ops fall back to object
#: mode while the graph-native Newton Op runs compiled.
BACKENDS = {"C": "FAST_RUN", "NUMBA": "NUMBA"}
A, B = 2.5, 0.7


def compare(fns: dict, args, repeats: int, batch: float) -> dict:
    """Interleaved timing (`_timing`); {name: (median seconds per call, paired ratio of the
    first's time to this one's)}."""
    times = time_interleaved(
        {name: (lambda fn=fn: fn(*args)) for name, fn in fns.items()}, repeats, batch
    )
    base = times[next(iter(fns))]
    return {name: (statistics.median(t), paired_ratio(base, t)) for name, t in times.items()}


def build(kind: str, shape: tuple):
    x = pt.tensor("x", shape=shape, dtype="float64")
    a, b = pt.dscalar("a"), pt.dscalar("b")
    x0 = np.full(shape, 0.3)
    if kind == "minimize":
        f = (pt.exp(x) - a * x + 0.5 * b * x**2).sum()
        method = "BFGS" if shape == () else "L-BFGS-B"
        x_star, _ = pmo.minimize(f, x, x0=x0, method=method)
    else:
        method = "hybr" if shape == () else "lm"
        x_star, _ = pmo.root(x**3 + b * x - a, x, x0=x0, method=method)
    return x_star.sum(), a, b, method


def scalar_specialization(repeats: int, batch: float, backends: list[str]) -> bool:
    print("## Scalar specialization: rewritten (scalar Newton) vs unspecialized, per call\n")
    print("| backend | problem | x shape | scipy method | outputs | unspecialized µs | Newton µs |")
    print("|---|---|---|---|---|---:|---:|")
    ok = True
    for backend, kind, shape in itertools.product(backends, ("minimize", "root"), ((), (1,))):
        mode = get_mode(BACKENDS[backend])
        x_star, a, b, method = build(kind, shape)
        for label, outputs in (
            ("forward", [x_star]),
            ("+ gradient", [x_star, *pt.grad(x_star, [a, b])]),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # numba's object-mode notice
                unspecialized = mode.excluding(SCALAR_REWRITE)
                fns = {
                    "unspecialized": pytensor.function([a, b], outputs, mode=unspecialized),
                    "newton": pytensor.function([a, b], outputs, mode=mode),
                }
                ref, new = fns["unspecialized"](A, B), fns["newton"](A, B)
            ops = [type(n.op).__name__ for n in fns["newton"].maker.fgraph.toposort()]
            if "NewtonOp" not in ops:
                print(f"FAIL: the rewrite did not fire for {kind} {shape}", file=sys.stderr)
                ok = False
            if not np.allclose(ref, new, rtol=1e-6, atol=0):
                print(f"FAIL: {kind} {shape} {label}: {ref} vs {new}", file=sys.stderr)
                ok = False
            res = compare(fns, (A, B), repeats, batch)
            (t_old, _), (t_new, ratio) = res["unspecialized"], res["newton"]
            print(
                f"| {backend} | {kind} | {shape} | {method} | {label} | {t_old * 1e6:.1f} | "
                f"{t_new * 1e6:.1f} ({ratio:.2f}× faster) |"
            )
    return ok


def traces(repeats: int, batch: float) -> None:
    print("\n## Solver traces: BFGS on 3 unknowns, per call\n")
    fns, ops = {}, {}
    for label, kwargs in (("untraced", {}), ("trace=True", {"trace": True})):
        x, a = pt.dvector("x", shape=(3,)), pt.dvector("a", shape=(3,))
        f = (pt.exp(x) - a * x).sum() + 0.5 * (x**2).sum()
        x_star, _ = pmo.minimize(f, x, x0=np.zeros(3), optimizer_kwargs=kwargs)
        fns[label] = pytensor.function([a], x_star)
        ops[label] = x_star.owner.op
    res = compare(fns, (np.array([1.0, -2.0, 0.5]),), repeats, batch)
    print("| variant | µs per call | untraced / variant |")
    print("|---|---:|---:|")
    for label, (t, ratio) in res.items():
        print(f"| {label} | {t * 1e6:.1f} | {ratio:.2f} |")
    op = ops["untraced"]
    n = 200_000
    start = time.perf_counter()
    for _ in range(n):
        if op.trace_limit:
            pass
        _trace.note("")
    added = (time.perf_counter() - start) / n
    untraced = res["untraced"][0]
    print(
        f"\nWhat the option adds to an untraced solve (trace_limit check + one no-op note): "
        f"{added * 1e6:.2f} µs, {100 * added / untraced:.2f}% of the {untraced * 1e6:.0f} µs call."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument("--batch", type=float, default=0.2, help="seconds per timed batch")
    parser.add_argument("--no-numba", action="store_true", help="skip the numba backend")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    batch = 0.05 if args.quick else args.batch
    backends = ["C"] if args.no_numba else ["C", "NUMBA"]
    ok = scalar_specialization(repeats, batch, backends)
    traces(repeats, batch)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
