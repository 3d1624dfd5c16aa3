"""Laplace marginal of an ICAR field with Poisson counts: sparse vs dense Hessian (issue 15).

Run ``python benchmarks/bench_sparse_laplace.py [m ...] [--recover] [--quick]`` (default m: 40
100; ``316`` gives the N = 10⁵ row). A script, not a
test: it prints the times measured in this run and exits 0 whatever they are (1 only if the
sparse and dense marginals disagree where both run).

Model: an m × m grid (N = m²), y_i ~ Poisson(exp(b + φ_i)), φ ~ ICAR(σ) with the corner
constraint (φ = 0 at node 0; N − 1 free coordinates), θ = (b, log σ). The latent φ is
marginalized by ``marginalize_laplace(model, "phi")``: "auto" reads the sparse pattern off the
model (the script checks that it did).
The timed calls, at a new θ each time (inner Newton solve from the default start, sparse
Hessian, its log det, the implicit gradient through the selected inverse):

- **separate**: the compiled marginal log density, then its compiled gradient (two functions,
  so two inner Newton solves);
- **joint**: log density and gradient from one function, as ``pm.sample`` evaluates them
  (``logp_dlogp_function``): one inner solve;
- **joint, reference kernels**: the joint call with the numeric factorization swapped for the
  simplicial up-looking kernel and the selected inverse for the column recurrences (the
  tested references the supernodal kernels replaced), for the ratio.

Times are medians of paired, interleaved repeats (``_timing.time_interleaved``) with the
factorizations per call counted; build and compile time printed apart. The dense path
(``hessian_structure="dense"``) runs where N ≤ 3,000, for the ratio. With ``--recover``,
``recover_latent`` draws the field for 1,000 posterior draws of θ (one chain, θ scattered
around (b, log σ) = (1, −0.5)), timed once (its compilation included) with the factorizations
per draw counted, then (same run) 500 draws (two runs of the tour) on one thread against two
(``cores=2``), and 200 draws visited in sampling order against the nearest-neighbour tour.
"""

from __future__ import annotations

import statistics
import sys
import time

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from _timing import git_revision, ratio, time_interleaved
from _timing import timed as timed_call

import pymc_optim as pmo
from pymc_optim.distributions.gmrf import ICAR
from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.model import laplace


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


def compiled(model, structure):
    start = time.perf_counter()
    marginal = pmo.marginalize_laplace(model, "phi", hessian_structure=structure)
    logp, dlogp = marginal.compile_logp(), marginal.compile_dlogp()
    joint = marginal.compile_fn([marginal.logp(), marginal.dlogp()])
    build = time.perf_counter() - start
    found = pmo.laplace_info(marginal).structure
    if structure == "auto" and not isinstance(found, SparseStructure):
        raise RuntimeError(f"'auto' did not take the sparse path: {found}")
    return build, marginal, logp, dlogp, joint


class Points:
    """A new θ at each call (the inner solve cannot reuse the last one)."""

    def __init__(self):
        self.k = 0

    def __call__(self):
        self.k += 1
        return {"sigma_log__": np.array(-0.5 + 1e-3 * (self.k % 400)), "b": np.array(1.0)}


class Factorizations:
    """Stands in for `_cholesky.factorize`, counting its calls; `kernel` is what it runs (the
    supernodal kernel, or the simplicial one inside `simplicial`)."""

    def __init__(self):
        self.count = 0
        self.kernel = _cholesky.factorize
        _cholesky.factorize = self

    def __call__(self, *args):
        self.count += 1
        return self.kernel(*args)


def simplicial(fn, factorizations):
    """`fn` with the simplicial factorization and column selected-inverse kernels in place of
    the supernodal ones."""

    def run():
        supernodal, selected = factorizations.kernel, _cholesky.selected_inverse
        factorizations.kernel = _cholesky.factorize_simplicial
        _cholesky.selected_inverse = _cholesky.selected_inverse_simplicial
        try:
            return fn()
        finally:
            factorizations.kernel = supernodal
            _cholesky.selected_inverse = selected

    return run


