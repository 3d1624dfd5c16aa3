"""ICAR fields with PyMC's soft sum-to-zero penalty: the Laplace marginal's logp+gradient with
H = S + c 11ᵀ split into its sparse part and a rank-one term (issue 37 item 1).

Run ``python benchmarks/bench_low_rank.py [--cases custom100 icar50 custom316] [--repeats 7]
[--no-busy]``. A script, not a test: it prints one markdown table and exits 0 whatever the
timings (1 if a marginal disagrees with the scipy.sparse reference by more than 1e-8).

Model (`icar_poisson_model`): Poisson counts on an m × m grid (N = m²), log rate b + σ φ, φ an
ICAR field with PyMC's soft sum-to-zero penalty −½ (Σφ / (0.001 N))², written either as
``pm.ICAR(W=W)`` with its dense 0/1 adjacency matrix (what PyMC's BYM tutorial does) or as a
``pm.CustomDist`` over the edge list (what users write for large grids). θ = (b, log σ);
``marginalize_laplace(model, "phi")`` with the defaults: "auto" must find the split.

Cases: ``custom100`` (CustomDist, N = 10⁴, target ≤ 0.2 s per logp+gradient), ``icar50``
(pm.ICAR, N = 2,500, target ≤ 0.05 s), ``custom316`` (CustomDist, N = 99,856, target ≤ 2 s).
Each case runs in a fresh process in the default backend (numba), as `pm.sample` compiles it
(`logp_dlogp_function`), on a quiet machine and with one other CPU-bound process running
(``OPENBLAS_NUM_THREADS`` as the user has it); median of `--repeats` batches of calls at the
initial point. Reference: `scipy_sparse_marginal`, the same marginal written independently
(Newton with scipy.sparse's LU and Sherman–Morrison for the rank-one term, log det by the
lemma), compared at the initial point (value, relative) and by central differences of the
reference in θ (gradient; step 1e-5, so agreement to ~1e-8 relative is the differences' own
error).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

CASES = {
    "custom100": ("CustomDist", 100, 0.2),
    "icar50": ("pm.ICAR", 50, 0.05),
    "custom316": ("CustomDist", 316, 2.0),
}


def grid_edges(side: int) -> np.ndarray:
    index = np.arange(side * side).reshape(side, side)
    right = np.stack([index[:, :-1].ravel(), index[:, 1:].ravel()], axis=1)
    down = np.stack([index[:-1].ravel(), index[1:].ravel()], axis=1)
    return np.concatenate([right, down])


def icar_poisson_model(side: int, form: str, seed: int = 1):
    """(model, edges, counts): Poisson counts with log rate b + σ φ, φ an ICAR on a side ×
    side grid with PyMC's soft sum-to-zero penalty, as ``pm.ICAR`` (dense W) or the same
    density (up to a constant) in a ``pm.CustomDist``."""
    import pymc as pm
    import pytensor.tensor as pt

    n = side * side
    edges = grid_edges(side)
    rng = np.random.default_rng(seed)
    counts = rng.poisson(np.exp(1.0 + 0.3 * rng.normal(size=n)))
    with pm.Model() as model:
        b = pm.Normal("b", 1.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        if form == "pm.ICAR":
            W = np.zeros((n, n))
            W[edges[:, 0], edges[:, 1]] = W[edges[:, 1], edges[:, 0]] = 1.0
            phi = pm.ICAR("phi", W=W)
        else:

            def logp(value):
                d = value[edges[:, 0]] - value[edges[:, 1]]
                return -0.5 * (d**2).sum() - 0.5 * (value.sum() / (0.001 * n)) ** 2

            phi = pm.CustomDist("phi", logp=logp, shape=n)
        pm.Poisson("y", mu=pt.exp(b + sigma * phi), observed=counts)
    return model, edges, counts


def scipy_sparse_marginal(edges, counts, b: float, sigma: float) -> float:
    """The Laplace marginal log p(y | b, σ) of the CustomDist form (its density without
    constants), written independently: Newton on the mode with scipy.sparse's LU of
    S = Q + σ² diag(rate) and Sherman–Morrison for the penalty's c 11ᵀ, c = 1 / (0.001 N)²;
    log det H = log det S + log(1 + c 1ᵀ S⁻¹ 1)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla
    from scipy.special import gammaln

    n, e = counts.size, len(edges)
    c = 1.0 / (0.001 * n) ** 2
    rows = np.r_[np.arange(e), np.arange(e)]
    incidence = sp.coo_matrix(
        (np.r_[np.ones(e), -np.ones(e)], (rows, np.r_[edges[:, 0], edges[:, 1]])), shape=(e, n)
    ).tocsc()
    Q = (incidence.T @ incidence).tocsc()
    ones = np.ones(n)

    def factor(phi):
        return spla.splu((Q + sp.diags(sigma**2 * np.exp(b + sigma * phi))).tocsc())

    phi = np.zeros(n)
    for _ in range(100):
        gradient = -(Q @ phi) - c * phi.sum() + sigma * (counts - np.exp(b + sigma * phi))
        lu = factor(phi)
        y, u = lu.solve(gradient), lu.solve(ones)
        step = y - u * (c * y.sum() / (1.0 + c * u.sum()))
        phi = phi + step
        if np.abs(step).max() < 1e-13:
            break
    lu = factor(phi)
    logdet = np.log(np.abs(lu.U.diagonal())).sum() + np.log1p(c * lu.solve(ones).sum())
    log_rate = b + sigma * phi
    poisson = (counts * log_rate - np.exp(log_rate) - gammaln(counts + 1)).sum()
    log_joint = -0.5 * phi @ (Q @ phi) - 0.5 * c * phi.sum() ** 2 + poisson
    return log_joint + 0.5 * n * np.log(2 * np.pi) - 0.5 * logdet


