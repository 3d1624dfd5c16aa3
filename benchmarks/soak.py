"""Soak: resident memory of long runs of compiled model log densities (issue 17).

Evaluates a compiled Laplace marginal's logp and gradient 100,000 times at jittered points and a
scipy-backed (BFGS) `pmo.Optimum` model's 10,000 times, printing the resident set size (RSS,
from /proc/self/status) at 0, 10k, 50k and 100k evaluations and its growth relative to the
first checkpoint (taken after a warm-up of 100 evaluations, so caches filled by the first calls
do not count as growth). Growth must stay under 5 %.

    python benchmarks/soak.py            # the full run
    python benchmarks/soak.py --scale 0.1  # a tenth of the evaluations
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import pymc as pm
import pytensor.tensor as pt

import pymc_optim as pmo


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def laplace_model() -> pm.Model:
    counts = np.random.default_rng(0).poisson(3.0, size=40)
    group = np.arange(40) % 10
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        u = pm.Normal("u", 0.0, tau, shape=10)
        pm.Poisson("y", pt.exp(b0 + u[group]), observed=counts)
    return pmo.marginalize_laplace(model, "u")


def minimize_model() -> pm.Model:
    mean = np.array([0.08, 0.05, 0.03])
    risk = np.array([[0.04, 0.01, 0.0], [0.01, 0.03, 0.005], [0.0, 0.005, 0.02]])
    holdings = np.random.default_rng(1).normal(0.3, 0.05, size=(10, 3))
    with pm.Model() as model:
        gamma = pm.LogNormal("gamma", np.log(3.0), 0.5)
        w = pt.vector("w", shape=(3,))
        objective = -(w @ mean) + 0.5 * gamma * (w @ pt.as_tensor(risk) @ w)
        w_star = pmo.Optimum("w_star", objective, w, x0=np.full(3, 0.3), method="BFGS")
        pm.Normal("holdings", w_star, 0.5, observed=holdings)
    return model


def soak(name: str, model: pm.Model, n: int, checkpoints, seed: int = 0) -> None:
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    start = pm.blocking.DictToArrayBijection.map(model.initial_point()).data
    rng = np.random.default_rng(seed)
    jitter = rng.uniform(-0.5, 0.5, size=(1024, start.size))
    for i in range(100):  # warm-up
        fn(start + jitter[i % 1024])
    gc.collect()
    base = rss_mb()
    print(f"\n{name}: {n} evaluations of logp + gradient")
    print(f"{'evaluations':>12} {'RSS (MB)':>10} {'growth':>8} {'seconds':>8}")
    print(f"{0:>12} {base:>10.1f} {0:>7.2f}% {0:>8.1f}")
    t0, done = time.perf_counter(), 0
    for target in checkpoints:
        for i in range(done, target):
            logp, _ = fn(start + jitter[i % 1024])
            if not np.isfinite(logp):
                raise RuntimeError(f"{name}: non-finite logp at evaluation {i}")
        done = target
        gc.collect()
        now = rss_mb()
        growth = 100 * (now - base) / base
        print(f"{done:>12} {now:>10.1f} {growth:>7.2f}% {time.perf_counter() - t0:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the evaluations")
    scale = parser.parse_args().scale
    laplace = [int(scale * k) for k in (10_000, 50_000, 100_000)]
    scipy_backed = [int(scale * k) for k in (1_000, 5_000, 10_000)]
    soak(
        "Laplace marginal (Poisson, 10 latents, graph-native Newton)",
        laplace_model(),
        laplace[-1],
        laplace,
    )
    soak("pmo.Optimum, scipy BFGS (3 controls)", minimize_model(), scipy_backed[-1], scipy_backed)


if __name__ == "__main__":
    main()