def recover_seconds(marginal, draws=1000, in_sequence=False, cores=1) -> float:
    rng = np.random.default_rng(1)
    posterior = {
        "sigma": np.exp(-0.5 + 0.05 * rng.normal(size=(1, draws))),
        "b": 1.0 + 0.02 * rng.normal(size=(1, draws)),
    }
    tour = laplace._nearest_neighbour_order
    if in_sequence:
        laplace._nearest_neighbour_order = lambda points: list(range(len(points)))
    try:
        _, seconds = timed_call(
            lambda: pmo.recover_latent(
                marginal,
                az.from_dict({"posterior": posterior}),
                random_seed=2,
                progressbar=False,
                cores=cores,
            )
        )
    finally:
        laplace._nearest_neighbour_order = tour
    return seconds


def bench_size(m: int, count: Factorizations, repeats: int) -> int:
    """The table rows (and recover_latent times) of one grid size; 1 if sparse and dense
    disagree."""
    status = 0
    model, edges = model_for(m)
    build, marginal, logp, dlogp, joint = compiled(model, "auto")
    point = Points()
    contenders = {
        "separate": lambda: (logp(p := point()), dlogp(p)),
        "joint": lambda: joint(point()),
        "joint, reference kernels": simplicial(lambda: joint(point()), count),
    }
    calls = {}
    for key, fn in contenders.items():
        fn()
        before = count.count
        fn()
        calls[key] = count.count - before
    if m * m <= 3000:
        d_build, _, d_logp, d_dlogp, d_joint = compiled(model, "dense")
        contenders["dense, joint"] = lambda: d_joint(point())
        at = point()
        value = joint(at)
        d_value = d_joint(at)
        if not np.allclose(value[0], d_value[0], rtol=1e-8) or not np.allclose(
            value[1], d_value[1], rtol=1e-8
        ):
            print(f"sparse/dense disagree at N = {m * m}", file=sys.stderr)
            status = 1
    times = time_interleaved(contenders, repeats, batch_s=0.3)
    median = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        ("sparse ('auto'), separate logp, dlogp", "separate", "separate", "joint"),
        ("sparse ('auto'), joint", "joint", "joint", "joint"),
        ("sparse, joint, reference kernels", *["joint, reference kernels"] * 2, "joint"),
    ]
    for label, key, num, den in rows:
        r = ratio(times, num, den)
        built = f"{build:.1f}" if key == "separate" else ""
        print(
            f"| {m * m} | {label} | {built} | {median[key]:.4f} | {calls[key]} | "
            f"{key} / joint = {r:.2f} |"
        )
    if "dense, joint" in times:
        r = ratio(times, "dense, joint", "joint")
        print(
            f"| {m * m} | dense, joint | {d_build:.1f} | {median['dense, joint']:.4f} | | "
            f"dense / sparse = {r:.1f} |",
            flush=True,
        )
    if "--recover" in sys.argv:
        before = count.count
        seconds = recover_seconds(marginal)
        per_draw = (count.count - before) / 1000
        print(
            f"recover_latent, N = {m * m}, 1,000 draws (nearest-neighbour tour, compilation "
            f"included): {seconds:.1f} s, {per_draw:.2f} factorizations / draw"
        )
        one, two = recover_seconds(marginal, 500), recover_seconds(marginal, 500, cores=2)
        print(
            f"recover_latent, N = {m * m}, 500 draws: 1 thread {one:.1f} s, 2 threads "
            f"{two:.1f} s, 1 / 2 threads = {one / two:.2f}",
            flush=True,
        )
        tour, sequence = recover_seconds(marginal, 200), recover_seconds(marginal, 200, True)
        print(
            f"recover_latent, N = {m * m}, 200 draws: tour {tour:.1f} s, sampling order "
            f"{sequence:.1f} s, sequence / tour = {sequence / tour:.2f}",
            flush=True,
        )
    return status


def main() -> int:
    sizes = [int(a) for a in sys.argv[1:] if not a.startswith("--")] or [40, 100]
    repeats = 3 if "--quick" in sys.argv else 5
    count = Factorizations()
    print(f"commit {git_revision(pmo.__file__)}")
    print("| N | path | build + compile s | logp + grad s | factorizations / call | ratio |")
    print("|---|---|---|---|---|---|")
    status = 0
    for m in sizes:
        status |= bench_size(m, count, repeats)
    return status


if __name__ == "__main__":
    sys.exit(main())
