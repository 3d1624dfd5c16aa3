"""RW2 trend on a long series (issue 15, item 8): Laplace marginal + NUTS against full NUTS.

Run ``python benchmarks/bench_rw2_trend.py [--n 1000] [--draws 500]``. A simulated series of N
values y_t = b + slope·t + x_t + ε_t, x an RW2 (second differences N(0, σ²)), ε ~ N(0, s²). The
model anchors the walk (``RW(order=2)``: x_0 = x_1 = 0, with b and the slope in the model), so
the Laplace Hessian in the N − 2 free values is banded and ``marginalize_laplace`` takes the
sparse path; NUTS then samples (b, slope, σ, s) and ``recover_latent`` draws the trend. The full
model samples all N + 2 values. Printed: both wall times (same run), their ratio, and for σ, s
and the trend the standardised differences of posterior means, z = Δ / √(mcse_L² + mcse_full²)
(about N(0, 1) where the Laplace marginal is exact, as it is here: the likelihood is Gaussian).
A script, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse

import arviz as az
import numpy as np
import pymc as pm
from _timing import timed

import pymc_optim as pmo
from pymc_optim.distributions.gmrf import RW


def rw2_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.linspace(-0.5, 0.5, n)
    walk = np.cumsum(np.cumsum(0.05 * rng.standard_normal(n)))
    walk = walk - walk[0] - (walk[1] - walk[0]) * np.arange(n)  # anchored: x_0 = x_1 = 0
    return t, 1.0 + 2.0 * t + walk + 0.3 * rng.standard_normal(n)


def rw2_model(t, y) -> pm.Model:
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0)
        slope = pm.Normal("slope", 0.0, 50.0)
        sigma = pm.HalfNormal("sigma", 0.2)
        noise = pm.HalfNormal("noise", 1.0)
        x = RW("x", n=y.size, order=2, sigma=sigma)
        pm.Normal("y", b + slope * t + x, noise, observed=y)
    return model


def z_scores(a, b, name):
    mean_a, mean_b = (
        a.posterior[name].mean(("chain", "draw")),
        b.posterior[name].mean(("chain", "draw")),
    )
    se = np.hypot(az.mcse(a, var_names=[name])[name], az.mcse(b, var_names=[name])[name])
    return np.asarray((mean_a - mean_b) / se)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=500)
    args = parser.parse_args()
    t, y = rw2_data(args.n)
    model = rw2_model(t, y)
    settings = {"draws": args.draws, "tune": args.draws, "chains": 2, "cores": 1}

    def laplace():
        marginal = pmo.marginalize_laplace(model, "x")
        with marginal:
            idata = pm.sample(**settings, random_seed=1, progressbar=False)
        return pmo.recover_latent(marginal, idata, random_seed=2, progressbar=False), marginal

    (idata_laplace, marginal), time_laplace = timed(laplace)

    def full():
        with model:
            return pm.sample(**settings, random_seed=1, progressbar=False)

    idata_full, time_full = timed(full)
    structure = pmo.laplace_info(marginal).structure
    print(f"N = {args.n}, 2 chains x {args.draws} draws after {args.draws} tuning; {structure!r}")
    print(
        f"Laplace + NUTS + recover_latent: {time_laplace:.1f} s; full NUTS: {time_full:.1f} s; "
        f"full / Laplace = {time_full / time_laplace:.2f}"
    )
    print(
        "full NUTS mean tree depth:",
        float(idata_full.sample_stats["tree_depth"].mean()),
        "divergences:",
        int(idata_full.sample_stats["diverging"].sum()),
        int(idata_laplace.sample_stats["diverging"].sum()),
    )
    for name in ("sigma", "noise", "b", "slope"):
        print(
            f"{name:>6}: Laplace {float(idata_laplace.posterior[name].mean()):.5f}, full "
            f"{float(idata_full.posterior[name].mean()):.5f}, "
            f"z = {float(z_scores(idata_laplace, idata_full, name)):+.2f}"
        )
    z = z_scores(idata_laplace, idata_full, "x")[2:]
    print(
        f"trend x_t (t >= 2): max |z| = {np.abs(z).max():.2f} over {z.size}, rms z = "
        f"{np.sqrt(np.mean(z**2)):.2f}"
    )


if __name__ == "__main__":
    main()
