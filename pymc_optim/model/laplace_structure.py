"""The layout of the Laplace marginal's H = −∇²ₓℓ: the "auto" policy, checks and memory guard."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import io_toposort

from pymc_optim._memory import available_memory
from pymc_optim._modes import PYTHON_MODE
from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.linalg import detect
from pymc_optim.linalg.low_rank import LowRankUpdateStructure
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
    "dense_memory_estimate",
    "graph_width",
    "refuse_what_will_not_fit",
]

#: Largest latent size whose numerical Hessian pattern "auto" computes (see
#: :mod:`pymc_optim.linalg.detect`). Larger latents get the structural reading only.
AUTO_STRUCTURE_MAX_SIZE = detect.NUMERIC_MAX_SIZE
#: (d, d) float64 matrices a dense marginal holds at its peak (built, compiled as pm.sample
#: compiles it, one logp and gradient), per unit of the log density's width w (its widest
#: latent-dependent intermediate over d: E/d for pairwise differences on E edges), by the
#: backend that compiles it. Measured (benchmarks/bench_memory.py, its README table): a
#: CustomDist ICAR with a soft sum-to-zero penalty on grids of d = 400 … 2,500 (w ≈ 1.95) grows
#: as 31.9 d-matrices + 0.38 GB under numba and 39.3 + 0.05 GB under C, linear in 8 d² from
#: 900 to 2,500. PyTensor's constant folding turns the vectorized reverse pass that builds H
#: into dense (d, E) and (d, d) constants, ~28 matrices the compiled function keeps; the call
#: adds H, its Cholesky factor and the log det's gradient (~13). JAX, unmeasured, gets C's.
_DENSE_COPIES = {"numba": 17, "c": 21}
#: Bytes a dense marginal needs whatever d: numba's compilation of the Newton loop (0.38 GB
#: measured), C's compiled modules (0.05 GB).
_DENSE_BASE = {"numba": 400 * 2**20, "c": 64 * 2**20}
#: (d, d) matrices of a latent-Gaussian marginal (H = Q + diag(w), no vectorized reverse pass
#: over the prior): 12–16 measured for a GP and a pm.ICAR latent of 1,500 and 3,000 values.
_LATENT_GAUSSIAN_COPIES = 16
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
            if isinstance(detected, SparseStructure | LowRankUpdateStructure):
                structure = detected
        if structure is None:
            structure = latent_gaussian_structure(model, latent_rvs)
    d = latent_size(model, latent_rvs, initial_point)
    width = None
    if structure is None:
        if detected is None and requested == "auto" and d >= detect.SPARSE_MIN_SIZE:
            # the graph proves no compact layout: before the numerical pattern (two (d, d)
            # boolean arrays and the index pairs, 3.4 GB at d = 10⁴), the dense estimate
            width = latent_width(model, latent_rvs, d)
            refuse_what_will_not_fit(LinearStructure("dense"), d, width=width)
        structure = detected or detect_hessian_structure(
            model, latent_rvs, initial_point, requested
        )
        if requested == "auto" and method == "newton" and structure.kind == "dense":
            # a Normal latent behind a linear predictor (HSGP's coefficients): Q + Bᵀ W B
            structure = latent_gaussian_structure(model, latent_rvs, normal=True) or structure
    if structure.kind == "dense" and width is None:
        width = latent_width(model, latent_rvs, d)
    refuse_what_will_not_fit(structure, d, width=width or 1.0)
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


def latent_width(model: pm.Model, latent_rvs, d: int) -> float:
    """:func:`graph_width` of the model's log density in the latents' value variables."""
    values = [model.rvs_to_values[rv] for rv in latent_rvs]
    return graph_width(model.logp(jacobian=True), values, d)


def graph_width(output, inputs, d: int) -> float:
    """The widest variable of `output`'s graph that depends on `inputs`, in units of `d` (at
    least 1): the (d, ·) arrays of H's vectorized reverse pass are that wide. Static shapes
    only; a variable of unknown size counts as d."""
    depends = set(inputs)
    widest = d
    for node in io_toposort(list(inputs), [output]):
        if not any(i in depends for i in node.inputs):
            continue
        for out in node.outputs:
            depends.add(out)
            shape = getattr(out.type, "shape", None)
            if shape is not None and None not in shape:
                widest = max(widest, int(np.prod(shape, dtype=np.int64)))
    return widest / max(d, 1)


def compiling_backend() -> str:
    """The backend PyTensor's default mode compiles with: "numba", "jax" or "c"."""
    from pytensor.compile.mode import get_default_mode

    linker = type(get_default_mode().linker).__name__
    return "numba" if linker == "NumbaLinker" else "jax" if linker == "JAXLinker" else "c"


def dense_memory_estimate(
    structure: LinearStructure, d: int, *, width: float = 1.0, backend: str | None = None
) -> int:
    """Bytes a marginal with H of this layout needs at its peak (built, compiled, one logp and
    gradient), over what the process holds before: ``_DENSE_COPIES`` (per backend) · w · 8 d²
    + ``_DENSE_BASE`` for a dense H, ``_LATENT_GAUSSIAN_COPIES`` · 8 d² for a latent-Gaussian
    one, 0 for the layouts that grow linearly in d."""
    if structure.kind == "latent_gaussian":
        return _LATENT_GAUSSIAN_COPIES * 8 * d * d
    if structure.kind != "dense":
        return 0
    backend = backend or compiling_backend()
    key = "numba" if backend == "numba" else "c"
    base = 0 if backend == "none" else _DENSE_BASE[key]  # "none": the (d, d) matrices alone
    return int(_DENSE_COPIES[key] * max(width, 1.0) * 8 * d * d) + base


def refuse_what_will_not_fit(structure: LinearStructure, d: int, *, width: float = 1.0) -> None:
    """A MemoryError, before anything is allocated, when the marginal's (d, d) matrices would
    not fit in the memory this process has left (a dense or latent-Gaussian H; a sparse,
    diagonal or block-diagonal one grows linearly in d). `width`: :func:`graph_width` of the
    log density in the latent (a dense H's vectorized reverse pass holds (d, w·d) arrays)."""
    need = dense_memory_estimate(structure, d, width=width)
    if need == 0:
        return
    available = available_memory()
    if available is None or need <= available:
        return
    gib = 2.0**30
    matrices = dense_memory_estimate(structure, d, width=width, backend="none") / (8.0 * d * d)
    backend = compiling_backend()
    raise MemoryError(
        f"`marginalize_laplace`: the latent has {d:,} values and its Hessian is dense "
        f"({structure.kind!r} structure). Building, compiling ({backend} backend) and "
        f"evaluating the marginal holds about {matrices:.0f} float64 matrices of {d:,} × {d:,} "
        f"at once ({need / gib:.1f} GiB), more than the {available / gib:.1f} GiB of memory "
        "available to this process, so nothing was built. What fits is a sparse Hessian "
        "(memory linear in d): write the field with `pymc_optim.distributions` (ICAR with "
        "`constraint='sum_to_zero'` or `'corner'`, GMRF, RW; extra `sparse`) and pass "
        "`hessian_structure='sparse'`. A soft sum-to-zero penalty (pm.ICAR, "
        "`ICAR(constraint='soft')`, or `-0.5 * (x.sum() / (eps * N))**2` written by hand) is "
        "kept as a rank-one update of a sparse H by `hessian_structure='auto'` where the rest "
        "of the log density is sparse and separable from the sum; where it is not, replace "
        "the penalty by ICAR's exact `constraint='sum_to_zero'`. Otherwise "
        "marginalize fewer values, or run where more memory is free (each sampling process "
        "needs its own)."
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
