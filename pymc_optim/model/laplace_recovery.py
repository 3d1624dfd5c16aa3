"""Latent draws of a Laplace marginal model at given hyperparameters: the draw, the walk."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.basic import Constant
from pytensor.graph.replace import graph_replace

from pymc_optim._progress import Progress
from pymc_optim.backends import newton as _newton
from pymc_optim.graph.inner_graph import static_size
from pymc_optim.linalg.structure import _finite
from pymc_optim.model._fgraph import replace_variables
from pymc_optim.model.constraints import constrained_logdet, krige
from pymc_optim.model.laplace_marker import laplace_node

__all__ = [
    "initial_mode",
    "main_axis_order",
    "mean_shift",
    "nearest_neighbour_order",
    "outputs_mode_success",
    "recover_draws",
    "recovery_draw",
    "recovery_function",
    "store_recovered",
    "warm_started",
]


def recover_draws(
    marginal_model, solve, draws, rng, progressbar, *, order=None, run=None, threads=1
):
    """Latent draws for the hyperparameter `draws` (one array per free variable, shaped
    (chain, draw, ...)): for each, `solve(draw, point, start, noise)` → (outputs, mode,
    success), the outputs (the latent variables and Deterministics) at one draw of
    N(mode + δ, H⁻¹) from the standard normal `noise`. Each draw is its own solve, started at
    the mode of the previous successful draw in `order` (the draw indices within a chain, the
    same for every chain or one list per chain; by default in sequence); a failed solve
    restarts the next from the model's initial point. With `run`, each chain's visits are cut
    into runs of at most `run` draws, each started at the initial point; with ``threads > 1``
    the runs are walked by that many threads (the numba kernels release the GIL), and `solve`
    must then be safe to call from several threads at once. Returns per chain the list of
    outputs, then success, each stacked over draws."""
    node = laplace_node(marginal_model)
    x0 = np.asarray(initial_mode(node))
    n_chains, n_draws = draws[0].shape[:2]
    eps = [rng.standard_normal((n_draws, x0.size)).astype(x0.dtype) for _ in range(n_chains)]
    results = [[None] * n_draws for _ in range(n_chains)]
    runs = []
    for c in range(n_chains):
        visits = order if order is None or np.ndim(order[0]) == 0 else order[c]
        visits = list(range(n_draws) if visits is None else visits)
        size = run or max(len(visits), 1)
        runs += [(c, visits[k : k + size]) for k in range(0, len(visits), size)]

    def walk(c, visits):
        start = x0
        for i in visits:
            point = [d[c, i] for d in draws]
            outputs, mode, success = solve(i, point, start, eps[c][i])
            success = bool(np.all(success))
            results[c][i] = [*outputs, success]
            start = mode if success else x0
            progress.advance()

    threads = min(threads, len(runs))
    with (
        Progress(progressbar, "recovering latent draws", n_chains * n_draws) as progress,
        ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool,
    ):
        if pool is None:
            for r in runs:
                walk(*r)
        else:
            for f in as_completed([pool.submit(walk, *r) for r in runs]):
                f.result()
    return [[np.stack([r[k] for r in res]) for k in range(len(res[0]))] for res in results]


def recovery_function(marginal_model: pm.Model, node, mean_correction: bool, *, compile_mode=None):
    """The compiled map (hyperparameters, start, standard noise) → (the latent variables and
    their Deterministics at one draw, the mode, success) of `marginal_model`'s Laplace `node`:
    the inner solve from `start`, H at the mode and the draw of N(x* + δ, H⁻¹) in one function,
    so that the draw shares the solve's H and its factorization (the sparse Ops cache the last
    factor by value), and one compilation serves both.

    A Newton solve is `newton.sequential_solve`'s (chord steps on the previous draw's H, the
    final Newton step in this graph): H and δ are taken at its last iterate z, whose H the
    loop factorized, and the draw is centred at x* = z − H(z)⁻¹F(z) + δ. z is within the
    solver's tolerance of x*, so H(z) and δ(z) are H(x*) and δ(x*) to that tolerance.

    Kept per marginal graph, thread, `mean_correction` and `compile_mode` (a compiled function
    holds its own storage, so threads must not share one): a second `recover_latent` on the
    same marginal model compiles nothing.
    """
    rvs = tuple(marginal_model.free_RVs)
    key = (threading.get_ident(), bool(mean_correction), compile_mode, rvs)
    # on the node (not a module-level dict, whose values would keep their keys alive)
    cache = node.tag.__dict__.setdefault("recovery_functions", {})
    if key in cache:
        return cache[key]
    _, mode, hessian, success, *params = node.inputs
    noise = mode.type("noise")
    start = mode.type("start")
    sequential = _newton.sequential_solve(mode, start, hessian)
    if sequential is None:  # another solver: the same solve, started at `start`
        recovered = recovery_draw(node, mode, hessian, noise, params, mean_correction)
        outputs = warm_started([*recovered, mode, success], mode, start)
    else:
        x_star, z, at_z, replacements = sequential
        recovered = recovery_draw(node, z, at_z, noise, params, mean_correction, centre=x_star)
        outputs = graph_replace([*recovered, x_star, success], replacements, strict=False)
    values = [rv.type(name=rv.name) for rv in rvs]
    outputs = replace_variables(outputs, dict(zip(rvs, values, strict=True)))
    cache[key] = pytensor.function(
        [*values, start, noise], outputs, on_unused_input="ignore", mode=compile_mode
    )
    return cache[key]


def outputs_mode_success(values):
    """(the recovered variables, the mode, success) from `recovery_function`'s outputs."""
    return values[:-2], values[-2], values[-1]


