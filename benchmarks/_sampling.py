"""Sampler runs shared by the ESS/s benchmarks: PyMC's NUTS and nutpie, one core, counted steps."""

from __future__ import annotations

import time
import warnings


def _total_steps(idata) -> int:
    """Leapfrog steps of the run, tuning included."""
    return int(idata.sample_stats["n_steps"].sum() + idata.warmup_sample_stats["n_steps"].sum())


def sample_pymc(model, draws: int, tune: int, chains: int, seed: int, *, quiet: bool = False):
    """PyMC NUTS on one core (warnings silenced if `quiet`); (posterior, sampling seconds,
    steps)."""
    import pymc as pm

    with model, warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        idata = pm.sample(
            draws,
            tune=tune,
            chains=chains,
            cores=1,
            random_seed=seed,
            nuts_sampler="pymc",  # PyMC 6 picks nutpie by default when it is installed
            progressbar=False,
            compute_convergence_checks=False,
            discard_tuned_samples=False,
        )
    return idata.posterior, idata.sample_stats.attrs["sampling_time"], _total_steps(idata)


def sample_nutpie(model, draws: int, tune: int, chains: int, seed: int, *, quiet: bool = False):
    """nutpie on one core, compiled outside the clock (its warnings silenced if `quiet`);
    (posterior, sampling seconds, steps)."""
    import nutpie

    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        compiled = nutpie.compile_pymc_model(model)
    t0 = time.perf_counter()
    idata = nutpie.sample(
        compiled,
        draws=draws,
        tune=tune,
        chains=chains,
        cores=1,
        seed=seed,
        progress_bar=False,
        save_warmup=True,
    )
    return idata.posterior, time.perf_counter() - t0, _total_steps(idata)
