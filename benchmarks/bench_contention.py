"""Laplace marginals' logp+gradient with another CPU-bound process on the machine, and under nutpie.

The figures of the other benchmarks are taken on a quiet machine. Users run parallel chains
(nutpie's threads, `pm.sample(cores>1)`'s processes) and other work. Small LAPACK calls go
through OpenBLAS's thread pool, whose threads spin for a core; with the cores busy they wait
instead, and a 100 × 100 factorization can take 10-1000x its quiet time. This script measures
that in the default (numba) backend:

* cases: the Finland GP marginal (`pmo.marginalize_laplace(finland_model(), "theta")`,
  n = 100 latent values, a dense covariance form) and the Poisson random-intercept marginal at
  G = 300 (diagonal Hessian) and `bench_sparse_laplace.py`'s ICAR field on a 100 × 100 grid
  (sparse Hessian, N = 10⁴), each's logp+gradient as `pm.sample` compiles it
  (`model.logp_dlogp_function`), at the initial point;
* conditions: a quiet machine, and one other CPU-bound process (a Python busy loop started by
  this script, ended when the case is measured); each with ``OPENBLAS_NUM_THREADS`` unset
  (OpenBLAS's default pool, one thread per core) and set to 1. Every (case, thread setting)
  runs in its own fresh process, since OpenBLAS reads the variable when it loads;
* under nutpie: 4 chains on 2 cores (threads in one process), 200 tuning + 200 draws, wall
  time per gradient evaluation (all chains' gradient evaluations / wall time x cores).

Timings: median of `--repeats` batches of calls lasting ~0.2 s each, compile excluded. Ratios
are against the quiet figure of the same thread setting, measured in the same run.

    python benchmarks/bench_contention.py [--repeats 7] [--no-nutpie]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("finland", "poisson300", "icar100")


def _model(case: str):
    import numpy as np
    import pymc as pm

    import pymc_optim as pmo

    if case == "finland":
        from pymc_optim.datasets.finland import finland_model

        return pmo.marginalize_laplace(finland_model(), "theta")
    if case == "icar100":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_sparse_laplace import model_for

        return pmo.marginalize_laplace(model_for(100)[0], "phi")
    rng = np.random.default_rng(1)
    groups = 300
    group = np.repeat(np.arange(groups), 5)
    y = rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, groups)[group]))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=groups)
        pm.Poisson("y", pm.math.exp(mu + u[group]), observed=y)
    return pmo.marginalize_laplace(model, "u")


def _time_call(case: str, repeats: int) -> float:
    """Median seconds per logp+gradient call at the model's initial point."""
    import statistics

    from pymc.blocking import DictToArrayBijection

    model = _model(case)
    # the function pm.sample's NUTS compiles (value and gradient of the pre-gradient-rewritten
    # logp; `compile_fn([logp(), dlogp()])` would take the logp before those rewrites)
    logp_and_gradient = model.logp_dlogp_function(ravel_inputs=True)
    point = DictToArrayBijection.map(model.initial_point()).data

    def fn(point):
        logp, gradient = logp_and_gradient(point)
        return float(logp) + float(gradient[0])  # (the outputs read, as a sampler reads them)

    fn(point)
    n, elapsed = 1, 0.0
    while elapsed < 0.02:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn(point)
        elapsed = time.perf_counter() - t0
    calls = max(1, round(n * 0.2 / elapsed))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(point)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _nutpie_ms_per_gradient(case: str) -> float:
    import nutpie

    compiled = nutpie.compile_pymc_model(_model(case))
    t0 = time.perf_counter()
    trace = nutpie.sample(
        compiled, chains=4, cores=2, tune=200, draws=200, seed=1, progress_bar=False
    )
    wall = time.perf_counter() - t0
    steps = int(trace.sample_stats["n_steps"].sum())
    warmup = trace.get("warmup_sample_stats")
    if warmup is not None and "n_steps" in warmup:
        steps += int(warmup["n_steps"].sum())
    return 1e3 * wall * 2 / steps  # two cores' worth of wall time per gradient


def _worker(args) -> None:
    out = {"call": _time_call(args.case, args.repeats)}
    if args.nutpie:
        out["nutpie"] = _nutpie_ms_per_gradient(args.case)
    print(json.dumps(out))


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _run(case: str, threads: str | None, busy: bool, repeats: int, nutpie: bool) -> dict:
    env = dict(os.environ)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if threads is not None:
        env["OPENBLAS_NUM_THREADS"] = threads
    command = [sys.executable, __file__, "--worker", case, "--repeats", str(repeats)]
    if nutpie:
        command.append("--nutpie")
    load = _busy() if busy else None
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    if result.returncode != 0:
        raise RuntimeError(f"{case} (threads={threads}, busy={busy}) failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-nutpie", action="store_true")
    parser.add_argument("--worker", choices=CASES)
    parser.add_argument("--case", dest="only", choices=CASES, action="append")
    parser.add_argument("--nutpie", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.case = args.worker
        _worker(args)
        return 0
    print(f"{os.cpu_count()} cores; numba (PyTensor's default) backend; ms per logp+gradient")
    print()
    header = "| case | OPENBLAS_NUM_THREADS | quiet | one busy process | busy / quiet |"
    if not args.no_nutpie:
        header += " nutpie 4 chains, ms per gradient |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for case in args.only or CASES:
        for threads in (None, "1"):
            quiet = _run(case, threads, False, args.repeats, not args.no_nutpie)
            busy = _run(case, threads, True, args.repeats, False)
            row = (
                f"| {case} | {threads or 'unset'} | {1e3 * quiet['call']:.3f} | "
                f"{1e3 * busy['call']:.3f} | {busy['call'] / quiet['call']:.1f}x |"
            )
            if not args.no_nutpie:
                row += f" {quiet['nutpie']:.3f} |"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
