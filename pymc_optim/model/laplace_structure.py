"""The layout of the Laplace marginal's H = −∇²ₓℓ: the "auto" policy, checks and memory guard."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph

from pymc_optim._memory import available_memory
from pymc_optim._modes import PYTHON_MODE
from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.linalg import detect
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure
from pymc_optim.model.laplace_joint import split
from pymc_optim.model.latent_gaussian import latent_gaussian_structure

__all__ = [
    "AUTO_STRUCTURE_MAX_SIZE",
    "check_kriged_structure",
    "choose_hessian_structure",
    "detect_hessian_structure",
    "kriged_structure",
    "latent_size",
    "refuse_what_will_not_fit",
]

#: Largest latent size whose numerical Hessian pattern "auto" computes (see
#: :mod:`pymc_optim.linalg.detect`). Larger latents get the structural reading only.
AUTO_STRUCTURE_MAX_SIZE = detect.NUMERIC_MAX_SIZE
#: (d, d) float64 matrices a dense or latent-Gaussian marginal holds at its peak while compiled
#: and evaluated (logp and gradient): 12–16 measured for a GP and a pm.ICAR latent of 1,500 and
#: 3,000 values (peak resident memory less the model's, over 8 d² bytes).
_DENSE_COPIES = 16
#: The numerical Hessian pattern shows a progress bar from this many compiled calls on (latents
#: of more than 4 · PROBE_CHUNK = 512 elements): below, it takes about a second.
_PROBE_PROGRESS_CALLS = 10


def choose_hessian_structure(
    model: pm.Model, latent_rvs, initial_point: dict, requested, *, method: str
) -> LinearStructure:
    """The layout of H for latents without a linear constraint: `requested` verified, or for
    ``"auto"`` chosen (see the Notes of :func:`pymc_optim.marginalize_laplace`).

    With the graph-native Newton solver, ``"auto"`` prefers, in turn: a sparse layout for a
    latent of at least ``SPARSE_MIN_SIZE`` values whose Hessian pattern the graph proves sparse;
    H = Q + diag(w) or K⁻¹ + diag(w) where the prior can be read
    (:func:`pymc_optim.model.latent_gaussian.latent_gaussian_structure`); the detected layout
    (:func:`detect_hessian_structure`); and, where that is dense, H = Q + Bᵀ W B for a Normal
    latent behind a linear predictor. Other solvers get the detected layout.

    Raises
    ------
    ValueError
        When an explicit `requested` drops nonzero entries of H.
    MemoryError
        When a dense H would not fit in the memory left (:func:`refuse_what_will_not_fit`).
    """
    structure = detected = None
    if requested == "auto" and method == "newton":
        if latent_size(model, latent_rvs, initial_point) >= detect.SPARSE_MIN_SIZE:
            # the graph's readings only: the numerical pattern (n reverse passes, each through
            # the whole prior) is for latents without a prior to read
            detected = detect_hessian_structure(
                model, latent_rvs, initial_point, requested, numeric=False
            )
            if isinstance(detected, SparseStructure):
                structure = detected
        if structure is None:
            structure = latent_gaussian_structure(model, latent_rvs)
    if structure is None:
        structure = detected or detect_hessian_structure(
            model, latent_rvs, initial_point, requested
        )
        if requested == "auto" and method == "newton" and structure.kind == "dense":
            # a Normal latent behind a linear predictor (HSGP's coefficients): Q + Bᵀ W B
            structure = latent_gaussian_structure(model, latent_rvs, normal=True) or structure
    refuse_what_will_not_fit(structure, latent_size(model, latent_rvs, initial_point))
    return structure


def detect_hessian_structure(
    model: pm.Model,
    latent_rvs,
    start: dict,
    structure="auto",
    seed: int = 20261130,
    numeric: bool = True,
) -> LinearStructure | None:
    """The layout of −∇²ℓ in the flat unconstrained latent: detected for ``"auto"``, else the
    explicit `structure` verified (a ValueError if it drops nonzero entries).

    The solvers' policy, :func:`pymc_optim.linalg.detect.resolve_hessian_structure`: the
    graph's structural reading first (no compilation), then a sparse layout where the graph's
    pattern makes it pay. Where the graph proves nothing, the numerical pattern
    (:func:`pymc_optim.linalg.detect.numeric_pattern`) at random points of the model: each
    variable jittered uniformly in (−1, 1) around its initial value in the unconstrained space
    (a structure can depend on the hyperparameters too). With ``numeric=False`` and ``"auto"``,
    None where the graph's readings prove nothing.
    """
    values = [model.rvs_to_values[rv] for rv in latent_rvs]
    shapes = [np.shape(start[v.name]) for v in values]
    d = sum(int(np.prod(shape, dtype=int)) for shape in shapes)
    z = pt.vector("z", dtype=values[0].dtype, shape=(d,))
    logp = graph_replace(
        model.logp(jacobian=True), dict(zip(values, split(z, shapes), strict=True)), strict=False
    )

    def pattern():
        if d > detect.NUMERIC_MAX_SIZE:
            return None
        gradient = grad(logp, z)
        direction = z.type("direction")
        directions = pt.matrix("directions", dtype=z.dtype)
        hvp = vectorize_graph(grad((gradient * direction).sum(), z), {direction: directions})
        others = [v for v in model.value_vars if v not in values]
        fn = pytensor.function(
            [z, *others, directions], hvp, on_unused_input="ignore", mode=PYTHON_MODE
        )
        rng = np.random.default_rng(seed)

        def points():
            for _ in range(8):  # two finite points, with a few retries at jitters that fail
                point = {
                    name: value + rng.uniform(-1, 1, np.shape(value)).astype(value.dtype)
                    if np.issubdtype(np.asarray(value).dtype, np.floating)
                    else value
                    for name, value in start.items()
                }
                flat = np.concatenate([np.ravel(point[v.name]) for v in values]).astype(z.dtype)
                yield flat, [point[v.name] for v in others]

        calls = 2 * -(-d // detect.PROBE_CHUNK)  # at two points, when both are finite
        with Progress(
            calls >= _PROBE_PROGRESS_CALLS,
            f"hessian_structure='auto': reading the {d} × {d} Hessian's pattern",
            calls,
        ) as progress:
            return detect.numeric_pattern(
                lambda point, rows: fn(point[0], *point[1], rows.astype(z.dtype)),
                d,
                points(),
                on_chunk=progress.advance,
            )

    found = detect.resolve_hessian_structure(
        structure,
        logp,
        [z],
        pattern=pattern,
        argument="hessian_structure",
        what="the Hessian of the log density in the latent",
    )
    if structure != "auto" or found.kind != "dense":
        return found
    # "auto" where the graph proves nothing: the model has values for every input to probe
    if not numeric:
        return None
    if d > detect.NUMERIC_MAX_SIZE:
        warnings.warn(
            f"`hessian_structure='auto'`: the latent has {d} elements, more than "
            f"{detect.NUMERIC_MAX_SIZE}, and the graph alone does not prove a diagonal Hessian; "
            "using 'dense'. Pass `hessian_structure` explicitly.",
            PymcOptimWarning,
            stacklevel=4,
        )
        return LinearStructure("dense")
    found = pattern()
    return LinearStructure("dense") if found is None else detect.structure_of_pattern(found)


def latent_size(model: pm.Model, latent_rvs, start: dict) -> int:
    """The number of unconstrained latent values (`start`: the model's initial point)."""
    return sum(int(np.size(start[model.rvs_to_values[rv].name])) for rv in latent_rvs)


def refuse_what_will_not_fit(structure: LinearStructure, d: int) -> None:
    """A MemoryError, before anything is allocated, when the marginal's (d, d) matrices would
    not fit in the memory this process has left (a dense or latent-Gaussian H; a sparse,
    diagonal or block-diagonal one grows linearly in d)."""
    if structure.kind not in ("dense", "latent_gaussian"):
        return
    need = _DENSE_COPIES * 8 * d * d
    available = available_memory()
    if available is None or need <= available:
        return
    gib = 2.0**30
    raise MemoryError(
        f"`marginalize_laplace`: the latent has {d:,} values and its Hessian is dense "
        f"({structure.kind!r} structure). Compiling and evaluating the marginal holds about "
        f"{_DENSE_COPIES} float64 matrices of {d:,} × {d:,} at once ({need / gib:.1f} GiB), "
        f"more than the {available / gib:.1f} GiB of memory available to this process, so "
        "nothing was built. For a Gaussian Markov random field (ICAR, BYM2, random walks, a "
        "sparse precision) write the latent with `pymc_optim.distributions` (ICAR, GMRF, RW; "
        "extra `sparse`) and pass `hessian_structure='sparse'`; otherwise marginalize fewer "
        "values, or run where more memory is free (each sampling process needs its own)."
    )


def check_kriged_structure(requested, latent_rvs, blocks) -> None:
    """A constrained latent is kriged on a dense or sparse H (module constraints)."""
    kind = requested if isinstance(requested, str) else requested.kind
    if kind not in ("auto", "dense", "sparse"):
        names = [rv.name for rv, block in zip(latent_rvs, blocks, strict=True) if block is not None]
        raise ValueError(
            f"`hessian_structure` must be 'auto', 'dense' or 'sparse' when a latent carries a "
            f"linear constraint ({names}: a sum-to-zero intrinsic field, integrated over "
            f"{{A x = 0}} by kriging, whose prior couples its values); got {kind!r}. Pass "
            "`hessian_structure='auto'`."
        )


def kriged_structure(requested, objective, z, d: int) -> LinearStructure:
    """H's layout for a kriged latent, read off the objective in the N coordinates."""
    kind = requested if isinstance(requested, str) else requested.kind
    if kind == "dense":
        return LinearStructure("dense")
    if kind == "sparse" and isinstance(requested, SparseStructure):
        return requested
    found = detect.sparse_hessian_structure(
        objective, [z], [d], required=kind == "sparse", argument="hessian_structure"
    )
    return LinearStructure("dense") if found is None else found
