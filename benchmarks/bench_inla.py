"""fit_inla vs NUTS: wall time to the posterior of the hyperparameters, and its error.

Run ``python benchmarks/bench_inla.py`` (about 15 minutes on 2 shared cores) or ``--quick``
(Seeds only, short reference; the numbers are then rough). A script, not a test: it prints one
markdown table and the target lines, and exits 0 whatever the timings.

Problems
--------
* Poisson random intercepts, G = 300 groups of 5 counts (mu = 0.5, sigma = 0.7):
  mu ~ N(0, 2), sigma ~ HalfNormal(1), u_g ~ N(mu, sigma), y_gj ~ Poisson(exp(u_g)).
  θ = (mu, sigma), latent u.
* Seeds (notebooks/data/seeds): logistic regression with plate effects, θ = τ, latent
  (α₀, α₁, α₂, α₁₂, b), priors of Fong, Rue & Wakefield (2010).

Contenders (same model, same data)
----------------------------------
* ``fit_inla``: ``pmo.fit_inla(model, latent)`` (integration "auto" = grid here), wall time of
  the whole call: marginalize_laplace, compile, mode, Hessian, grid, 1,000 joint draws with the
  latent (recover_latent).
* NUTS on the marginal: ``pmo.marginalize_laplace`` + ``pm.sample`` (4 chains x 1,000 draws,
  1,000 tune, cores=1), wall time including marginalization and compilation.
* NUTS on the full model (non-centered), ``pm.sample`` with the same settings.

The reference is a long NUTS run on the full non-centered model (4 x 4,000 draws, target_accept
0.95); errors are |mean − reference mean| and |sd − reference sd| in units of the reference sd.
For fit_inla the mean and sd are the integration's (``idata.inla``), not those of the draws.
All contenders run after a warm-up fit of the same sizes, so PyTensor's compilation cache is
equally warm for everyone (a first-ever run adds C compilation to every column).

Last run (2026-12-01, 2 cores shared with ~6 other jobs, load average ~11; Poisson only), after
the warm-started solves and the single compiled target (commit "recover_latent and fit_inla: one
warm-started solve per draw"):

| problem | method | wall time (s) | time / fit_inla's | max mean error (sd) | max sd error (sd) |
|---|---|---|---|---|---|
| Poisson G=300 | fit_inla (grid) | 14.4 | 1.0x | 0.101 | 0.020 |
| Poisson G=300 | NUTS, marginal | 227.5 | 15.8x | 0.093 | 0.035 |
| Poisson G=300 | NUTS, full (non-centered) | 64.3 | 4.5x | 0.025 | 0.011 |

Seeds (``--quick``: reference 4 x 1,000 full NUTS draws, so its errors are rough; same day,
load ~11):

| problem | method | wall time (s) | time / fit_inla's | max mean error (sd) | max sd error (sd) |
|---|---|---|---|---|---|
| Seeds | fit_inla (grid) | 67.8 | 1.0x | 0.044 | 0.115 |
| Seeds | NUTS, marginal | 320.2 | 4.7x | 0.017 | 0.074 |
| Seeds | NUTS, full (non-centered) | 48.2 | 0.7x | 0.079 | 0.199 |

On Seeds (25 dense latents) compilation dominates fit_inla: under load, ~17 s for the structure
probe, ~50 s for the target and ~17 s for the inner Newton system, whose dense Hessians are
vectorized reverse passes that PyTensor's rewriter is slow on.

The run before (same load): fit_inla 64.0 s, 2.6x faster than NUTS on the marginal and 0.5x
full NUTS. fit_inla and NUTS on the marginal share the same mean error (~0.1 sd of mu or sigma):
it is the Laplace approximation's, not the integration's. What is left of fit_inla's time is
mostly compilation: a profile under the same load gives ~60 % to compiling the one target
function (log p(θ, y), its gradient, the inner mode and H) and its inner Newton functions; the
~1,400 evaluations (mode search, grid, 1,000 latent draws) take 3.3 Newton systems each with the
warm start (9 from the initial point before).

Targets (issue 16): fit_inla ≥ 20x faster than full NUTS and ≥ 5x faster than NUTS on the
marginal at G = 300, with means within 0.1 posterior sd of the reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

import pymc_optim as pmo  # noqa: E402

F64 = np.float64
SEEDS = Path(__file__).parents[1] / "notebooks" / "data" / "seeds" / "Seeds.txt"


def poisson(n_groups: int, centered: bool, seed: int = 300) -> pm.Model:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), 5)
    counts = rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, n_groups))[group])
    with pm.Model(coords={"group": np.arange(n_groups)}) as model:
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        if centered:
            u = pm.Normal("u", mu, sigma, dims="group")
        else:
            raw = pm.Normal("u_raw", F64(0.0), F64(1.0), dims="group")
            u = pm.Deterministic("u", mu + sigma * raw, dims="group")
        pm.Poisson("y", pm.math.exp(u[group]), observed=counts)
    return model


def seeds(centered: bool) -> pm.Model:
    data = np.loadtxt(SEEDS, skiprows=1)
    r, n, x1, x2 = data[:, 0], data[:, 1], data[:, 2], data[:, 3]
    with pm.Model(coords={"plate": np.arange(len(r))}) as model:
        tau = pm.Gamma("tau", alpha=F64(0.5), beta=F64(0.0164))
        alphas = [
            pm.Normal(name, F64(0.0), F64(sd))
            for name, sd in [
                ("alpha0", 1000.0),
                ("alpha1", np.sqrt(1000.0)),
                ("alpha2", np.sqrt(1000.0)),
                ("alpha12", np.sqrt(1000.0)),
            ]
        ]
        if centered:
            b = pm.Normal("b", F64(0.0), 1 / pm.math.sqrt(tau), dims="plate")
        else:
            raw = pm.Normal("b_raw", F64(0.0), F64(1.0), dims="plate")
            b = pm.Deterministic("b", raw / pm.math.sqrt(tau), dims="plate")
        eta = alphas[0] + alphas[1] * x1 + alphas[2] * x2 + alphas[3] * x1 * x2 + b
        pm.Binomial("r", n=n.astype(int), logit_p=eta, observed=r.astype(int))
    return model


def nuts(model, draws, seed, **kwargs):
    with model:
        return pm.sample(
            draws=draws,
            tune=1000,
            chains=4,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
            **kwargs,
        )


def moments(idata, names):
    return {n: (float(idata.posterior[n].mean()), float(idata.posterior[n].std())) for n in names}


def run(problem: str, make, latent, names, reference_draws: int):
    rows = []
    t = time.perf_counter()
    reference = moments(nuts(make(False), reference_draws, 99, target_accept=0.95), names)
    print(f"[{problem}] reference run {time.perf_counter() - t:.0f} s", file=sys.stderr)

    pmo.fit_inla(make(True), latent, draws=10, progressbar=False)  # warm the compile cache
    t = time.perf_counter()
    idata = pmo.fit_inla(make(True), latent, random_seed=1, progressbar=False)
    elapsed = time.perf_counter() - t
    inla = idata.inla
    ours = {
        n: (float(inla["mean"].sel(hyperparameter=n)), float(inla["sd"].sel(hyperparameter=n)))
        for n in names
    }
    rows.append(("fit_inla (" + inla.attrs["integration"] + ")", elapsed, ours))

    t = time.perf_counter()
    marginal = pmo.marginalize_laplace(make(True), latent)
    rows.append(("NUTS, marginal", None, moments(nuts(marginal, 1000, 2), names)))
    rows[-1] = (rows[-1][0], time.perf_counter() - t, rows[-1][2])

    t = time.perf_counter()
    full = moments(nuts(make(False), 1000, 3), names)
    rows.append(("NUTS, full (non-centered)", time.perf_counter() - t, full))
    return [(problem, *row, reference) for row in rows]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--problems", default="seeds,poisson", help="comma-separated subset of seeds,poisson"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    reference_draws = 1000 if args.quick else 4000
    wanted = args.problems.split(",")
    problems = []
    if "seeds" in wanted:
        problems.append(("Seeds", seeds, ["alpha0", "alpha1", "alpha2", "alpha12", "b"], ["tau"]))
    if "poisson" in wanted and not args.quick:
        problems.append(
            ("Poisson G=300", lambda centered: poisson(300, centered), "u", ["mu", "sigma"])
        )
    print(
        "| problem | method | wall time (s) | time / fit_inla's | max mean error (sd) "
        "| max sd error (sd) |"
    )
    print("|---|---|---|---|---|---|")
    summary = []
    for problem, make, latent, names in problems:
        rows = run(problem, make, latent, names, reference_draws)
        times = {method: elapsed for _, method, elapsed, _, _ in rows}
        inla_time = rows[0][2]
        for _, method, elapsed, ours, reference in rows:
            mean_error = max(abs(ours[n][0] - reference[n][0]) / reference[n][1] for n in ours)
            sd_error = max(abs(ours[n][1] - reference[n][1]) / reference[n][1] for n in ours)
            print(
                f"| {problem} | {method} | {elapsed:.1f} | {elapsed / inla_time:.1f}x "
                f"| {mean_error:.3f} | {sd_error:.3f} |",
                flush=True,
            )
        full, marginal = times["NUTS, full (non-centered)"], times["NUTS, marginal"]
        summary.append(
            f"{problem}: fit_inla {full / inla_time:.1f}x faster than full NUTS (target ≥ 20x), "
            f"{marginal / inla_time:.1f}x faster than NUTS on the marginal (target ≥ 5x)"
        )
    print("\n".join(summary))


if __name__ == "__main__":
    main()
