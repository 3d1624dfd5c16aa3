"""Coupled latent fields (issue 19 item 4): Laplace marginal logp+gradient against the full model.

Run ``python benchmarks/bench_coupled.py`` (``--only-finland``: the 100-county rows; ``--skip-
finland``: the HSGP, 500-point, ICAR and AR rows, each against its target; ``--only-hsgp``). A
script, not a test: it prints one markdown table of milliseconds per logp+gradient evaluation
and the ratios measured in this run, and exits 0 whatever the timings. BLAS keeps its default
threads (the user's setting); JAX outputs are materialized (``block_until_ready``) before the
clock stops.

Models
------
* Finland disease map (``pymc_optim.datasets.finland_model``, 100 counties) and the same model
  on 500 synthetic coordinates: θ ~ MvNormal(0, K), y ~ Poisson(ye exp θ). The marginal
  integrates out θ; the reference is the full non-centered model (θ = L η) in the same backend.
* The Finland model with θ a ``pm.gp.HSGP(m=[10, 10], c=1.5)`` marginalized by the name
  ``"theta"``: the basis form against the general dense Hessian and the full model.
* ``pm.ICAR`` latent on a ring-with-chords graph of 100 and 1,000 areas, Poisson counts.
* ``pm.AR`` of order 1, length 1,000, Poisson counts.

Per model: build (marginalize_laplace) and compile seconds, then per-call times of
``logp_dlogp_function`` (what ``pm.sample`` compiles; numba, PyTensor 3's default backend) and,
for Finland, of the jaxified logp under ``jax.jit(jax.value_and_grad)`` (outputs materialized).
All contenders of a model are timed interleaved in one run (``benchmarks/_timing.py``), and the
ratios are medians of paired ratios from that run. Also timed: the same marginal with the
general graph-derived Hessian (``hessian_structure="dense"``), the path before the latent-
Gaussian operator."""

from __future__ import annotations

import os

os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import argparse
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from _timing import fmt_time, ratio, time_interleaved, timed

import pymc_optim as pmo
from pymc_optim.datasets import FinlandData, finland_model, load_finland


def synthetic_finland(n: int, seed: int = 19) -> FinlandData:
    """Coordinates uniform on Finland's 100-county bounding box, counts from the model at the
    posterior mean of Stan's run (α = 0.7, ρ = 20)."""
    data = load_finland()
    rng = np.random.default_rng(seed)
    lo, hi = data.x.min(0), data.x.max(0)
    x = lo + (hi - lo) * rng.uniform(size=(n, 2))
    d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
    K = 0.7**2 * np.exp(-d2 / (2 * 20.0**2)) + 1e-6 * np.eye(n)
    theta = np.linalg.cholesky(K) @ rng.standard_normal(n)
    ye = rng.choice(data.ye, n)
    return FinlandData(x, rng.poisson(ye * np.exp(theta)), ye, data.rho_prior, data.alpha_prior)


def ring_adjacency(n: int) -> np.ndarray:
    """The areas' adjacency: a ring, plus a chord every fifth area."""
    W = np.zeros((n, n), dtype="int64")
    for i in range(n):
        for j in [(i + 1) % n, (i + 7) % n] if i % 5 == 0 else [(i + 1) % n]:
            W[i, j] = W[j, i] = 1
    return W


def icar_model(n: int, seed: int = 19) -> pm.Model:
    rng = np.random.default_rng(seed)
    W = ring_adjacency(n)
    phi = rng.normal(0, 0.5, n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0)
        phi_rv = pm.ICAR("phi", W=W)
        pm.Poisson("y", mu=pt.exp(b + 0.5 * phi_rv), observed=rng.poisson(np.exp(1.0 + phi)))
    return model


