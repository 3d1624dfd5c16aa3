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
"""

from __future__ import annotations

import argparse
import os

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
    ess = float(min(az.ess(posterior[v], method="bulk").to_array().min() for v in HYPER))
    means = {v: float(posterior[v].mean()) for v in HYPER}
    return {"name": name, "ess": ess, "seconds": seconds, "steps": steps, **means}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samplers", nargs="+", default=["pymc"], choices=list(SAMPLERS))
    parser.add_argument("--draws", type=int, default=1000)
    args = parser.parse_args()
    data = load_finland()
    contenders = {
        "marginal": lambda: pmo.marginalize_laplace(finland_model(data), "theta"),
        "full, centred": lambda: finland_model(data),
        "full, non-centred": lambda: finland_model(data, centered=False),
    }
    revision = git_revision(pmo.__file__)
    print(f"commit {revision}, 4 chains × ({args.draws} tune + {args.draws} draws)")
    for sampler in args.samplers:
        rows = []
        for name, build in contenders.items():
            posterior, seconds, steps = SAMPLERS[sampler](
                build(), args.draws, args.draws, 4, 1, quiet=True
            )
            rows.append(row(name, posterior, seconds, steps))
        print(f"\n### {sampler}\n")
        print("| contender | min bulk ESS (α, ρ) | sampling s | ESS/s | steps | α mean | ρ mean |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['name']} | {r['ess']:.0f} | {r['seconds']:.1f} | "
                f"{r['ess'] / r['seconds']:.2f} | {r['steps']} | {r['alpha']:.3f} | "
                f"{r['rho']:.2f} |"
            )
        best = max(rows[1:], key=lambda r: r["ess"] / r["seconds"])
        ratio = (rows[0]["ess"] / rows[0]["seconds"]) / (best["ess"] / best["seconds"])
        print(f"\nmarginal / {best['name']} ESS/s: {ratio:.2f} (target ≥ 5)")


if __name__ == "__main__":
    main()
