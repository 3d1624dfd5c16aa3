"""Latent fields at scale: the CustomDist ICAR marginal at 10⁴, 10⁵ and 10⁶ values (issue 37
items 4 and 5).

Poisson counts with log rate b + σ φ, φ an ICAR on a side × side grid with PyMC's soft
sum-to-zero penalty written in a ``pm.CustomDist`` (`bench_low_rank.icar_poisson_model`):
"auto" finds H sparse plus rank one. Each size runs in a fresh process: build the model,
``marginalize_laplace``, compile PyMC's logp+gradient function (numba, the default backend),
the first call (numba compiles, or loads from its disk cache, the solver loop and kernels), then
five calls at nearby points (median). Peak memory is the process's resident high-water mark
(``VmHWM``) after each phase. The baseline is the arithmetic the marginal needs, measured in the
same process: one sparse Cholesky factorization of H's pattern and one selected inverse (the
log-determinant's gradient), by the same kernels.

Usage: ``python benchmarks/bench_scale.py [SIDE ...]`` (default 100 316 1000). Run it twice for
warm numba caches. The 10⁶ row needs about 6 GB. ``--fits [SIDE ...]`` (default 100 316) times
``fit_inla`` (1,000 draws) and ``recover_latent`` of 1,000 hyperparameter draws instead, each
compilation included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bym2_poisson_model(side: int, seed: int = 1):
    """(model, latent names): BYM2 on a side × side grid, Poisson counts with log rate
    b + σ (√(ρ/s) φ + √(1 − ρ) θ), φ the CustomDist ICAR of `bench_low_rank` (PyMC's soft
    sum-to-zero penalty), θ iid N(0, 1), s the grid's scaling factor (Riebler et al. 2016):
    2 side² latent values, three hyperparameters."""
    sys.path.insert(0, str(HERE))
    import bench_low_rank
    import pymc as pm
    import pytensor.tensor as pt

    from pymc_optim.distributions import bym2_scaling_factor

    n = side * side
    edges = bench_low_rank.grid_edges(side)
    scale = bym2_scaling_factor(edges, n=n)
    rng = np.random.default_rng(seed)
    counts = rng.poisson(np.exp(1.0 + 0.3 * rng.normal(size=n)))

    def icar_logp(value):
        d = value[edges[:, 0]] - value[edges[:, 1]]
        return -0.5 * (d**2).sum() - 0.5 * (value.sum() / (0.001 * n)) ** 2

    with pm.Model() as model:
        b = pm.Normal("b", 1.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        rho = pm.Beta("rho", 0.5, 0.5)
        phi = pm.CustomDist("phi", logp=icar_logp, shape=n)
        theta = pm.Normal("theta", 0.0, 1.0, shape=n)
        field = pt.sqrt(rho / scale) * phi + pt.sqrt(1.0 - rho) * theta
        pm.Poisson("y", mu=pt.exp(b + sigma * field), observed=counts)
    return model, ["phi", "theta"]


def child(side: int, form: str = "icar") -> dict:
    sys.path.insert(0, str(HERE))
    import bench_low_rank

    import pymc_optim as pmo
    from pymc_optim.linalg import _cholesky

    if form == "bym2":
        model, latent = bym2_poisson_model(side)
        point = np.array([1.0, np.log(0.5), 0.0])  # b, log σ, logit ρ
    else:
        model, latent = bench_low_rank.icar_poisson_model(side, "CustomDist")[0], "phi"
        point = np.array([1.0, np.log(0.5)])
    row: dict = {"n": side * side * (2 if form == "bym2" else 1)}
    start = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, latent)
    row["marginalize s"], row["peak after marginalize MB"] = time.perf_counter() - start, _peak_mb()
    start = time.perf_counter()
    fn = marginal.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    row["compile s"], row["peak after compile MB"] = time.perf_counter() - start, _peak_mb()
    start = time.perf_counter()
    value, gradient = fn(point)
    row["first call s"], row["peak after first call MB"] = time.perf_counter() - start, _peak_mb()
    assert np.isfinite(value) and np.all(np.isfinite(gradient))
    times = []
    for step in range(1, 6):
        start = time.perf_counter()
        fn(point + 0.01 * step)
        times.append(time.perf_counter() - start)
    row["logp+grad s"] = float(np.median(times))
    row["peak MB"] = _peak_mb()
    # the arithmetic: one factorization and one selected inverse of H's pattern (the sparse
    # part's), on values that make it positive definite
    pattern = pmo.laplace_info(marginal).structure.sparse.pattern
    off = pattern.rows != pattern.cols
    degree = np.bincount(np.r_[pattern.rows[off], pattern.cols[off]], minlength=pattern.n)
    analysis = pattern._analysis()
    values = np.where(off, -1.0, (degree + 1.0)[pattern.rows])
    factors, inverses = [], []
    for _ in range(3):
        start = time.perf_counter()
        x, _ = pattern._factor(values * (1.0 + 1e-3 * len(factors)))
        factors.append(time.perf_counter() - start)
        start = time.perf_counter()
        _cholesky.selected_inverse(analysis, x)
        inverses.append(time.perf_counter() - start)
    row["factor s"], row["selected inverse s"] = min(factors), min(inverses)
    row["÷ (factor + sel. inv.)"] = row["logp+grad s"] / (min(factors) + min(inverses))
    row["factor nnz M"] = analysis.factor_nnz / 1e6
    return row


def fits_child(side: int) -> dict:
    """`fit_inla` (1,000 draws) and `recover_latent` of 1,000 hyperparameter draws on the same
    model, in one process (compilation included in each, numba's disk cache as it is)."""
    sys.path.insert(0, str(HERE))
    import arviz as az
    import bench_low_rank

    import pymc_optim as pmo

    row: dict = {"n": side * side}
    model, _, _ = bench_low_rank.icar_poisson_model(side, "CustomDist")
    start = time.perf_counter()
    idata = pmo.fit_inla(model, "phi", draws=1000, random_seed=1, progressbar=False)
    row["fit_inla s"], row["peak after fit_inla MB"] = time.perf_counter() - start, _peak_mb()
    print(f"n = {row['n']}: fit_inla {row['fit_inla s']:.1f} s", file=sys.stderr, flush=True)
    posterior = idata.posterior.to_dataset()
    hyper = az.from_dict({"posterior": {v: posterior[v].values for v in ("b", "sigma")}})
    start = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, "phi")
    recovered = pmo.recover_latent(marginal, hyper, random_seed=2, progressbar=False)
    row["recover_latent s"] = time.perf_counter() - start
    row["draws recovered"] = int(recovered.posterior["phi"].sizes["draw"]) * int(
        recovered.posterior["phi"].sizes["chain"]
    )
    row["peak MB"] = _peak_mb()
    return row


