"""RW2 trend on a long series (issue 15, item 8): Laplace marginal + NUTS against full NUTS.

Run ``python benchmarks/bench_rw2_trend.py [--n 1000] [--draws 500]``. A simulated series of N
values y_t = b + slope·t + x_t + ε_t, x an RW2 (second differences N(0, σ²)), ε ~ N(0, s²). The
model anchors the walk (``RW(order=2)``: x_0 = x_1 = 0, with b and the slope in the model), so
the Laplace Hessian in the N − 2 free values is banded and ``marginalize_laplace`` takes the
sparse path; NUTS then samples (b, slope, σ, s) and ``recover_latent`` draws the trend. The
reference samples the full model (all N + 2 values) with nutpie: the centred model with nutpie's
low-rank modified mass matrix by default, or (``--reference noncentred``) the same posterior
through the walk's scaled second differences; PyMC NUTS with a diagonal mass matrix did not mix
on the centred model (benchmarks/README.md). Printed: both wall times (same run), their ratio,
the samplers' diagnostics, and for σ, s, b, the slope and the trend the standardised differences
of posterior means, z = Δ / √(mcse_L² + mcse_full²) (about N(0, 1) where the Laplace marginal
is exact, as it is here: the likelihood is Gaussian).
A script, not a test: it prints what it measures and exits 0.
"""

from __future__ import annotations

import argparse

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
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


def rw2_model_noncentred(t, y) -> pm.Model:
    """The same posterior as `rw2_model`, written through the walk's scaled second differences:
    x_0 = x_1 = 0, x_t = 2x_{t-1} - x_{t-2} + sigma*z_t with z ~ N(0, 1) (N - 2 values), so x is
    the cumulative sum of the cumulative sum of sigma*z. The map z -> x has the constant Jacobian
    sigma^(N-2); NUTS mixes here where it does not on the centred x (the first run's tree depth
    10)."""
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0)
        slope = pm.Normal("slope", 0.0, 50.0)
        sigma = pm.HalfNormal("sigma", 0.2)
        noise = pm.HalfNormal("noise", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=y.size - 2)
        free = pt.cumsum(pt.cumsum(sigma * z))
        x = pm.Deterministic("x", pt.concatenate([pt.zeros(2), free]))
        pm.Normal("y", b + slope * t + x, noise, observed=y)
    return model


def check_same_posterior(n: int = 6, seed: int = 3) -> None:
    """Assert that the two models' log densities agree after the change of variables: at random
    points, logp_centred(b, slope, sigma, noise, x) = logp_noncentred(..., z) - (N-2) log sigma
    with z the scaled second differences of x (both on the same log-transformed sigma and noise,
    whose Jacobian terms are the same on both sides)."""
    t, y = rw2_data(n)
    centred, noncentred = rw2_model(t, y), rw2_model_noncentred(t, y)
    (x_value,) = [v.name for v in centred.value_vars if v.name.startswith("x")]
    logp_c, logp_n = centred.compile_logp(), noncentred.compile_logp()
    rng = np.random.default_rng(seed)
    for _ in range(5):
        point = {
            "b": rng.normal(),
            "slope": rng.normal(),
            "sigma_log__": rng.normal(-2.0, 0.5),
            "noise_log__": rng.normal(-1.0, 0.5),
        }
        x = np.concatenate([[0.0, 0.0], rng.normal(0.0, 0.3, n - 2)])
        sigma = np.exp(point["sigma_log__"])
        z = np.diff(x, 2) / sigma
        lhs = logp_c({**point, x_value: x[2:]})
        rhs = logp_n({**point, "z": z}) - (n - 2) * np.log(sigma)
        assert np.isclose(lhs, rhs, rtol=0, atol=1e-8), (lhs, rhs)


