"""Exact sum-to-zero constraints against the corner constraint: one Laplace logp+gradient of a
Poisson ICAR on an m × m grid (issue 37 item 3).

Run ``python benchmarks/bench_constraints.py [--side 100] [--repeats 7]``. A script, not a test:
it prints one markdown table and exits 0 whatever the timings.

Model: Poisson counts with log rate b + φ, φ ~ ``pmo.distributions.ICAR(edges, sigma=σ,
constraint=...)`` on the grid's edges; θ = (b, log σ); ``marginalize_laplace(model, "phi")``
with the defaults. ``"corner"`` fixes φ at each component's first node (H sparse in N − 1
values); ``"sum_to_zero"`` integrates over {Σφ = 0} in all N values, its mode by one Newton loop
on the KKT conditions (`pymc_optim.model.constraints.kkt_mode`). Each constraint runs in a fresh
process, twice (the first process fills numba's disk cache, the second reuses it), in the
default backend (numba) as `pm.sample` compiles it (`logp_dlogp_function`); median of
`--repeats` batches of calls at θ near the initial point. Target: sum_to_zero ≤ 1.5x corner per
logp+gradient, and its first call with warm caches ≤ 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def _worker(side: int, constraint: str, repeats: int) -> dict:
    import pymc as pm
    import pytensor.tensor as pt

    import pymc_optim as pmo
    from pymc_optim.distributions import ICAR

    n = side * side
    index = np.arange(n).reshape(side, side)
    edges = np.concatenate(
        [
            np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], axis=1),
            np.stack([index[:-1].ravel(), index[1:].ravel()], axis=1),
        ]
    )
    rng = np.random.default_rng(1)
    counts = rng.poisson(np.exp(1.0 + 0.3 * rng.normal(size=n)))
    with pm.Model() as model:
        b = pm.Normal("b", 1.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        phi = ICAR("phi", edges=edges, sigma=sigma, constraint=constraint)
        pm.Poisson("y", mu=pt.exp(b + phi), observed=counts)
    t0 = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, "phi")
    build = time.perf_counter() - t0
    fn = marginal.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    point = marginal.initial_point()
    q = np.concatenate([np.ravel(point[v.name]) for v in fn._grad_vars])
    t0 = time.perf_counter()
    fn(q)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(6):
            fn(q + 0.01 * (i % 3))
        times.append((time.perf_counter() - t0) / 6)
    return {"build": build, "first": first, "call": statistics.median(times)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        side, constraint = int(args.worker[0]), args.worker[1]
        print(json.dumps(_worker(side, constraint, args.repeats)))
        return 0
    print(f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load before: {os.getloadavg()[0]:.2f}\n")
    print("| constraint | N | process | build s | first call s | logp+gradient s |")
    print("|---|---|---|---|---|---|")
    calls = {}
    for constraint in ("corner", "sum_to_zero"):
        for process in ("first", "second (warm caches)"):
            command = [
                sys.executable, __file__, "--worker", str(args.side), constraint,
                "--repeats", str(args.repeats),
            ]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            r = json.loads(result.stdout.strip().splitlines()[-1])
            calls[constraint] = r["call"]
            print(
                f"| {constraint} | {args.side**2:,} | {process} | {r['build']:.1f} "
                f"| {r['first']:.2f} | {r['call']:.4f} |",
                flush=True,
            )
    ratio = calls["sum_to_zero"] / calls["corner"]
    print(f"\nsum_to_zero / corner per logp+gradient (second processes): {ratio:.2f}x")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
