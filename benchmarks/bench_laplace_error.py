"""The Laplace error in θ: fit_inla's bias on Poisson random intercepts, measured and corrected.

Run ``python benchmarks/bench_laplace_error.py`` (a few minutes on 2 shared cores, most of it the
importance-sampling column); it prints one markdown table and exits 0 whatever the numbers.

Problem: Poisson random intercepts, G = 300 and 3,000 groups of 5 counts (``bench_inla.poisson``,
data seed 300): mu ~ N(0, 2), sigma ~ HalfNormal(1), u_g ~ N(mu, sigma), y ~ Poisson(exp(u_g)).

Reference: a long full-NUTS run on the non-centered model, stored with how it was produced in
``laplace_error_reference_G{G}.json`` (``--reference G`` reruns it: 4 chains x 5,000 draws,
1,000 tune, target_accept 0.95, nutpie through ``pm.sample``, cores=1). Errors and shifts are
in units of the reference's posterior sd.

Columns: fit_inla's error (the Laplace marginal, integrated on its grid); the shift its default
check estimates (``idata.inla.laplace_mean_shift_sd``, δ by quadrature); the error of
``fit_inla(..., laplace_correction=True)``; the shift ``pmo.laplace_error(marginal, idata,
method="importance")`` estimates from fit_inla's draws, with its largest Pareto k̂; whether
fit_inla warned; fit_inla's wall time (warm caches), the check's, and their ratio. The last
run's table is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import date
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
from _timing import git_revision  # noqa: E402
from bench_inla import poisson  # noqa: E402

import pymc_optim as pmo  # noqa: E402

HERE = Path(__file__).parent
NAMES = ("mu", "sigma")


def reference_path(n_groups: int) -> Path:
    return HERE / f"laplace_error_reference_G{n_groups}.json"


def run_reference(n_groups: int, draws: int, tune: int, seed: int = 99) -> dict:
    """A long full-NUTS run on the non-centered model (PyMC's sampler), summarized and stored."""
    import nutpie

    model = poisson(n_groups, centered=False)
    t = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=draws,
            tune=tune,
            chains=4,
            cores=1,
            target_accept=0.95,
            nuts_sampler="nutpie",
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    elapsed = time.perf_counter() - t
    summary = {}
    for name in NAMES:
        values = idata.posterior[name]
        summary[name] = {
            "mean": float(values.mean()),
            "sd": float(values.std()),
            "mcse_mean": float(az.mcse(idata, var_names=[name])[name]),
            "ess_bulk": float(az.ess(idata, var_names=[name])[name]),
            "rhat": float(az.rhat(idata, var_names=[name])[name]),
        }
    divergences = int(idata.sample_stats["diverging"].sum())
    record = {
        "problem": f"Poisson random intercepts, G = {n_groups}, 5 counts per group "
        "(benchmarks/bench_inla.py: poisson(G, centered=False), data seed 300)",
        "how": f"pm.sample on the full non-centered model: 4 chains x {draws} draws, {tune} tune, "
        f"target_accept 0.95, cores=1, random_seed {seed}, nuts_sampler='nutpie' (nutpie "
        f"{nutpie.__version__})",
        "produced_by": f"python benchmarks/bench_laplace_error.py --reference {n_groups}",
        "commit": git_revision(pmo.__file__),
        "date": date.today().isoformat(),
        "versions": {"pymc": pm.__version__, "python": sys.version.split()[0]},
        "wall_time_s": round(elapsed, 1),
        "divergences": divergences,
        "posterior": summary,
    }
    reference_path(n_groups).write_text(json.dumps(record, indent=2) + "\n")
    return record


def run(n_groups: int, draws: int) -> list[dict]:
    """fit_inla without and with the correction, and laplace_error by importance sampling on
    fit_inla's draws, against the stored reference; one row per hyperparameter."""
    reference = json.loads(reference_path(n_groups).read_text())["posterior"]
    pmo.fit_inla(poisson(30, True), "u", draws=10, progressbar=False)  # warm-up (caches)
    fits = {}
    for corrected in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pmo.PymcOptimWarning)
            t = time.perf_counter()
            idata = pmo.fit_inla(
                poisson(n_groups, True),
                "u",
                random_seed=1,
                progressbar=False,
                laplace_correction=corrected,
            )
            elapsed = time.perf_counter() - t
        warned = [str(w.message) for w in caught if issubclass(w.category, pmo.PymcOptimWarning)]
        fits[corrected] = (idata, elapsed, warned)
    idata, elapsed, warned = fits[False]
    marginal = pmo.marginalize_laplace(poisson(n_groups, True), "u")
    importance = pmo.laplace_error(marginal, idata, method="importance", draws=draws, random_seed=2)
    quadrature = pmo.laplace_error(marginal, idata, method="quadrature")
    rows = []
    inla = idata.inla
    corrected_inla = fits[True][0].inla
    for j, name in enumerate(NAMES):
        ref = reference[name]
        mean = float(inla["mean"].sel(hyperparameter=name))
        corrected = float(corrected_inla["mean"].sel(hyperparameter=name))
        rows.append(
            {
                "G": n_groups,
                "name": name,
                "reference": f"{ref['mean']:.4f} ± {ref['sd']:.4f}",
                "mcse_sd": ref["mcse_mean"] / ref["sd"],
                "error_sd": (mean - ref["mean"]) / ref["sd"],
                "shift_sd": float(inla["laplace_mean_shift_sd"].sel(hyperparameter=name)),
                "corrected_error_sd": (corrected - ref["mean"]) / ref["sd"],
                "after_shift_sd": float(quadrature.mean_shift_sd[j]),
                "importance_shift_sd": float(importance.mean_shift_sd[j]),
                "importance_k": float(np.nanmax(importance.pareto_k)),
                "warned": bool(warned),
                "fit_s": elapsed,
                "check_s": float(inla.attrs["laplace_error_seconds"]),
                "fraction": float(inla.attrs["laplace_error_time_fraction"]),
                "corrected_fit_s": fits[True][1],
                "importance_s": importance.seconds,
                "quadrature_s": quadrature.seconds,
            }
        )
    print(f"[G={n_groups}] warnings: {warned}", file=sys.stderr)
    print(
        f"[G={n_groups}] δ by quadrature at the design: "
        f"{np.round(inla['laplace_correction'].values, 4)}; "
        f"by importance sampling ({draws} draws) on fit_inla's draws: "
        f"{np.round(importance.correction, 3)} (quadrature there: "
        f"{np.round(quadrature.correction, 4)}), k̂ {np.round(importance.pareto_k, 2)}",
        file=sys.stderr,
    )
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--reference",
        type=int,
        default=None,
        help="run and store the long full-NUTS reference for this G, then exit",
    )
    parser.add_argument("--draws", type=int, default=5000, help="reference draws per chain")
    parser.add_argument("--tune", type=int, default=1000, help="reference tuning steps")
    parser.add_argument("--groups", default="300,3000", help="comma-separated G")
    parser.add_argument(
        "--importance-draws", type=int, default=200, help="latent draws per θ (importance)"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.reference is not None:
        record = run_reference(args.reference, args.draws, args.tune)
        print(json.dumps(record, indent=2))
        return
    rows = []
    for n_groups in [int(g) for g in args.groups.split(",")]:
        rows += run(n_groups, args.importance_draws)
    print(f"commit {git_revision(pmo.__file__)}, {date.today().isoformat()}\n")
    print(
        "| G | θ | reference mean ± sd | fit_inla error (sd) | estimated shift (sd) | "
        "corrected error (sd) | shift by IS (sd) | IS max k̂ | warned | fit_inla (s) | "
        "check (s) | check / fit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['G']} | {r['name']} | {r['reference']} | {r['error_sd']:+.3f} | "
            f"{r['shift_sd']:+.3f} | {r['corrected_error_sd']:+.3f} | "
            f"{r['importance_shift_sd']:+.3f} | {r['importance_k']:.2f} | "
            f"{'yes' if r['warned'] else 'no'} | {r['fit_s']:.1f} | {r['check_s']:.2f} | "
            f"{100 * r['fraction']:.1f} % |"
        )
    print()
    for r in rows:
        print(
            f"G={r['G']} {r['name']}: reference MCSE {r['mcse_sd']:.3f} sd; laplace_error on "
            f"fit_inla's draws: quadrature {r['after_shift_sd']:+.3f} sd "
            f"({r['quadrature_s']:.1f} s), importance {r['importance_shift_sd']:+.3f} sd "
            f"({r['importance_s']:.1f} s); corrected fit_inla {r['corrected_fit_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
