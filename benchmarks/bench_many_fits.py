"""Many fits of one model, compiled once: fit_inla_many in this process and on a Dask cluster.

Run ``python benchmarks/bench_many_fits.py`` (about 15 minutes on 2 shared cores) or
``--fits 10`` for a rough run. A script, not a test: it prints one markdown table and the target
line, and exits 0 whatever the timings.

Problem: the Poisson random intercepts model of ``bench_inla.py`` at G = 300 groups of 5 counts,
its counts a ``pm.Data`` variable; `--fits` data sets (100) drawn from it at mu = 0.5,
sigma = 0.7, one seed each. Every fit is ``fit_inla``'s default (grid, 1,000 draws).

Contenders
----------
* (w) warm fits: a fitter compiled and warmed up by one fit beforehand, then the fits of all
  data sets one after the other: the evaluation time alone, the floor of any refit loop.
* (a) ``pmo.fit_inla_many(model, "u", datasets)`` in this process: one call, its compilation
  included (with PyTensor's and numba's on-disk caches warm, as after any earlier run).
  Run first, so that no compilation of the process's own is warm yet.
* (c) the same call with ``client=`` a ``LocalCluster(n_workers=2, threads_per_worker=1)``:
  the fitter pickled once and unpickled on each worker, the data sets mapped over the two
  workers. The cluster's start (process spawn, imports) is timed apart.
* (s) separate ``fit_inla`` calls, each on a model built for its data set (what a loop
  without fit_inla_many does): one such call timed twice, times the number of fits.

Target (issue 38 item 5): (a) ≤ 1.2x (w).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
from _timing import git_revision  # noqa: E402

import pymc_optim as pmo  # noqa: E402
from pymc_optim.model.inla_many import (  # noqa: E402
    _checked_datasets,
    _data_variables,
    _fit_options,
    _InlaFitter,
)

F64 = np.float64


def counts(n_groups: int, seed: int) -> np.ndarray:
    """Counts of the Poisson random intercepts model at mu = 0.5, sigma = 0.7 (bench_inla's)."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), 5)
    return rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, n_groups))[group])


def poisson(y: np.ndarray, n_groups: int) -> pm.Model:
    """mu ~ N(0, 2), sigma ~ HalfNormal(1), u_g ~ N(mu, sigma), y_gj ~ Poisson(exp(u_g)), with
    the counts `y` a pm.Data variable."""
    group = np.repeat(np.arange(n_groups), 5)
    with pm.Model(coords={"group": np.arange(n_groups)}) as model:
        y_data = pm.Data("y_data", y)
        mu = pm.Normal("mu", F64(0.0), F64(2.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, dims="group")
        pm.Poisson("y", pm.math.exp(u[group]), observed=y_data)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=100)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    n, g = args.fits, args.groups
    datasets = [{"y_data": counts(g, seed)} for seed in range(1, n + 1)]
    seeds = list(range(n))
    model = poisson(datasets[0]["y_data"], g)
    rows = []
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fits' own warnings are in their attrs
        t = time.perf_counter()
        many = pmo.fit_inla_many(model, "u", datasets, random_seed=seeds, progressbar=False)
        api = time.perf_counter() - t
        log(f"(a) {api:.1f} s")

        t = time.perf_counter()
        data = _data_variables(model)
        fitter = _InlaFitter(model, "u", data, _fit_options(), {})
        build = time.perf_counter() - t
        checked = _checked_datasets(datasets, data)  # cast to the model's dtypes
        fitter.fit(checked[0], seeds[0])  # warm-up
        per_fit, check = [], []
        for dataset, seed in zip(checked, seeds, strict=True):
            t = time.perf_counter()
            idata = fitter.fit(dataset, seed)
            per_fit.append(time.perf_counter() - t)
            check.append(idata.inla.attrs.get("laplace_error_seconds", 0.0))
        warm = sum(per_fit)
        log(f"(w) {warm:.1f} s (build {build:.1f} s)")

        cluster_row = None
        if not args.no_cluster:
            from distributed import Client, LocalCluster

            t = time.perf_counter()
            with (
                LocalCluster(
                    n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
                ) as cluster,
                Client(cluster) as client,
            ):
                start = time.perf_counter() - t
                t = time.perf_counter()
                remote = pmo.fit_inla_many(
                    model, "u", datasets, client=client, random_seed=seeds, progressbar=False
                )
                on_cluster = time.perf_counter() - t
            same = max(
                float(np.abs(a.posterior[name].values - b.posterior[name].values).max())
                for a, b in zip(many, remote, strict=True)
                for name in ("mu", "sigma", "u")
            )
            cluster_row = (start, on_cluster, same)
            log(f"(c) {on_cluster:.1f} s (cluster start {start:.1f} s, largest gap {same:.1g})")

        separate = []
        for k in range(2):
            t = time.perf_counter()
            pmo.fit_inla(
                poisson(datasets[k]["y_data"], g), "u", random_seed=seeds[k], progressbar=False
            )
            separate.append(time.perf_counter() - t)
        log(f"(s) {separate}")

    failures = sum(isinstance(r, pmo.FitFailure) for r in many)
    print(f"bench_many_fits at {git_revision(__file__)}: G = {g}, {n} data sets")
    print(f"(fitter build: {build:.1f} s; warm fit: median {np.median(per_fit):.2f} s, ", end="")
    print(
        f"range {min(per_fit):.2f}–{max(per_fit):.2f} s, of which the Laplace-error check ", end=""
    )
    print(f"(compiled at each fit) median {np.median(check):.2f} s; failed fits: {failures})")
    print()
    print("| contender | wall time (s) | per fit (s) | time / (w) |")
    print("|---|---|---|---|")
    rows.append(("(w) warm fits on a compiled fitter", warm))
    rows.append(("(a) fit_inla_many, in process (compile included)", api))
    if cluster_row is not None:
        start, on_cluster, same = cluster_row
        rows.append(("(c) fit_inla_many, LocalCluster of 2 workers", on_cluster))
    rows.append((f"(s) separate fit_inla calls (2 timed, x{n / 2:g})", n * np.mean(separate)))
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {seconds / n:.2f} | {seconds / warm:.2f}x |")
    if cluster_row is not None:
        print(
            f"\n(c): the cluster's start took {start:.1f} s more; its draws and (a)'s differ by "
            f"at most {same:.1g}."
        )
    verdict = "PASS" if api <= 1.2 * warm else "FAIL"
    print(f"\nTarget: (a) ≤ 1.2x (w): {api / warm:.2f}x, {verdict}")


if __name__ == "__main__":
    main()