def _priors(b: float, log_sigma: float) -> float:
    """log p(b) + log p(σ) + log σ: the hyperpriors and the log transform's Jacobian."""
    return float(
        -0.5 * (b - 1.0) ** 2
        - 0.5 * np.log(2 * np.pi)
        + 0.5 * np.log(2 / np.pi)
        - 0.5 * np.exp(2 * log_sigma)
        + log_sigma
    )


def _worker(case: str, repeats: int) -> dict:
    import pymc_optim as pmo
    from pymc_optim.linalg.low_rank import LowRankUpdateStructure

    form, side, _ = CASES[case]
    model, edges, counts = icar_poisson_model(side, form)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the CustomDist's prior is not known to be Gaussian)
        marginal = pmo.marginalize_laplace(model, "phi")
    build = time.perf_counter() - t0
    structure = pmo.laplace_info(marginal).structure
    if not isinstance(structure, LowRankUpdateStructure):
        raise RuntimeError(f"'auto' chose {structure!r}, not the sparse plus low-rank split")
    t0 = time.perf_counter()
    fn = marginal.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    point = marginal.initial_point()
    names = [v.name for v in fn._grad_vars]
    q = np.concatenate([np.ravel(point[name]) for name in names])
    logp, gradient = fn(q)
    first = time.perf_counter() - t0
    calls, elapsed = 1, 0.0
    while elapsed < 0.05:
        calls *= 2
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(q)
        elapsed = time.perf_counter() - t0
    calls = max(1, round(calls * 0.3 / elapsed))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(q)
        times.append((time.perf_counter() - t0) / calls)
    out = {"build": build, "first": first, "call": statistics.median(times), "N": side * side}
    if form == "CustomDist":
        theta = dict(zip(names, q, strict=True))
        b, log_sigma = theta["b"], theta["sigma_log__"]

        def reference(b, log_sigma):
            return scipy_sparse_marginal(edges, counts, b, np.exp(log_sigma)) + _priors(
                b, log_sigma
            )

        h = 1e-5
        expected = np.array(
            [
                (reference(b + h, log_sigma) - reference(b - h, log_sigma)) / (2 * h),
                (reference(b, log_sigma + h) - reference(b, log_sigma - h)) / (2 * h),
            ]
        )
        order = [names.index("b"), names.index("sigma_log__")]
        out["value_error"] = abs(float(logp) / reference(b, log_sigma) - 1.0)
        out["gradient_error"] = float(np.max(np.abs(gradient[order] / expected - 1.0)))
    return out


def _run(case: str, busy: bool, repeats: int) -> dict:
    command = [sys.executable, __file__, "--worker", case, "--repeats", str(repeats)]
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    if result.returncode != 0:
        raise RuntimeError(f"{case} (busy={busy}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-busy", action="store_true", help="quiet machine only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.repeats)))
        return 0
    print(f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load before: {os.getloadavg()[0]:.2f}\n")
    print(
        "| case | N | condition | build s | compile + first call s | logp+gradient s "
        "| target s | time / target | value vs scipy.sparse | gradient vs differences |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    for case in args.cases:
        form, _, target = CASES[case]
        for busy in [False] if args.no_busy else [False, True]:
            r = _run(case, busy, args.repeats)
            value = f"{r['value_error']:.1e}" if "value_error" in r else "–"
            gradient = f"{r['gradient_error']:.1e}" if "gradient_error" in r else "–"
            failed |= r.get("value_error", 0.0) > 1e-8
            print(
                f"| {form} | {r['N']:,} | {'one busy process' if busy else 'quiet'} "
                f"| {r['build']:.1f} | {r['first']:.1f} | {r['call']:.4f} | {target} "
                f"| {r['call'] / target:.2f} | {value} | {gradient} |",
                flush=True,
            )
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
