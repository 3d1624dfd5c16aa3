"""Long full-model NUTS references shared by the benchmarks that store one (Germany, Epil)."""

from __future__ import annotations

import time

import arviz as az
import numpy as np
import pymc as pm


def posterior_summaries(idata, names) -> dict:
    """Posterior mean, sd and the mean's Monte Carlo standard error of each of `names`."""
    out = {}
    for name in names:
        values = idata.posterior[name]
        out[name] = {
            "mean": np.asarray(values.mean(("chain", "draw"))).tolist(),
            "sd": np.asarray(values.std(("chain", "draw"))).tolist(),
            "mcse": np.asarray(az.mcse(idata, var_names=[name])[name]).tolist(),
        }
    return out


def long_nuts_reference(model, settings: dict, names, label: str) -> dict:
    """Sample `model` with `pm.sample(**settings)` (2 cores, target_accept 0.9) and return the
    stored reference: its settings and sampler, time, divergences, the largest R-hat of `names`
    and their `posterior_summaries`."""
    t0 = time.perf_counter()
    with model:
        idata = pm.sample(**settings, cores=2, progressbar=False, target_accept=0.9)
    seconds = time.perf_counter() - t0
    diverging = int(idata.sample_stats["diverging"].sum())
    rhats = az.rhat(idata, var_names=list(names))  # ArviZ 1: a DataTree, no to_array()
    rhat = max(float(rhats[name].max()) for name in names)
    print(f"full NUTS: {seconds:.0f} s, {diverging} divergences, max R-hat {rhat:.4f}")
    return {
        "settings": {
            **settings,
            "target_accept": 0.9,
            "sampler": f"pm.sample NUTS ({idata.posterior.attrs.get('inference_library', 'pymc')})",
        },
        "seconds": seconds,
        "diverging": diverging,
        "max_rhat": rhat,
        "model": label,
        "summaries": posterior_summaries(idata, names),
    }
