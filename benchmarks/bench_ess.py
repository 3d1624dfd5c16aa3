"""ESS per second of the hyperparameters: Laplace marginal vs full-model NUTS (issue 14's suite).

Run ``python benchmarks/bench_ess.py`` (``--quick``: 2 chains × 200 + 200, a smoke run whose
numbers mean nothing; ``--models``, ``--sizes`` and ``--samplers`` pick rows). A script, not a
test: it prints one markdown table per model and the target lines, and exits 0 whatever the
timings.

Models (simulated once per G with a fixed seed; θ are the hyperparameters, u the latent field)
----------------------------------------------------------------------------------------------
* ``poisson``: ``mu ~ N(0, 2)``, ``sigma ~ HalfNormal(1)``, ``u_g ~ N(0, sigma)``,
  ``y ~ Poisson(exp(mu + u_g))``, 5 counts per group. Target ≥ 3x at G = 300, ≥ 5x at 3,000,
  ≥ 10x at 30,000.
* ``mixed``: the same with groups of 1, 5 and 50 counts (a third each). Target ≥ 8x.
* ``bernoulli``: ``y ~ Bernoulli(logit⁻¹(mu + u_g))``, 20 trials per group. Target ≥ 3x, and the
  marginal's posterior of θ within the stated tolerance of full NUTS's (below).
* ``negbin``: ``y ~ NegativeBinomial(mu=exp(mu + u_g), alpha)``, ``alpha ~ HalfNormal(5)``,
  5 counts per group. Target ≥ 3x.

Contenders, each sampled by PyMC's NUTS and by nutpie, in PyTensor's default backend (numba)
-------------------------------------------------------------------------------------------
* marginal: ``pmo.marginalize_laplace(model, "u")`` (structure ``"auto"``, found diagonal).
  Under PyMC also with ``warm_start=False``. The warm start and the Newton counts below exist
  where the solve runs in Python (``NewtonOp.solve``, as in the C backend); under numba the
  compiled loop starts every solve cold and does not call it, so the count column stays empty.
  PyMC's NUTS is asked for by name (``nuts_sampler="pymc"``): PyMC 6 picks nutpie when it is
  installed.
* full, centered (u ~ N(0, sigma)) and non-centered (u = sigma·z): the ratio is taken against
  the better of the two, same sampler.

How it is measured
------------------
4 chains × (1,000 tune + 1,000 draws), seed 1, chains one after the other (``cores=1``), one
BLAS thread. ESS is the minimum bulk ESS over θ (ArviZ) of the kept draws; the time is tuning +
drawing, compile excluded (PyMC's ``sampling_time``; nutpie timed after
``compile_pymc_model``). "grads" counts leapfrog steps in tuning and drawing, "µs/grad" the
sampler's time per step. Posterior agreement: for each θ, the difference of the marginal's mean
from the better full model's in units of the Monte Carlo standard error of that difference
(|z| ≤ 4 expected if both target the same posterior; the Laplace approximation's own bias
shows up as larger |z|), and the ratio of posterior standard deviations.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sampling import sample_nutpie, sample_pymc  # noqa: E402
from _timing import git_revision  # noqa: E402

import pymc_optim as pmo  # noqa: E402

DRAWS, TUNE, CHAINS, SEED = 1000, 1000, 4, 1
MU_TRUE, SIGMA_TRUE, ALPHA_TRUE = 0.5, 0.7, 4.0
TARGETS = {("poisson", 300): 3.0, ("poisson", 3000): 5.0, ("poisson", 30000): 10.0}
TARGETS |= {("mixed", 300): 8.0, ("bernoulli", 300): 3.0, ("negbin", 300): 3.0}
HYPER = {"poisson": ("mu", "sigma"), "mixed": ("mu", "sigma"), "bernoulli": ("mu", "sigma")}
HYPER["negbin"] = ("mu", "sigma", "alpha")


def simulate(name: str, G: int):
    rng = np.random.default_rng(G)
    if name == "mixed":
        sizes = np.array([1, 5, 50])[np.arange(G) * 3 // G]
    else:
        sizes = np.full(G, 20 if name == "bernoulli" else 5)
    group = np.repeat(np.arange(G), sizes)
    eta = MU_TRUE + rng.normal(0.0, SIGMA_TRUE, G)[group]
    if name == "bernoulli":
        y = rng.binomial(1, 1 / (1 + np.exp(-(eta - MU_TRUE))))  # mean rate 0.5
    elif name == "negbin":
        y = rng.negative_binomial(ALPHA_TRUE, ALPHA_TRUE / (ALPHA_TRUE + np.exp(eta)))
    else:
        y = rng.poisson(np.exp(eta))
    return y, group


def full_model(name: str, y, group, G: int, centered: bool) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        if centered:
            u = pm.Normal("u", 0.0, sigma, shape=G)
        else:
            u = pm.Deterministic("u", sigma * pm.Normal("z", 0.0, 1.0, shape=G))
        eta = mu + u[group]
        if name == "bernoulli":
            pm.Bernoulli("y", logit_p=eta, observed=y)
        elif name == "negbin":
            alpha = pm.HalfNormal("alpha", 5.0)
            pm.NegativeBinomial("y", mu=pt.exp(eta), alpha=alpha, observed=y)
        else:
            pm.Poisson("y", pt.exp(eta), observed=y)
    return model


def newton_op(model):
    from pytensor.graph.traversal import ancestors

    from pymc_optim.backends.newton import NewtonOp

    return next(
        v.owner.op
        for v in ancestors(model.potentials)
        if v.owner is not None and isinstance(v.owner.op, NewtonOp)
    )


def run_pymc(model, draws, tune, chains, count=False) -> dict:
    counts = []
    op = newton_op(model) if count else None
    if op is not None:
        original = op.solve

        def solve(*args):
            out = original(*args)
            counts.append((int(np.sum(out[2])), int(np.sum(out[3]))))
            return out

        op.solve = solve  # perform looks it up on the instance (cores=1: this process)
    try:
        posterior, seconds, steps = sample_pymc(model, draws, tune, chains, SEED, quiet=True)
    finally:
        if op is not None:
            del op.solve
    out = result(posterior, seconds, steps)
    if counts:
        out["iterations"], out["evaluations"] = np.mean(counts, axis=0)
    return out


def run_nutpie(model, draws, tune, chains) -> dict:
    return result(*sample_nutpie(model, draws, tune, chains, SEED, quiet=True))


def result(posterior, seconds, steps) -> dict:
    names = [v for v in ("mu", "sigma", "alpha") if v in posterior]
    ess = az.ess(posterior, var_names=names)
    mcse = az.mcse(posterior, var_names=names)
    return {
        "ess": min(float(ess[v]) for v in names),
        "seconds": float(seconds),
        "steps": steps,
        "mean": {v: float(posterior[v].mean()) for v in names},
        "sd": {v: float(posterior[v].std()) for v in names},
        "mcse": {v: float(mcse[v]) for v in names},
    }


def agreement(a: dict, b: dict, v: str) -> str:
    """a's posterior mean of `v` minus b's in Monte Carlo standard errors, and the sd ratio."""
    z = (a["mean"][v] - b["mean"][v]) / np.hypot(a["mcse"][v], b["mcse"][v])
    return f"z = {z:+.1f}, sd ratio {a['sd'][v] / b['sd'][v]:.3f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", nargs="+", default=["poisson", "mixed", "bernoulli", "negbin"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300])
    parser.add_argument("--samplers", nargs="+", default=["pymc", "nutpie"])
    args = parser.parse_args(argv)
    draws, tune, chains = (200, 200, 2) if args.quick else (DRAWS, TUNE, CHAINS)
    print(f"pymc_optim {git_revision(pmo.__file__)}; {chains} chains × ({tune} tune + {draws})")
    summary = []
    for name in args.models:
        for G in args.sizes:
            y, group = simulate(name, G)
            print(f"\n### {name}, G = {G}\n", flush=True)
            print(
                "| sampler | contender | min bulk ESS | s | ESS/s | grads | µs/grad | Newton it. |"
            )
            print("|---|---|---|---|---|---|---|---|")
            rows = {}
            for sampler in args.samplers:
                cases = [("marginal", True), ("full centered", None), ("full non-centered", None)]
                if sampler == "pymc":
                    cases.insert(1, ("marginal, cold start", False))
                for label, warm in cases:
                    if warm is None:
                        model = full_model(name, y, group, G, centered=label == "full centered")
                    else:
                        model = pmo.marginalize_laplace(
                            full_model(name, y, group, G, centered=True), "u", warm_start=warm
                        )
                    if sampler == "pymc":
                        r = run_pymc(model, draws, tune, chains, count=warm is not None)
                    else:
                        r = run_nutpie(model, draws, tune, chains)
                    rows[sampler, label] = r
                    it = f"{r['iterations']:.2f}" if "iterations" in r else ""
                    if "evaluations" in r:
                        it += f" ({r['evaluations']:.2f} evals)"
                    print(
                        f"| {sampler} | {label} | {r['ess']:.0f} | {r['seconds']:.2f} |"
                        f" {r['ess'] / r['seconds']:.1f} | {r['steps']} |"
                        f" {r['seconds'] / r['steps'] * 1e6:.1f} | {it} |",
                        flush=True,
                    )
            for sampler in args.samplers:
                full = max(
                    (rows[sampler, k] for k in ("full centered", "full non-centered")),
                    key=lambda r: r["ess"] / r["seconds"],
                )
                marg = rows[sampler, "marginal"]
                ratio = (marg["ess"] / marg["seconds"]) / (full["ess"] / full["seconds"])
                grad_ratio = (marg["seconds"] / marg["steps"]) / (full["seconds"] / full["steps"])
                agree = ", ".join(f"{v}: {agreement(marg, full, v)}" for v in marg["mean"])
                target = TARGETS.get((name, G))
                verdict = "" if target is None else (" PASS" if ratio >= target else " FAIL")
                line = (
                    f"{name}, G = {G}, {sampler}: marginal / best full ESS/s = {ratio:.2f}x"
                    f" (target {target}x){verdict}; per-gradient cost ratio {grad_ratio:.1f}x;"
                    f" posterior vs full: {agree}"
                )
                if sampler == "pymc":
                    cold = rows[sampler, "marginal, cold start"]
                    warm_cold = (marg["ess"] / marg["seconds"]) / (cold["ess"] / cold["seconds"])
                    line += f"; warm/cold ESS/s {warm_cold:.2f}x"
                summary.append(line)
                print("\n" + line, flush=True)
    print("\n## Summary\n")
    for line in summary:
        print("- " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
