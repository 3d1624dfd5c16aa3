"""Cost of one Laplace-marginal logp+gradient against one full-model logp+gradient (issue 14).

Run ``python benchmarks/bench_laplace_call.py`` (about two minutes on 2 cores; ``--quick`` for a
smoke run). A script, not a test: it prints one markdown table and exits 0 whatever the timings.

Poisson random intercepts (the model of ``bench_laplace.py``): G = 300 groups, 5 counts each,
``mu ~ N(0, 2)``, ``sigma ~ HalfNormal(1)``, ``u_g ~ N(0, sigma)``, ``y ~ Poisson(exp(mu + u))``;
the marginal is ``pmo.marginalize_laplace(model, "u", hessian_structure="diagonal")``.

For each backend (C = pytensor's default mode, NUMBA = what nutpie compiles) it times
``model.logp_dlogp_function(ravel_inputs=True)`` of the marginal and of the full (centered)
model at the same 20 points of θ (near the posterior, jittered), calls interleaved, and reports
the minimum over repeats of the mean time per call (the least disturbed by other jobs on a
shared machine), their ratio (issue 14 item 5's target: ≤ 4x) and the NewtonOp's own
iteration and evaluation counts per solve. Old and new code alternate, twice each (``--rounds``),
and each keeps its fastest round.

Each code version runs in its own subprocess with ``PYTHONPATH`` set to it: ``--old``, a git
revision (default: the merge base with ``main``) exported with ``git archive`` to a temporary
directory, is the reference; the checkout holding this script is the new code. The table puts
them side by side, measured in one run. Every inner solve starts cold, from u = 0 (no warm
start yet: issue 14 item 1 is open).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

G, PER_GROUP, MU_TRUE, SIGMA_TRUE, SEED = 300, 5, 0.5, 0.7, 1
N_POINTS = 20


def worker(mode: str, repeats: int) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import pymc as pm
    import pytensor
    from pytensor.graph.traversal import ancestors

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

    marginal = pmo.marginalize_laplace(full(), "u", hessian_structure="diagonal")
    full_model = full()
    jitter = np.random.default_rng(SEED)
    thetas = [
        (0.48 + 0.05 * jitter.standard_normal(), np.log(0.68) + 0.1 * jitter.standard_normal())
        for _ in range(N_POINTS)
    ]
    names = [v.name for v in marginal.value_vars]
    marginal_points = [
        np.array([dict(zip(["mu", "sigma_log__"], t, strict=True))[n] for n in names])
        for t in thetas
    ]
    full_points = []
    for mu, log_sigma in thetas:
        value = {"mu": mu, "sigma_log__": log_sigma}
        full_points.append(
            np.concatenate(
                [
                    np.atleast_1d(value[v.name]) if v.name in value else 0.3 * np.ones(G)
                    for v in full_model.value_vars
                ]
            )
        )

    node = next(
        v.owner
        for v in ancestors(marginal.potentials)
        if v.owner is not None and type(v.owner.op).__name__ == "NewtonOp"
    )
    k = node.op.n_controls
    counts = marginal.replace_rvs_by_values(node.outputs[k + 1 : k + 3])
    count_fn = pytensor.function(marginal.value_vars, counts, on_unused_input="ignore", mode=mode)
    work = np.array([[int(c) for c in count_fn(*map(np.asarray, p))] for p in marginal_points])

    fns = {}
    for label, model, points in [
        ("marginal", marginal, marginal_points),
        ("full", full_model, full_points),
    ]:
        fn = model.logp_dlogp_function(ravel_inputs=True, mode=mode)
        fn.set_extra_values({})
        fn(points[0])
        fns[label] = (fn, points)
    times = {label: [] for label in fns}
    for _ in range(repeats):
        for label, (fn, points) in fns.items():
            t0 = time.perf_counter()
            for p in points:
                fn(p)
            times[label].append((time.perf_counter() - t0) / len(points))
    med = {label: float(np.min(t)) * 1e3 for label, t in times.items()}
    return {
        "marginal_ms": med["marginal"],
        "full_ms": med["full"],
        "iterations": float(work[:, 0].mean()),
        "evaluations": float(work[:, 1].mean()),
    }


def run_version(path: str, mode: str, repeats: int) -> dict | None:
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [sys.executable, __file__, "--worker", mode, "--repeats", str(repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=None, help="git revision (default: merge base)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", default=None)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.repeats)))
        return 0
    repeats = 3 if args.quick else args.repeats
    new = str(Path(__file__).resolve().parents[1])

    def git(*cmd):
        return subprocess.run(["git", "-C", new, *cmd], capture_output=True, check=True).stdout

    revision = args.old or git("merge-base", "HEAD", "main").decode().strip()
    old_dir = tempfile.mkdtemp(prefix="pymc_optim_old_")
    archive = git("archive", revision, "pymc_optim")
    subprocess.run(["tar", "-x", "-C", old_dir], input=archive, check=True)
    print(f"old = {revision[:10]}, new = {new} (working tree)\n")
    print(f"Poisson random intercepts, G = {G}; ms per logp+gradient call, min of {repeats}\n")
    print("| code | backend | marginal ms | full ms | ratio | Newton it. | evals |")
    print("|---|---|---|---|---|---|---|")
    for mode, label in [("FAST_RUN", "C"), ("NUMBA", "NUMBA")]:
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, path in [("old", old_dir), ("new", new)]:
                r = run_version(path, mode, repeats)
                if r is not None and (
                    name not in best or r["marginal_ms"] < best[name]["marginal_ms"]
                ):
                    best[name] = r
        for name in ["old", "new"]:
            r = best.get(name)
            if r is None:
                print(f"| {name} | {label} | failed | | | | |")
                continue
            print(
                f"| {name} | {label} | {r['marginal_ms']:.3f} | {r['full_ms']:.3f}"
                f" | {r['marginal_ms'] / r['full_ms']:.1f}x | {r['iterations']:.2f} |"
                f" {r['evaluations']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