def warm_started(outputs, solution, start):
    """`outputs` (graphs of the Laplace mode x* = `solution`) with the inner solve starting at
    `start`.

    The mode does not depend on where Newton starts (up to its tolerance), but the number of
    iterations does: draw after draw, θ moves little, so starting each solve at the previous
    draw's mode takes a few iterations instead of the ~10 from the model's initial point.
    """
    owner = solution.owner
    solver = owner is not None and hasattr(owner.op, "n_controls")
    if not solver or solution not in owner.outputs[: owner.op.n_controls]:
        return outputs  # not a solver Op's solution: the start is unused
    # the same Op applied to the new start of this control (the others, e.g. a KKT system's
    # multipliers, keep theirs); its outputs replace the old ones (a constant start cannot
    # itself be replaced)
    inputs = list(owner.inputs)
    index = owner.outputs.index(solution)
    inputs[index] = start.astype(inputs[index].dtype)
    restarted = owner.op.make_node(*inputs).outputs
    return graph_replace(outputs, dict(zip(owner.outputs, restarted, strict=True)), strict=False)


def recovery_draw(node, mode_in, hessian_in, noise, params, mean_correction, centre=None):
    """Graph of one latent draw of N(c + δ, H⁻¹) at the mode `mode_in` and Hessian `hessian_in`
    of the Laplace `node` (δ as in :func:`mean_shift`, at `mode_in`; c = `centre`, by
    default `mode_in`), mapped through the recovery graph with the parameters `params`: the
    latent variables and their Deterministics."""
    op = node.op
    _, mode, hessian, *_ = node.inputs
    constraint = op.constraint
    mean = mode_in if centre is None else centre
    if mean_correction:
        mean = mean + mean_shift(op.structure, mode, hessian, mode_in, hessian_in, constraint)
    draw = op.structure.sample_gaussian(mean, hessian_in, noise)
    if constraint is not None:  # N(x_c + δ, H⁻¹) conditioned on A z = 0
        draw = krige(op.structure, hessian_in, constraint, draw)
    replace = dict(zip(op.recovery_inputs, [draw, *params], strict=True))
    return replace_variables(op.recovery_outputs, replace)