def ar_model(n: int, seed: int = 19) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = np.zeros(n)
    for t in range(1, n):
        x[t] = 0.9 * x[t - 1] + rng.normal(0, 0.3)
    with pm.Model() as model:
        rho = pm.Uniform("rho", -1.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        f = pm.AR("f", rho=[rho], sigma=sigma, init_dist=pm.Normal.dist(0.0, 1.0), steps=n - 1)
        pm.Poisson("y", mu=pt.exp(1.0 + f), observed=rng.poisson(np.exp(1.0 + x)))
    return model


def hsgp_model(data: FinlandData, m: int = 10) -> pm.Model:
    """The Finland model with θ an HSGP (``pm.gp.HSGP(m=[m, m], c=1.5)``, PyMC's defaults
    otherwise: non-centred coefficients), as a user writes it."""
    with pm.Model() as model:
        rho = pm.InverseGamma("rho", *data.rho_prior)
        alpha = pm.InverseGamma("alpha", *data.alpha_prior)
        gp = pm.gp.HSGP(m=[m, m], c=1.5, cov_func=alpha**2 * pm.gp.cov.ExpQuad(2, ls=rho))
        theta = gp.prior("theta", data.x)
        pm.Poisson("y", mu=data.ye * pt.exp(theta), observed=data.y)
    return model


def hsgp_rows(data, repeats: int):
    """HSGP latent marginalized by its name: the basis form H = I + Φ̃ᵀ W Φ̃ against the
    general graph-derived dense Hessian and against the full model (NUTS on the coefficients)."""
    hyper = {"rho_log__": np.log(20.0), "alpha_log__": np.log(0.7)}
    model = hsgp_model(data)
    contenders, setup = {}, {}
    for key, structure in [
        ("marginal, basis form numba", "auto"),
        ("marginal, general numba", "dense"),
    ]:
        marginal, build = timed(
            lambda s=structure: pmo.marginalize_laplace(model, "theta", hessian_structure=s)
        )
        print(f"\nHSGP {key}: structure {pmo.laplace_info(marginal).structure}")
        contenders[key], setup[key] = default_call(marginal, hyper)
        setup[key] += build
    contenders["full numba"], setup["full numba"] = default_call(model, hyper)
    pairs = [
        ("marginal, general numba", "marginal, basis form numba", "(speed-up)"),
        ("marginal, basis form numba", "full numba", "(cost per evaluation)"),
    ]
    report(
        "Finland as pm.gp.HSGP(m=[10, 10]), 100 latent coefficients",
        contenders,
        setup,
        pairs,
        repeats,
    )


def default_call(model: pm.Model, values: dict):
    """The model's compiled logp+dlogp (default backend, numba) at its initial point with
    `values` set, as a no-argument call, and its compile seconds."""
    fn, seconds = timed(lambda: model.logp_dlogp_function(ravel_inputs=True))
    fn.set_extra_values({})
    point = near_posterior(model, values)
    q = np.concatenate([np.ravel(point[v.name]) for v in fn._grad_vars])
    return (lambda: fn(q)), seconds


def jax_call(model: pm.Model, values: dict):
    """The jaxified logp and its gradient, jitted together; outputs materialized per call."""
    import jax
    from pymc.sampling.jax import get_jaxified_logp

    def build():
        logp = get_jaxified_logp(model)
        return jax.jit(jax.value_and_grad(lambda *xs: logp(xs)))

    value_and_grad, seconds = timed(build)
    point = near_posterior(model, values)
    args = [np.asarray(point[v.name]) for v in model.value_vars]
    _, first = timed(lambda: jax.block_until_ready(value_and_grad(*args)))  # jit compiles here
    return (lambda: jax.block_until_ready(value_and_grad(*args))), seconds + first


def near_posterior(model: pm.Model, values: dict) -> dict:
    """The model's initial point with the hyperparameters' unconstrained values set."""
    point = model.initial_point()
    point.update({k: np.asarray(v) for k, v in values.items() if k in point})
    return point


def report(title: str, contenders: dict, setup: dict, pairs, repeats: int):
    """Time `contenders` interleaved and print one markdown table of times and ratios."""
    times = time_interleaved(contenders, repeats, batch_s=0.3)
    print(f"\n### {title}\n\n| contender | setup s | per logp+grad |\n|---|---|---|")
    for key in contenders:
        median = sorted(times[key])[len(times[key]) // 2]
        print(f"| {key} | {setup[key]:.1f} | {fmt_time(median)} |")
    print("\n| ratio (same run, median of paired ratios) | value | target |\n|---|---|---|")
    for num, den, target in pairs:
        value = ratio(times, num, den)
        print(f"| {num} / {den} | {value:.2f} | {target} |")
    return times


def finland_rows(n: int, data, repeats: int, jax: bool):
    hyper = {"rho_log__": np.log(20.0), "alpha_log__": np.log(0.7)}
    centered = finland_model(data)
    marginal, build = timed(lambda: pmo.marginalize_laplace(centered, "theta"))
    print(f"\nFinland {n}: marginal structure {pmo.laplace_info(marginal).structure}")
    contenders, setup = {}, {}
    contenders["marginal numba"], setup["marginal numba"] = default_call(marginal, hyper)
    setup["marginal numba"] += build
    full = finland_model(data, centered=False)
    contenders["full non-centered numba"], setup["full non-centered numba"] = default_call(
        full, hyper
    )
    pairs = [("marginal numba", "full non-centered numba", "≤ 3")]
    if n == 100:
        dense, build_dense = timed(
            lambda: pmo.marginalize_laplace(centered, "theta", hessian_structure="dense")
        )
        contenders["marginal, general Hessian numba"], setup["marginal, general Hessian numba"] = (
            default_call(dense, hyper)
        )
        setup["marginal, general Hessian numba"] += build_dense
        pairs.append(("marginal, general Hessian numba", "marginal numba", "(speed-up)"))
    if jax:
        contenders["marginal JAX"], setup["marginal JAX"] = jax_call(marginal, hyper)
        contenders["full non-centered JAX"], setup["full non-centered JAX"] = jax_call(full, hyper)
        pairs += [
            ("marginal JAX", "full non-centered JAX", "≤ 3"),
            ("marginal numba", "marginal JAX", "≤ 2"),
        ]
    times = report(f"Finland GP, {n} points", contenders, setup, pairs, repeats)
    if n == 500:
        median = sorted(times["marginal numba"])[len(times["marginal numba"]) // 2]
        print(f"\ntarget ≤ 50 ms per marginal logp+grad (C); measured {fmt_time(median)}")


def single_rows(title: str, model: pm.Model, latent: str, values: dict, repeats: int, target):
    marginal, build = timed(lambda: pmo.marginalize_laplace(model, latent))
    call, seconds = default_call(marginal, values)
    print(f"\n{title}: marginal structure {pmo.laplace_info(marginal).structure}")
    times = report(
        title, {"marginal numba": call}, {"marginal numba": build + seconds}, [], repeats
    )
    median = sorted(times["marginal numba"])[len(times["marginal numba"]) // 2]
    print(f"\ntarget {target}; measured {fmt_time(median)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--only-finland", action="store_true", help="the 100-county model only")
    parser.add_argument(
        "--skip-finland", action="store_true", help="the HSGP, 500-point GP, ICAR and AR rows"
    )
    parser.add_argument("--only-hsgp", action="store_true", help="the HSGP rows only")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.only_hsgp:
        hsgp_rows(load_finland(), args.repeats)
        return
    if not args.skip_finland:
        finland_rows(100, load_finland(), args.repeats, jax=not args.no_jax)
    if args.only_finland:
        return
    hsgp_rows(load_finland(), args.repeats)
    finland_rows(500, synthetic_finland(500), args.repeats, jax=False)
    for n, target in [(100, "≤ 3 ms"), (1000, "≤ 100 ms")]:
        single_rows(f"ICAR {n}", icar_model(n), "phi", {}, args.repeats, target)
    ar_values = {"rho_interval__": 1.47, "sigma_log__": np.log(0.3)}
    single_rows("AR(1) 1000", ar_model(1000), "f", ar_values, args.repeats, "≤ 5 ms")


if __name__ == "__main__":
    main()
