"""ESS per second of (α, ρ) on the Finland disease map: Laplace marginal vs full NUTS (issue 19
item 5).

Run ``python benchmarks/bench_finland_ess.py [--samplers pymc nutpie] [--draws N]``. A script,
not a test: it prints one markdown table per sampler and the ratio against the target, and exits
0 whatever the timings.

Contenders, same sampler on each side: ``pmo.marginalize_laplace(finland_model(), "theta")``
(the latent-Gaussian covariance form) against the full model, centred and non-centred
(``finland_model(centered=False)``); the ratio is taken against the better full model. 4 chains
× (N tune + N draws), N = 1,000 by default, seed 1, chains one after the other (``cores=1``),
one BLAS thread. ESS is the minimum bulk ESS of α and ρ (ArviZ) over the kept draws; the time
is tuning + drawing, compile excluded (``_sampling``). Target: marginal ≥ 5x the better full
model.

``--limit S`` stops a full-model run after S seconds of wall time (it runs in a child
process). A stopped run is reported with the bound ESS/s < 4·N / (S − c), c the compile and
setup seconds of the completed full-model runs (wall time less sampling time): its bulk ESS of
(α, ρ) cannot exceed the 4·N kept draws unless the chains are antithetic, which NUTS on these
scale parameters is not (every completed run here has ESS well under 4·N). Rows print as each
run finishes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import arviz as az  # noqa: E402
from _sampling import sample_nutpie, sample_pymc  # noqa: E402
from _timing import git_revision  # noqa: E402

import pymc_optim as pmo  # noqa: E402
from pymc_optim.datasets.finland import finland_model, load_finland  # noqa: E402

HYPER = ["alpha", "rho"]
SAMPLERS = {"pymc": sample_pymc, "nutpie": sample_nutpie}


def row(name: str, posterior, seconds: float, steps: int) -> dict:
    bulk = az.ess(posterior, var_names=HYPER, method="bulk")  # ArviZ 1: a DataTree node
    ess = min(float(bulk[v].min()) for v in HYPER)
    means = {v: float(posterior[v].mean()) for v in HYPER}
    return {"name": name, "ess": ess, "seconds": seconds, "steps": steps, **means}


def run_limited(run, limit: float | None):
    """`run()` in a forked child stopped after `limit` seconds (None: in this process); its
    result, or None when stopped. A child that ends without a result raises (a crash is not a
    time-out)."""
    if limit is None:
        return run()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=lambda: results.put(run()))
    child.start()
    t0 = time.perf_counter()
    while child.is_alive() and time.perf_counter() - t0 < limit:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:  # still sampling
            continue
    try:  # finished between two polls
        return results.get(timeout=5.0)
    except queue.Empty:
        pass
    if not child.is_alive():
        raise RuntimeError(f"the sampling child ended without a result (exit {child.exitcode})")
    child.kill()
    child.join()
    return None


def print_row(r: dict) -> None:
    if r["seconds"] is None:
        print(f"| {r['name']} | stopped | > {r['limit']:.0f} | < {r['bound']:.2f} | | | |")
    else:
        print(
            f"| {r['name']} | {r['ess']:.0f} | {r['seconds']:.1f} | "
            f"{r['ess'] / r['seconds']:.2f} | {r['steps']} | {r['alpha']:.3f} | "
            f"{r['rho']:.2f} |",
            flush=True,
        )


def ess_per_second(r: dict) -> float:
    return r["bound"] if r["seconds"] is None else r["ess"] / r["seconds"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samplers", nargs="+", default=["pymc"], choices=list(SAMPLERS))
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--limit", type=float, default=None, help="seconds per full-model run")
    args = parser.parse_args()
    data = load_finland()
    contenders = {
        "marginal": lambda: pmo.marginalize_laplace(finland_model(data), "theta"),
        "full, non-centred": lambda: finland_model(data, centered=False),
        "full, centred": lambda: finland_model(data),
    }
    revision = git_revision(pmo.__file__)
    print(f"commit {revision}, 4 chains × ({args.draws} tune + {args.draws} draws)")
    for sampler in args.samplers:
        print(f"\n### {sampler}\n")
        print("| contender | min bulk ESS (α, ρ) | sampling s | ESS/s | steps | α mean | ρ mean |")
        print("|---|---|---|---|---|---|---|", flush=True)
        rows = []
        for name, build in contenders.items():

            def run(build=build, name=name, sampler=sampler):
                posterior, seconds, steps = SAMPLERS[sampler](
                    build(), args.draws, args.draws, 4, 1, quiet=True
                )
                return row(name, posterior, seconds, steps)

            limit = None if name == "marginal" else args.limit
            t0 = time.perf_counter()
            r = run_limited(run, limit)
            if r is None:
                setup = max((q["wall"] - q["seconds"] for q in rows[1:] if q["seconds"]), default=0)
                bound = 4 * args.draws / (limit - setup)
                r = {"name": name, "seconds": None, "limit": limit, "bound": bound}
            else:
                r["wall"] = time.perf_counter() - t0
            rows.append(r)
            print_row(r)
        best = max(rows[1:], key=ess_per_second)
        ratio = ess_per_second(rows[0]) / ess_per_second(best)
        bound = "≥ " if best["seconds"] is None else ""
        print(f"\nmarginal / {best['name']} ESS/s: {bound}{ratio:.2f} (target ≥ 5)", flush=True)


if __name__ == "__main__":
    main()
