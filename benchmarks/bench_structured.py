"""Structured linear algebra: Kronecker priors and block-diagonal Laplace Hessians vs dense.

Run ``python benchmarks/bench_structured.py`` (a few minutes on 2 cores; the dense Laplace
marginal at G = 1000 dominates) or ``--quick`` for a smoke run (smaller sizes). This is a script,
not a test: it prints markdown tables of times and ratios measured in the same run, and exits 0
whatever the timings (1 only if a structured result disagrees with its dense reference).

Table 1 — a separable space–time latent field
----------------------------------------------
x ∈ ℝ⁹⁰⁰ on a 30 (time) × 30 (space) grid with prior N(0, K_t(ℓ_t) ⊗ K_s(ℓ_s)), squared
exponential kernels (+ 10⁻³ jitter) of two lengthscales θ = (ℓ_t, ℓ_s), written as PyMC writes it:
``pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(K_t, K_s)), x)``. The timed function
returns the log-density and its gradient with respect to θ and x. Rows:

- **dense**: compiled with the rewrites of ``pymc_optim.rewrites.structured_linalg`` excluded,
  and PyTensor's own Kronecker lifts too (``lift_linalg_of_expanded_matrices``): Cholesky of the
  900 × 900 matrix, its gradient, triangular solves — O(N³).
- **compile-time rewrites**: the same graph and gradient, default mode: the rewrites act on the
  already-differentiated graph (no decomposition of the 900 × 900 matrix remains, but the
  Cholesky gradient still forms (N, N) cotangents: O(N^2.5)).
- **factored before grad**: ``structure_linalg`` applied to the log-density before
  ``pytensor.grad``: no (N, N) matrix anywhere, O(n³ + m³ + N(n + m)).
- **pm.Model compile_logp + compile_dlogp**: the same prior in a model (θ HalfNormal, log
  transformed); PyMC's ``model.logp()`` passes through the rewrites (logprob cleanup), two calls.
- **KroneckerNormal** (PyMC's own eigendecomposition-based density of the same prior), for scale.

Table 2 — grouped random effects, Laplace marginal
--------------------------------------------------
G groups, 3 correlated effects per group (intercept and two slopes), 5 Poisson counts per group
with standard normal covariates, y ~ Poisson(exp(0.3 + x·u_g)), u_g ~ N(0, Σ), Σ from
``pm.LKJCholeskyCov`` (eta 2, Exponential(1) scales). The latent u (G × 3) is marginalized with
``pmo.marginalize_laplace(model, "u", hessian_structure=...)``, ``"block_diagonal"`` with
``block_size=3`` vs ``"dense"``; the timed call is one evaluation of the marginal model's
``compile_logp`` plus one of ``compile_dlogp`` at the initial point (inner Newton solve, Hessian,
its log-determinant, the implicit gradient). G = 250, 500, 1000: the structured cost should be
linear in G, the dense one cubic.

Timing: one BLAS thread, the fastest of repeated batches (each at least ``--batch`` seconds of
calls, at least one call; the dense Laplace marginal: two single calls), after one warm-up call,
compile excluded; ratios are dense / structured.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from _timing import blas_threads, time_interleaved
from pytensor.compile.mode import get_default_mode

import pymc_optim as pmo
from pymc_optim.rewrites.structured_linalg import TAG, structure_linalg

DENSE = get_default_mode().excluding(
    TAG,
    "lift_linalg_of_expanded_matrices",
    "det_of_kronecker",
    "det_of_blockdiag",
    "block_diag_solve_to_block_diag_solves",
)


def check(what, got, want, tol) -> bool:
    """Normwise agreement, max|got − want| ≤ tol · max|want|; prints what disagrees."""
    got, want = np.asarray(got), np.asarray(want)
    error = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))
    if not error <= tol:
        print(f"CHECK FAILED: {what}: relative error {error:.1e} > {tol:.0e}")
        return False
    return True


def timed(fn, repeats, batch):
    """Fastest seconds per call over `repeats` batches of about `batch` seconds (the minimum:
    other processes on a shared 2-core machine only ever add time)."""
    return min(time_interleaved({"fn": fn}, repeats, batch)["fn"])


# --- table 1 ------------------------------------------------------------------------------------


def kernels(theta, n_t, n_s):
    t, s = np.linspace(0, 1, n_t), np.linspace(0, 1, n_s)
    k_t = pt.exp(-0.5 * ((t[:, None] - t[None, :]) / theta[0]) ** 2) + 1e-3 * np.eye(n_t)
    k_s = pt.exp(-0.5 * ((s[:, None] - s[None, :]) / theta[1]) ** 2) + 1e-3 * np.eye(n_s)
    return k_t, k_s


def table_kronecker(n_t, n_s, repeats, batch):
    n = n_t * n_s
    rng = np.random.default_rng(0)
    theta = pt.vector("theta", shape=(2,), dtype="float64")
    x = pt.vector("x", shape=(n,), dtype="float64")
    k_t, k_s = kernels(theta, n_t, n_s)
    logp = pm.logp(pm.MvNormal.dist(mu=0, cov=pt.linalg.kron(k_t, k_s)), x)
    outs = [logp, *pytensor.grad(logp, [theta, x])]
    factored = structure_linalg(logp)
    factored_outs = [factored, *pytensor.grad(factored, [theta, x])]
    knormal = pm.logp(pm.KroneckerNormal.dist(mu=pt.zeros(n), covs=[k_t, k_s]), x)
    knormal_outs = [knormal, *pytensor.grad(knormal, [theta, x])]

    Theta = np.array([0.3, 0.2])
    # A draw from the prior, so that the density is of ordinary size.
    K = np.kron(*(np.asarray(k.eval({theta: Theta})) for k in (k_t, k_s)))
    X = np.linalg.cholesky(K) @ rng.normal(size=n)

    fns = {
        "dense": pytensor.function([theta, x], outs, mode=DENSE),
        "compile-time rewrites": pytensor.function([theta, x], outs),
        "factored before grad": pytensor.function([theta, x], factored_outs),
        "KroneckerNormal (PyMC)": pytensor.function([theta, x], knormal_outs),
    }
    with pm.Model() as model:
        th = pm.HalfNormal("theta", 1.0, shape=2)
        k_t_m, k_s_m = kernels(th, n_t, n_s)
        pm.MvNormal("x", mu=0, cov=pt.linalg.kron(k_t_m, k_s_m), shape=n)
    point = {"theta_log__": np.log(Theta), "x": X}
    model_logp, model_dlogp = model.compile_logp(), model.compile_dlogp()

    # cond(K) ≈ 2·10⁸: the dense Cholesky itself is accurate to about cond·ε ≈ 5·10⁻⁸ of the
    # largest entry, so results are compared normwise at 10⁻⁶.
    reference = fns["dense"](Theta, X)
    ok = True
    for name, fn in fns.items():
        outs = fn(Theta, X)
        if name.startswith("KroneckerNormal"):
            outs = outs[:1]  # a different graph of the same density: checked on the value only
        for what, got, want in zip(("logp", "dθ", "dx"), outs, reference, strict=False):
            ok &= check(f"{name}: {what}", got, want, 1e-6)
    ok &= check(
        "pm.Model: logp", model_logp(point), reference[0] + _halfnormal_logp_log(Theta), 1e-8
    )

    rows = {name: timed(lambda fn=fn: fn(Theta, X), repeats, batch) for name, fn in fns.items()}
    rows["pm.Model compile_logp + compile_dlogp"] = timed(
        lambda: (model_logp(point), model_dlogp(point)), repeats, batch
    )
    print(f"\n### Table 1: separable prior, {n_t} × {n_s} = {n} latent values, logp + gradient")
    print("\n| route | ms per call | dense / route |\n|---|---:|---:|")
    for name, seconds in rows.items():
        print(f"| {name} | {1e3 * seconds:.3f} | {rows['dense'] / seconds:.1f}x |")
    return ok, rows["dense"] / rows["factored before grad"]


def _halfnormal_logp_log(theta):
    """log HalfNormal(1) density of θ plus the log-Jacobian of θ = exp(θ_log)."""
    return float(np.sum(0.5 * np.log(2 / np.pi) - 0.5 * theta**2 + np.log(theta)))


# --- table 2 ------------------------------------------------------------------------------------


def grouped_model(G, seed=1):
    rng = np.random.default_rng(seed)
    per_group = 5
    group = np.repeat(np.arange(G), per_group)
    covariates = np.column_stack([np.ones(G * per_group), rng.normal(size=(G * per_group, 2))])
    true_u = rng.normal(scale=[0.5, 0.3, 0.2], size=(G, 3))
    y = rng.poisson(np.exp(0.3 + (covariates * true_u[group]).sum(-1)))
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        u = pm.MvNormal("u", mu=0, chol=chol, shape=(G, 3))
        eta = 0.3 + (covariates * u[group]).sum(-1)
        pm.Poisson("y", pt.exp(eta), observed=y)
    return model


def laplace_call(G, structure):
    model = grouped_model(G)
    kwargs = {"block_size": 3} if structure == "block_diagonal" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        marginal = pmo.marginalize_laplace(model, "u", hessian_structure=structure, **kwargs)
    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    point = marginal.initial_point()
    return (lambda: (logp(point), dlogp(point))), logp(point), dlogp(point)


def table_laplace(sizes, repeats, batch):
    print("\n### Table 2: grouped random effects (block size 3), one Laplace marginal logp + dlogp")
    print(
        "\n| G | latent size | block-diagonal (ms) | dense (ms) | dense / block | "
        "block ms per 1000 groups |\n|---:|---:|---:|---:|---:|---:|"
    )
    ok, ratios = True, {}
    for G in sizes:
        call_b, logp_b, dlogp_b = laplace_call(G, "block_diagonal")
        call_d, logp_d, dlogp_d = laplace_call(G, "dense")
        ok &= check(f"Laplace G = {G}: logp", logp_b, logp_d, 1e-8)
        ok &= check(f"Laplace G = {G}: dlogp", dlogp_b, dlogp_d, 1e-6)
        t_b = timed(call_b, repeats, batch)
        t_d = timed(call_d, 2, 0.0)  # dense: seconds per call at G = 1000, two single calls
        ratios[G] = t_d / t_b
        print(
            f"| {G} | {3 * G} | {1e3 * t_b:.1f} | {1e3 * t_d:.0f} | {t_d / t_b:.0f}x | "
            f"{1e3 * t_b * 1000 / G:.1f} |"
        )
    return ok, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--batch", type=float, default=0.5, help="seconds per timing batch")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    grid = (10, 10) if args.quick else (30, 30)
    sizes = (50, 100) if args.quick else (250, 500, 1000)

    with blas_threads(1):
        ok1, kron_ratio = table_kronecker(*grid, repeats, args.batch)
        ok2, laplace_ratios = table_laplace(sizes, repeats, args.batch)

    print("\n### Targets")
    print(f"- separable prior ≥ 20x: {kron_ratio:.0f}x — {'PASS' if kron_ratio >= 20 else 'FAIL'}")
    largest = max(laplace_ratios)
    print(
        f"- Laplace G = {largest} ≥ 50x: {laplace_ratios[largest]:.0f}x — "
        f"{'PASS' if laplace_ratios[largest] >= 50 else 'FAIL'}"
    )
    print(f"- structured results equal dense: {'PASS' if ok1 and ok2 else 'FAIL'}")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