def mean_shift(structure, mode, hessian, at_mode, at_hessian, constraint=None):
    """E[x | θ, y] − x* to first order in the skewness of p(x | θ, y): δ = −H⁻¹ ∇ₓ ½ log det H(x)
    at x* (`at_mode`, with `at_hessian` = H(x*)), a graph of the hyperparameters.

    Writing −log p(x | θ, y) = ½ δᵀHδ + ⅙ T[δ, δ, δ] + …, E[δ_i] = −½ Σ_a (H⁻¹)_ia Σ_bc T_abc
    (H⁻¹)_bc, and Σ_bc T_abc (H⁻¹)_bc = ∂_a log det H(x). For one Poisson count y with a flat
    prior on the log rate this is −1/(2y), the gap between E[log λ] = ψ(y) − log E and the mode
    log(y / E); it is zero where H does not depend on x (a Gaussian likelihood, where the
    Laplace approximation is exact). The mean correction of INLA's simplified Laplace strategy
    (Rue, Martino & Chopin 2009, §3.2.3) is this term. ∇ₓ log det H costs one reverse pass
    through H(x), which the marginal's own gradient also takes; with a sparse H it needs only
    the selected inverse on H's pattern.
    """
    hessian_of_x = graph_replace(hessian, {mode: at_mode}, strict=False)
    if constraint is None:
        logdet = structure.logdet_positive_definite(hessian_of_x)
    else:  # on {A z = 0}: log det(VᵀHV); the draw is kriged afterwards (P_H H⁻¹ = V(VᵀHV)⁻¹Vᵀ)
        logdet = constrained_logdet(structure, hessian_of_x, constraint)
    slope = grad(
        0.5 * logdet,
        at_mode,
        disconnected_inputs="ignore",  # H constant in x: no correction
    )
    shift = -structure.solve(at_hessian, slope, transposed=False, symmetric=True)
    # at a failed solve's last iterate the correction may not exist: draw around the iterate
    return pt.switch(pt.all(_finite(shift)), shift, pt.zeros_like(shift))


def nearest_neighbour_order(points: np.ndarray) -> list[int]:
    """A visiting order of the rows of `points` (draws × hyperparameters): a greedy
    nearest-neighbour tour from the first draw in standardized coordinates, so that each inner
    solve starts at the mode of a close θ. O(draws²) arithmetic; past 20,000 draws, the order
    along the draws' main axis instead (as `fit_inla` does)."""
    n = points.shape[0]
    if n < 3:
        return list(range(n))
    spread = points.std(axis=0)
    x = (points - points.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    if n > 20_000:
        return main_axis_order(x)
    unvisited = np.ones(n, dtype=bool)
    order, current = [0], 0
    unvisited[0] = False
    for _ in range(n - 1):
        distance = np.where(unvisited, ((x - x[current]) ** 2).sum(axis=1), np.inf)
        current = int(np.argmin(distance))
        unvisited[current] = False
        order.append(current)
    return order


def main_axis_order(points: np.ndarray) -> list[int]:
    """The rows of `points` (draws × hyperparameters) in order of their position along the
    draws' main axis (first principal component)."""
    centred = points - points.mean(axis=0)
    return list(np.argsort(centred @ np.linalg.svd(centred, full_matrices=False)[2][0]))


def initial_mode(node):
    """The inner solve's own starting point (the model's initial point of the latent)."""
    owner = node.inputs[1].owner
    x0 = owner.inputs[0] if owner is not None else None
    if isinstance(x0, Constant):
        return x0.data
    return np.zeros(static_size(node.inputs[1]), dtype=node.inputs[1].dtype)


def store_recovered(marginal_model, posterior, per_chain):
    """Add the recovered variables and ``"<latent>_solved"`` to `posterior` (in place)."""
    op = laplace_node(marginal_model).op
    n_draws = per_chain[0][-1].shape[0]
    import xarray as xr

    for i, (name, dims) in enumerate(zip(op.output_names, op.dims, strict=True)):
        draws = np.stack([out[i] for out in per_chain])
        dims = list(dims or [])
        dim_names = [
            "chain",
            "draw",
            *(dims or [f"{name}_dim_{k}" for k in range(draws.ndim - 2)]),
        ]
        coords = {
            k: np.asarray(marginal_model.coords[k])
            for k in dims
            if marginal_model.coords.get(k) is not None
        }
        posterior[name] = xr.DataArray(draws, dims=dim_names, coords=coords)
    solved = np.stack([np.broadcast_to(out[-1], (n_draws,)) for out in per_chain])
    posterior[f"{'_'.join(op.latent_names)}_solved"] = xr.DataArray(solved, dims=["chain", "draw"])