def _table(columns: list[str], child_args, sides: list[int]) -> None:
    """One fresh process per side (this script with ``child_args(side)``), its JSON row printed
    as a row of a Markdown table; the child's stderr (progress, errors) passes through."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for side in sides:
        done = subprocess.run(
            [sys.executable, __file__, *child_args(side)], stdout=subprocess.PIPE, text=True
        )
        if done.returncode:
            print(f"| side {side} | failed (its error above) |", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        cells = [f"{row[c]:,.0f}" if c == "n" else f"{row[c]:.3g}" for c in columns]
        print("| " + " | ".join(cells) + " |", flush=True)


def fits(sides: list[int]) -> None:
    columns = ["n", "fit_inla s", "recover_latent s", "draws recovered", "peak MB"]
    _table(columns, lambda side: ["--fits-child", str(side)], sides)


def main(sides: list[int], form: str) -> None:
    columns = [
        "n",
        "marginalize s",
        "compile s",
        "first call s",
        "logp+grad s",
        "factor s",
        "selected inverse s",
        "÷ (factor + sel. inv.)",
        "factor nnz M",
        "peak MB",
    ]
    _table(columns, lambda side: ["--child", str(side), form], sides)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(int(sys.argv[2]), sys.argv[3])))
    elif sys.argv[1:2] == ["--fits-child"]:
        print(json.dumps(fits_child(int(sys.argv[2]))))
    elif sys.argv[1:2] == ["--fits"]:
        fits([int(s) for s in sys.argv[2:]] or [100, 316])
    else:
        bym2 = "--bym2" in sys.argv
        sides = [int(s) for s in sys.argv[1:] if s != "--bym2"]
        main(sides or [100, 316, 1000], "bym2" if bym2 else "icar")
