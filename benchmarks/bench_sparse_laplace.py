"""Laplace marginal of an ICAR field with Poisson counts: sparse vs dense Hessian (issue 15).

Run ``python benchmarks/bench_sparse_laplace.py [m ...]`` (default: 40 100). A script, not a
test: it prints the times measured in this run and exits 0 whatever they are (1 only if the
sparse and dense marginals disagree where both run).

Model: an m × m grid (N = m²), y_i ~ Poisson(exp(b + φ_i)), φ ~ ICAR(σ) with the corner
constraint (φ = 0 at node 0; N − 1 free coordinates), θ = (b, log σ). The latent φ is
marginalized by ``marginalize_laplace(model, "phi")``: "auto" reads the sparse pattern off the
model (the script checks that it did).
The timed call is one evaluation of the compiled marginal log density plus one of its gradient
at a new θ each time (inner Newton solve from the default start, sparse Hessian, its log det,
the implicit gradient through the selected inverse); the fastest of 3 after a warm-up; build
and compile time printed apart. The dense path (``hessian_structure="dense"``) runs where
N ≤ 3,000, for the ratio. Then ``recover_latent`` draws the field for 1,000 posterior draws of
θ (one chain, θ scattered around (b, log σ) = (1, −0.5)), timed once.
"""

from __future__ import annotations

import sys
import time

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from _timing import timed as timed_call

import pymc_optim as pmo
from pymc_optim.distributions.gmrf import ICAR
from pymc_optim.linalg.sparse import SparseStructure


def grid_edges(m: int) -> np.ndarray:
    index = np.arange(m * m).reshape(m, m)
    right = np.column_stack([index[:, :-1].ravel(), index[:, 1:].ravel()])
    down = np.column_stack([index[:-1, :].ravel(), index[1:, :].ravel()])
    return np.concatenate([right, down])


def model_for(m: int) -> tuple[pm.Model, np.ndarray]:
    edges = grid_edges(m)
    counts = np.random.default_rng(0).poisson(3.0, size=m * m)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        b = pm.Normal("b", 0.0, 2.0)
        phi = ICAR("phi", edges=edges, sigma=sigma, constraint="corner")
        pm.Poisson("y", mu=pt.exp(b + phi), observed=counts)
    return model, edges


def timed(model, structure):
    start = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, "phi", hessian_structure=structure)
    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    build = time.perf_counter() - start
    found = pmo.laplace_info(marginal).structure
    if structure == "auto" and not isinstance(found, SparseStructure):
        raise RuntimeError(f"'auto' did not take the sparse path: {found}")
    points = [{"sigma_log__": np.array(-0.5 + 0.01 * k), "b": np.array(1.0)} for k in range(4)]
    logp(points[0]), dlogp(points[0])
    times = []
    for point in points[1:]:
        start = time.perf_counter()
        logp(point), dlogp(point)
        times.append(time.perf_counter() - start)
    return build, min(times), (logp(points[-1]), dlogp(points[-1])), marginal


def recover_seconds(marginal, draws=1000) -> float:
    rng = np.random.default_rng(1)
    posterior = {
        "sigma": np.exp(-0.5 + 0.05 * rng.normal(size=(1, draws))),
        "b": 1.0 + 0.02 * rng.normal(size=(1, draws)),
    }
    _, seconds = timed_call(
        lambda: pmo.recover_latent(
            marginal, az.from_dict(posterior=posterior), random_seed=2, progressbar=False
        )
    )
    return seconds


def main() -> int:
    sizes = [int(a) for a in sys.argv[1:] if not a.startswith("--")] or [40, 100]
    print("| N | path | build + compile s | logp + grad s | dense / sparse |")
    print("|---|---|---|---|---|")
    status = 0
    for m in sizes:
        model, edges = model_for(m)
        build, run, value, marginal = timed(model, "auto")
        print(f"| {m * m} | sparse ('auto') | {build:.1f} | {run:.4f} | |", flush=True)
        if m * m <= 3000:
            d_build, d_run, d_value, _ = timed(model, "dense")
            print(f"| {m * m} | dense | {d_build:.1f} | {d_run:.4f} | {d_run / run:.1f} |")
            if not np.allclose(value[0], d_value[0], rtol=1e-8) or not np.allclose(
                value[1], d_value[1], rtol=1e-8
            ):
                print(f"sparse/dense disagree at N = {m * m}", file=sys.stderr)
                status = 1
        if "--recover" in sys.argv:
            print(f"recover_latent, N = {m * m}, 1,000 draws: {recover_seconds(marginal):.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
