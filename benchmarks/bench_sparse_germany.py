"""Germany oral cancer, BYM2 (544 districts): Laplace marginal + NUTS against full NUTS (issue 15).

Run ``python benchmarks/bench_sparse_germany.py`` to fit the Laplace marginal (φ and θ, 1,087
latent values, integrated out; NUTS on μ, σ, ρ), draw the latents with ``recover_latent``, and
compare with the stored full-model NUTS reference, printing both times and the standardised
differences. ``--reference`` reruns the long full-model NUTS and rewrites the stored reference
(``pymc_optim/datasets/germany/data/reference_nuts.json``). A script, not a test: it prints what
it measures and exits 0 (``tests/datasets/test_germany.py`` holds the asserted comparison).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm

import pymc_optim as pmo
from pymc_optim.datasets import germany_bym2_model, load_germany_reference

sys.path.insert(0, str(Path(__file__).parent))
from _reference import long_nuts_reference, posterior_summaries  # noqa: E402

REFERENCE = Path(pmo.__file__).parent / "datasets" / "germany" / "data" / "reference_nuts.json"
#: Compared quantities: σ, ρ and the mean log relative risk (μ itself means different things
#: under the two constraints; see germany_bym2_model).
HYPERPARAMETERS = ("mean_log_risk", "sigma", "rho")
#: The long run: 4 chains (on the machine's 2 cores), 2,000 tuning and 12,500 kept draws each:
#: district 0 (one neighbour) mixes slowly (ESS ≈ 100 per 50,000 draws), the rest fast.
REFERENCE_SETTINGS = {"chains": 4, "tune": 2000, "draws": 12500, "random_seed": 20261207}
#: The Laplace run (what the slow test repeats): 2 chains of 300 after 300 tuning (its z-scores
#: use its own Monte Carlo errors, so fewer draws widen the test, never bias it).
LAPLACE_SETTINGS = {"chains": 2, "tune": 300, "draws": 300, "random_seed": 7}


def summaries(idata) -> dict:
    """Posterior mean, sd and the mean's Monte Carlo standard error of the hyperparameters and
    of every district's relative risk."""
    return posterior_summaries(idata, (*HYPERPARAMETERS, "relative_risk"))


def run_reference() -> None:
    # the sum-to-zero ICAR: μ identified, so full NUTS mixes (the corner form's μ–field shift
    # gave R-hat 1.24 on μ in 4 × 2,500 draws)
    result = long_nuts_reference(
        germany_bym2_model(constraint="sum_to_zero"),
        REFERENCE_SETTINGS,
        (*HYPERPARAMETERS, "relative_risk"),
        "germany_bym2_model(constraint='sum_to_zero')",
    )
    REFERENCE.write_text(json.dumps(result))


def run_laplace() -> dict:
    model = germany_bym2_model()
    t0 = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, ["phi", "theta"])
    build = time.perf_counter() - t0
    structure = pmo.laplace_info(marginal).structure
    t0 = time.perf_counter()
    with marginal:
        idata = pm.sample(**LAPLACE_SETTINGS, cores=1, progressbar=False)
    sampling = time.perf_counter() - t0
    t0 = time.perf_counter()
    idata = pmo.recover_latent(marginal, idata, random_seed=3, progressbar=False)
    recovery = time.perf_counter() - t0
    return {
        "structure": structure,
        "build": build,
        "sampling": sampling,
        "recovery": recovery,
        "summaries": summaries(idata),
        "diverging": int(idata.sample_stats["diverging"].sum()),
    }


def z_scores(laplace: dict, reference: dict, name: str) -> np.ndarray:
    """(mean_Laplace − mean_reference) / √(mcse_Laplace² + mcse_reference²)."""
    a, b = laplace[name], reference[name]
    spread = np.hypot(np.asarray(a["mcse"]), np.asarray(b["mcse"]))
    return (np.asarray(a["mean"]) - np.asarray(b["mean"])) / spread


def main() -> None:
    if "--reference" in sys.argv:
        run_reference()
        return
    reference = load_germany_reference()
    result = run_laplace()
    print(
        f"structure: {type(result['structure']).__name__} (n_colors "
        f"{getattr(result['structure'], 'n_colors', '-')})"
    )
    print(
        f"Laplace + NUTS: build {result['build']:.1f} s, sampling {result['sampling']:.0f} s "
        f"({LAPLACE_SETTINGS['chains']}×{LAPLACE_SETTINGS['draws']}), recover_latent "
        f"{result['recovery']:.0f} s, {result['diverging']} divergences"
    )
    print(f"full NUTS (stored reference run): {reference['seconds']:.0f} s")
    print("| quantity | Laplace mean | full NUTS mean | z |")
    print("|---|---|---|---|")
    for name in HYPERPARAMETERS:
        z = float(z_scores(result["summaries"], reference["summaries"], name))
        print(
            f"| {name} | {result['summaries'][name]['mean']:.4f} | "
            f"{reference['summaries'][name]['mean']:.4f} | {z:+.2f} |"
        )
    z = z_scores(result["summaries"], reference["summaries"], "relative_risk")
    summary = f"max |z| {np.abs(z).max():.2f}, mean z² {np.mean(z**2):.2f}"
    print(f"| relative risks (544) | | | {summary} |")


if __name__ == "__main__":
    main()