def sampler_stats(idata) -> str:
    """Mean tree depth, divergences, max r-hat and min bulk ESS over the model's free variables."""
    stats = idata.sample_stats
    depth = stats["tree_depth"] if "tree_depth" in stats else stats["depth"]
    summary = az.summary(idata, var_names=["b", "slope", "sigma", "noise", "x"], kind="diagnostics")
    summary = summary.dropna()  # the anchors x_0 = x_1 = 0 have no r-hat
    return (
        f"mean tree depth {float(depth.mean()):.2f}, divergences {int(stats['diverging'].sum())}, "
        f"max r-hat {summary['r_hat'].max():.3f}, min ESS bulk {summary['ess_bulk'].min():.0f} / "
        f"tail {summary['ess_tail'].min():.0f}"
    )


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
    parser.add_argument("--draws", type=int, default=500, help="Laplace side: draws (= tune)")
    parser.add_argument("--chains", type=int, default=2, help="Laplace side: chains")
    parser.add_argument("--ref-draws", type=int, default=1000, help="reference: draws (= tune)")
    parser.add_argument("--ref-chains", type=int, default=4, help="reference: chains")
    parser.add_argument(
        "--reference",
        choices=("centred", "noncentred"),
        default="centred",
        help="the full model nutpie samples (the same posterior either way)",
    )
    parser.add_argument(
        "--diagonal",
        action="store_true",
        help="reference: nutpie's diagonal mass matrix instead of its low-rank modified one",
    )
    parser.add_argument("--save", help="prefix for the two DataTree netCDF files")
    args = parser.parse_args()
    check_same_posterior()
    t, y = rw2_data(args.n)
    model = rw2_model(t, y)
    settings = {"draws": args.draws, "tune": args.draws, "chains": args.chains, "cores": 1}

    def full():
        ref = {"draws": args.ref_draws, "tune": args.ref_draws, "chains": args.ref_chains}
        kwargs = {"low_rank_modified_mass_matrix": not args.diagonal}
        with model if args.reference == "centred" else rw2_model_noncentred(t, y):
            try:
                return pm.sample(
                    **ref,
                    nuts_sampler="nutpie",
                    nuts=kwargs,
                    random_seed=1,
                    progressbar=False,
                )
            except Exception as error:  # nutpie missing or failing: PyMC NUTS, chains in turn
                print(f"nutpie failed ({error!r}); PyMC NUTS instead")
                return pm.sample(
                    **ref, cores=1, nuts_sampler="pymc", random_seed=1, progressbar=False
                )

    idata_full, time_full = timed(full)
    if args.save:
        idata_full.to_netcdf(f"{args.save}_full.nc")
    print(
        f"reference ({args.reference}, nutpie, "
        f"{'diagonal' if args.diagonal else 'low-rank'} mass matrix) {time_full:.1f} s: "
        f"{sampler_stats(idata_full)}"
    )

    def laplace():
        marginal = pmo.marginalize_laplace(model, "x")
        with marginal:
            # PyMC's own NUTS, as printed below (PyMC 6 picks nutpie when it is installed)
            idata = pm.sample(**settings, nuts_sampler="pymc", random_seed=1, progressbar=False)
        return pmo.recover_latent(marginal, idata, random_seed=2, progressbar=False), marginal

    (idata_laplace, marginal), time_laplace = timed(laplace)
    if args.save:
        idata_laplace.to_netcdf(f"{args.save}_laplace.nc")
    structure = pmo.laplace_info(marginal).structure
    print(
        f"N = {args.n}; Laplace: {args.chains} chains x {args.draws} draws after {args.draws} "
        f"tuning (PyMC NUTS); reference: {args.ref_chains} chains x {args.ref_draws} draws after "
        f"{args.ref_draws} tuning; {structure!r}"
    )
    print(
        f"Laplace + NUTS + recover_latent: {time_laplace:.1f} s; reference: {time_full:.1f} s; "
        f"reference / Laplace = {time_full / time_laplace:.2f}"
    )
    print(f"Laplace NUTS: {sampler_stats(idata_laplace)}")
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
