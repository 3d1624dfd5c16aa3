"""The layout of A = ∂F/∂x read off the graph: one detection for the solvers and the Laplace model.

Two readings, the first always, the second where values exist to evaluate the graph at:

1. **Structural** (:func:`hessian_structure`, :func:`jacobian_structure`): one pass over the
   graph's nodes, independent of the size n of x (no compilation, no evaluation, no memory in n),
   so it works for x of unknown static shape, symbolic x0, several controls and under
   `vectorize_graph` (the structure is decided on the core problem). Each variable v computed
   from x gets a class:

   - *local* (with a key): every entry of v depends on at most one element of x, and two
     variables with the same key read the same element at the same entry (an element-wise
     expression of x keeps x's key; an indexing, reshaping or broadcasting gets a new key,
     equal for the same operation on the same key and index variables);
   - *additive*: every entry of v is a sum of terms each depending on one element of x (a sum
     of local entries, a linear map of x, a linear combination of such);
   - *full*: anything else (a nonlinear function of an additive quantity, a product of two
     differently indexed copies of x, an Op the analysis does not know).

   A scalar objective that is local or additive has a diagonal Hessian; equations F whose
   pieces are local with their own control's key (F_i reads x_i only) have a diagonal Jacobian.
   Values that are not floating point (comparisons, indices, PyMC's parameter checks) have no
   derivative and count as independent of x. The reading is conservative: "dense" means "not
   proved otherwise", never "known to be dense".

2. **Numerical** (:func:`numeric_pattern`): the exact pattern of A at random points, from n
   vector–Jacobian products compiled as one vectorized function and evaluated in chunks of
   ``PROBE_CHUNK`` directions. Structural zeros of the graph are exact zeros in floating point,
   while an entry vanishing at two random points would be a coincidence. It needs values for
   every input (the Laplace marginal has the model's initial point) and an (n, n) boolean array,
   so it runs only up to ``NUMERIC_MAX_SIZE`` elements; it finds block-diagonal layouts and
   diagonal ones the structural reading cannot prove (e.g. a Gaussian prior whose precision
   happens to be diagonal).

Explicit structures are verified once at build time (:func:`verify_structure`): when the
structural reading proves the Jacobian fits the given structure, nothing more is done; otherwise,
where values exist, the numerical pattern is computed and a structure that drops nonzero entries
is a ValueError naming them.

Build-time cost (``benchmarks/bench_user_graphs.py``): the structural reading is linear in the
number of graph nodes, about 1 ms for the Poisson random-intercepts objective whatever n; the
numerical pattern costs one compilation (≈ 0.3–1 s) plus n reverse passes per point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import io_toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.scalar import basic as ps
from pytensor.tensor import basic as ptb
from pytensor.tensor import subtensor as pts
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot, Sum
from pytensor.tensor.shape import Reshape, SpecifyShape
from pytensor.tensor.slinalg import CholeskySolve, Solve, SolveTriangular

from pymc_optim.linalg.structure import LinearStructure

__all__ = [
    "AUTO",
    "NUMERIC_MAX_SIZE",
    "PROBE_CHUNK",
    "SPARSE",
    "SPARSE_MAX_DENSITY",
    "SPARSE_MIN_SIZE",
    "dropped_entries",
    "fits",
    "hessian_structure",
    "jacobian_structure",
    "numeric_pattern",
    "resolve_structure",
    "sparse_hessian_structure",
    "verify_structure",
]

#: The `structure=` value that asks for detection (the default of every graph-native solver).
AUTO = "auto"

#: Largest n whose numerical (n, n) pattern is computed: a boolean array of 10⁸ bytes, and n
#: reverse passes per point. Above it only the structural reading runs (dense if it proves
#: nothing), so detection memory stays O(graph size) for large n.
NUMERIC_MAX_SIZE = 10_000
#: Vector–Jacobian products per compiled call when probing the pattern (bounds the memory of one
#: call to PROBE_CHUNK · n numbers).
PROBE_CHUNK = 128
#: At most this many dropped entries are listed in an error message.
_SHOWN_ENTRIES = 6


# --- the structural reading ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Local:
    """Every entry depends on at most one element of x; equal keys read equal elements."""

    key: object


_ADDITIVE = "additive"
_FULL = "full"

#: Element-wise scalar Ops linear in each argument that depends on x (given the others fixed).
_LINEAR_SCALAR = (ps.Add, ps.Sub, ps.Neg, ps.Identity, ps.Cast, ps.Switch, ps.Second)
#: Linear in their first argument only (the others must not depend on x).
_LINEAR_IN_FIRST = (ps.TrueDiv, ps.IntDiv)
#: Ops whose output entries are copies of input entries (or constants).
_COPIES = (
    DimShuffle,
    Reshape,
    pts.Subtensor,
    pts.AdvancedSubtensor1,
    pts.AdvancedSubtensor,
    ptb.Alloc,
    ptb.Join,
    ptb.Split,
    ptb.ExtractDiag,
    ptb.MakeVector,
    ptb.TensorFromScalar,
    ptb.ScalarFromTensor,
)
_INCREMENTS = (pts.IncSubtensor, pts.AdvancedIncSubtensor1, pts.AdvancedIncSubtensor)
#: Linear in their right-hand side (input 1) when the matrix (input 0) does not depend on x.
_LINEAR_SOLVES = (Solve, SolveTriangular, CholeskySolve)


def hessian_structure(objective: Variable, xs: Sequence[Variable]) -> LinearStructure:
    """The layout of ∇²ₓ objective proved by the graph: diagonal or dense (= not proved)."""
    classes = _classify([objective], xs)
    kind = classes.get(objective)
    if kind is None or isinstance(kind, _Local) or kind == _ADDITIVE:
        return LinearStructure("diagonal")
    return LinearStructure("dense")


def jacobian_structure(residual: Sequence[Variable], xs: Sequence[Variable]) -> LinearStructure:
    """The layout of ∂F/∂x (F the flattened concatenation of `residual`) proved by the graph.

    Diagonal when there is one piece per control, each piece reading its control element by
    element (same shape, no broadcasting), else dense (= not proved).
    """
    residual, xs = list(residual), list(xs)
    if len(residual) != len(xs):
        return LinearStructure("dense")
    classes = _classify(residual, xs)
    for i, (piece, x) in enumerate(zip(residual, xs, strict=True)):
        kind = classes.get(piece)
        if kind is None:
            continue  # a piece independent of x: zero rows, still diagonal
        if kind != _Local(("control", i)) or piece.type.broadcastable != x.type.broadcastable:
            return LinearStructure("dense")
    return LinearStructure("diagonal")


def _classify(outputs, xs) -> dict:
    classes: dict = {x: _Local(("control", i)) for i, x in enumerate(xs)}
    for node in io_toposort(list(xs), list(outputs)):
        inputs = [classes.get(i) for i in node.inputs]
        if all(c is None for c in inputs):
            continue
        kind = _FULL if _FULL in inputs else _rule(node, inputs)
        for out in node.outputs:
            if _differentiable(out):
                classes[out] = kind
    return classes


def _differentiable(var) -> bool:
    dtype = getattr(var.type, "dtype", "")
    return dtype.startswith("float") or dtype.startswith("complex")


def _rule(node, inputs):
    """The class of `node`'s outputs given its inputs' classes (no input is full)."""
    op = node.op
    dependent = [(i, c) for i, c in enumerate(inputs) if c is not None]
    if isinstance(op, CheckAndRaise | SpecifyShape):
        return inputs[0]  # the value passes through; the conditions have no derivative
    if isinstance(op, Elemwise):
        return _elemwise(node, inputs, dependent)
    if isinstance(op, _COPIES):
        if all(isinstance(c, _Local) for _, c in dependent):
            return _Local(_structural_key(node, inputs))
        return _ADDITIVE
    if isinstance(op, _INCREMENTS):
        if op.set_instead_of_inc and all(isinstance(c, _Local) for _, c in dependent):
            return _Local(_structural_key(node, inputs))
        return _ADDITIVE
    if isinstance(op, Sum):
        return _ADDITIVE
    if isinstance(op, CAReduce):
        return _FULL  # max, prod, …: each entry a nonlinear function of several elements
    if isinstance(op, Dot) or (isinstance(op, Blockwise) and _is_matmul(op)):
        return _ADDITIVE if len(dependent) == 1 else _FULL
    core = op.core_op if isinstance(op, Blockwise) else op
    if isinstance(core, _LINEAR_SOLVES) and [i for i, _ in dependent] == [1]:
        return _ADDITIVE
    return _FULL


def _is_matmul(op) -> bool:
    return isinstance(op.core_op, Dot)


def _elemwise(node, inputs, dependent):
    out_broadcastable = node.outputs[0].type.broadcastable
    keys = set()
    for i, c in dependent:
        if isinstance(c, _Local):
            pattern = node.inputs[i].type.broadcastable
            keys.add(c.key if pattern == out_broadcastable else ("broadcast", c.key, pattern))
        else:
            keys.add(None)
    if len(keys) == 1 and None not in keys:
        return _Local(keys.pop())
    scalar_op = node.op.scalar_op
    if isinstance(scalar_op, _LINEAR_SCALAR) or (
        isinstance(scalar_op, ps.Mul) and len(dependent) == 1
    ):
        return _ADDITIVE
    if isinstance(scalar_op, _LINEAR_IN_FIRST) and [i for i, _ in dependent] == [0]:
        return _ADDITIVE
    return _FULL


def _structural_key(node, inputs):
    """Equal for the same copying Op applied to the same keys and the same other inputs."""
    return (
        node.op,
        tuple(
            c.key if isinstance(c, _Local) else v for v, c in zip(node.inputs, inputs, strict=True)
        ),
    )


# --- structures as layouts -------------------------------------------------------------------


def fits(inner: LinearStructure, outer: LinearStructure) -> bool:
    """Whether every matrix with layout `inner` also has layout `outer`."""
    if outer.kind == "dense" or inner.kind == "diagonal":
        return True
    if outer.kind == "diagonal":
        return False
    return inner.kind == "block_diagonal" and outer.block_size % inner.block_size == 0


def dropped_entries(structure: LinearStructure, pattern: np.ndarray) -> np.ndarray:
    """The (row, column) pairs of nonzero `pattern` entries outside `structure`'s layout."""
    rows, cols = np.nonzero(pattern)
    if structure.kind == "dense":
        keep = np.ones(rows.shape, dtype=bool)
    elif structure.kind == "diagonal":
        keep = rows == cols
    elif structure.kind == "sparse":  # the structure's own pattern (its lower triangle)
        lower_rows, lower_cols = np.maximum(rows, cols), np.minimum(rows, cols)
        pairs = zip(structure.pattern.rows.tolist(), structure.pattern.cols.tolist(), strict=True)
        stated = set(pairs)
        stated |= {(j, i) for i, j in stated}
        keep = np.array(
            [(i, j) in stated for i, j in zip(lower_rows, lower_cols, strict=True)], dtype=bool
        )
    else:
        keep = rows // structure.block_size == cols // structure.block_size
    return np.stack([rows[~keep], cols[~keep]], axis=1)


# --- the numerical reading -------------------------------------------------------------------


def numeric_pattern(
    vjp: Callable[[object, np.ndarray], np.ndarray], n: int, points: Sequence
) -> np.ndarray | None:
    """The nonzero pattern of A (n × n) at `points`, or None if no point gives finite values.

    `vjp(point, W)` must return Wᵀ-products Aᵀ applied to the rows of `W` (shape (k, n)) at
    `point`, as rows: row r is (Aᵀ W_r)ᵀ = W_r A. The union over the first two finite points is
    returned; points with a non-finite product are skipped.
    """
    pattern, found = np.zeros((n, n), dtype=bool), 0
    for point in points:
        rows = [vjp(point, np.eye(n)[i : i + PROBE_CHUNK]) for i in range(0, n, PROBE_CHUNK)]
        product = np.concatenate(rows)
        if not np.all(np.isfinite(product)):
            continue
        pattern |= product != 0
        found += 1
        if found == 2:
            return pattern
    return pattern if found else None


def verify_structure(
    structure: LinearStructure,
    proved: LinearStructure,
    pattern: Callable[[], np.ndarray | None],
    *,
    argument: str,
    what: str = "A = ∂F/∂x",
) -> None:
    """Raise a ValueError if explicit `structure` drops nonzero entries of the Jacobian.

    `proved` is the structural reading; when it fits `structure` nothing is evaluated.
    Otherwise `pattern()` gives the numerical pattern (None when it cannot be computed: the
    structure is then trusted, as documented by the solvers).
    """
    if fits(proved, structure):
        return
    found = pattern()
    if found is None:
        return
    dropped = dropped_entries(structure, found)
    if dropped.size == 0:
        return
    shown = ", ".join(f"({i}, {j})" for i, j in dropped[:_SHOWN_ENTRIES].tolist())
    more = f" and {len(dropped) - _SHOWN_ENTRIES} more" if len(dropped) > _SHOWN_ENTRIES else ""
    layout = structure.kind + (
        f" with block_size={structure.block_size}" if structure.kind == "block_diagonal" else ""
    )
    raise ValueError(
        f"`{argument}={structure.kind!r}` drops nonzero entries of {what}: the {layout} layout "
        f"has no room for the entries (row, column) {shown}{more}, which are nonzero at random "
        f"points of the graph. The result would be silently wrong. Pass `{argument}='auto'` "
        f"(detected here: {_describe(found)}) or `'dense'`."
    )


def structure_of_pattern(pattern: np.ndarray) -> LinearStructure:
    """The most compact layout holding every nonzero of `pattern` (and of its transpose)."""
    from pymc_optim.linalg.structure import structure_from_pattern

    return structure_from_pattern(pattern | pattern.T)


def _describe(pattern) -> str:
    s = structure_of_pattern(pattern)
    return s.kind + (f" with block_size={s.block_size}" if s.kind == "block_diagonal" else "")


# --- sparse Hessians --------------------------------------------------------------------------

#: The `structure=` / `hessian_structure=` value that asks for a sparse Hessian whose pattern is
#: read off the graph.
SPARSE = "sparse"
#: Fewest elements for which "auto" takes a sparse layout: below it a dense Cholesky costs
#: well under a millisecond and the dense path is the simpler one.
SPARSE_MIN_SIZE = 256
#: "auto" takes the sparse layout when the Hessian's lower triangle holds at most this fraction
#: of its n(n+1)/2 entries *and* the sparse Cholesky factorization (after the fill-reducing
#: ordering) costs at most this fraction of the dense one's n³/3 flops: 4-neighbour grids give
#: 0.003 at n = 289 and 3·10⁻⁵ at n = 10⁴, a dense-ish graph far more.
SPARSE_MAX_DENSITY = 0.05


def sparse_hessian_structure(
    objective: Variable,
    xs: Sequence[Variable],
    sizes: Sequence[int] | None,
    *,
    required: bool = False,
    argument: str = "structure",
):
    """A :class:`~pymc_optim.linalg.sparse.SparseStructure` on the pattern of ∇²ₓ objective read
    off the graph (index sets, :mod:`pymc_optim.linalg._hessian_sparsity`; memory O(nnz), never
    O(n²)), or None.

    With ``required=False`` (what ``"auto"`` asks) the structure comes back only when it pays:
    n ≥ ``SPARSE_MIN_SIZE``, the numba backend installed, the layout neither diagonal nor
    block-diagonal, the pattern within ``SPARSE_MAX_DENSITY`` of a full triangle and the
    sparse factorization within that fraction of the dense one's flops. With ``required=True``
    (an explicit ``"sparse"``) any readable pattern is used, and an unreadable one is a
    ValueError naming `argument`.
    """
    if sizes is None:
        if not required:
            return None
        raise ValueError(
            f"`{argument}='sparse'` needs the size of `x` when the graph is built; `x` has no "
            "static shape and `x0` gives none. Give `x` a static shape (e.g. "
            "`pt.vector('x', shape=(n,))`) or a numeric `x0`."
        )
    from pymc_optim.linalg import _cholesky, _hessian_sparsity

    n = int(sum(sizes))
    triangle = n * (n + 1) // 2
    if not required:
        if n < SPARSE_MIN_SIZE or _cholesky.numba is None:
            return None
        budget = int(SPARSE_MAX_DENSITY * triangle)
    else:
        budget = triangle
    found = _hessian_sparsity.hessian_pattern(objective, xs, sizes, budget)
    if found is None:
        if not required:
            return None
        raise ValueError(
            f"`{argument}='sparse'`: the Hessian's sparsity pattern cannot be read off the "
            "graph (it holds an Op the structural reading does not follow, or an index that is "
            "not a constant). Pass a `SparseStructure` with the pattern explicitly "
            "(`SparseStructure.from_edges(edges, n)` or `SparseStructure(pattern=...)`), or "
            f"`{argument}='dense'`."
        )
    rows, cols = found
    if not required and _lower_layout(rows, cols, n).kind != "dense":
        return None  # diagonal or block-diagonal: the compact dense layouts are cheaper
    from pymc_optim.linalg.sparse import SparsePattern, SparseStructure

    pattern = SparsePattern(rows, cols, n)
    if not required and pattern._analysis().factor_flops > SPARSE_MAX_DENSITY * n**3 / 3:
        return None
    return SparseStructure(pattern=pattern)


def _lower_layout(rows: np.ndarray, cols: np.ndarray, n: int) -> LinearStructure:
    """`structure_from_pattern` for a pattern given by its lower-triangle entries (no (n, n)
    array): diagonal, block-diagonal with the smallest block size, or dense."""
    off = rows != cols
    if not off.any():
        return LinearStructure("diagonal")
    r, c = rows[off], cols[off]
    smallest = int((r - c).max()) + 1  # a block holds both ends of its longest coupling
    for b in range(max(2, smallest), n // 2 + 1):
        if n % b == 0 and np.all(r // b == c // b):
            return LinearStructure("block_diagonal", b)
    return LinearStructure("dense")


def _control_sizes(xs, x0) -> list[int] | None:
    """The sizes of the controls, from their static shapes or the numeric initial guess."""
    import pytensor.tensor as pt

    x0s = None if x0 is None else (list(x0) if isinstance(x0, list | tuple) else [x0])
    sizes = []
    for i, x in enumerate(xs):
        if None not in x.type.shape:
            sizes.append(int(np.prod(x.type.shape, dtype=int)))
            continue
        if x0s is None or i >= len(x0s):
            return None
        try:
            start = np.asarray(pt.as_tensor_variable(x0s[i]).eval())
        except Exception:  # a symbolic x0 that needs inputs: no size at build time
            return None
        if start.ndim != x.type.ndim:
            return None
        sizes.append(int(start.size))
    return sizes


# --- the solvers' entry point -------------------------------------------------------------------


def resolve_structure(
    structure,
    problem,
    *,
    residual: Sequence[Variable],
    objective: Variable | None = None,
    x0=None,
    argument: str = "structure",
) -> LinearStructure:
    """The structure a solver uses: detected for ``"auto"``, else the explicit one verified.

    Parameters
    ----------
    structure : "auto" or LinearStructure
        As validated by :func:`pymc_optim.linalg.structure.as_linear_structure`.
    problem : InnerProblem
        The solver's inner graph (controls and parameters).
    residual : sequence of Variable
        The pieces of F on the inner variables.
    objective : Variable, optional
        For minimization: the scalar whose Hessian is A (read structurally instead of F).
    x0 : the user's initial guess, optional
        Fixes the size of controls without a static shape for the numerical check.
    """
    xs = problem.inner_xs
    if structure == SPARSE:
        if objective is None:
            raise ValueError(
                f"`{argument}='sparse'` is for minimization (a symmetric positive definite "
                "Hessian); a root or fixed-point Jacobian is not symmetric. Use "
                f"`{argument}='auto'` or `'dense'`."
            )
        sizes = _control_sizes(xs, x0)
        return sparse_hessian_structure(objective, xs, sizes, required=True, argument=argument)
    if objective is not None:
        proved = hessian_structure(objective, xs)
    else:
        proved = jacobian_structure(residual, xs)
    if structure == AUTO:
        if proved.kind == "dense" and objective is not None:
            found = sparse_hessian_structure(objective, xs, _control_sizes(xs, x0))
            if found is not None:
                return found
        return proved
    verify_structure(
        structure,
        proved,
        lambda: _solver_pattern(problem, residual, x0),
        argument=argument,
    )
    return structure


#: Random parameter values of the numerical check: positive and of order one, so that the
#: usual scale parameters (σ in a log or a division) give finite values.
_PARAMETER_RANGE = (0.5, 1.5)
#: The controls are jittered by this much around x0 (or 0), away from special points.
_CONTROL_JITTER = 0.5
#: Seed of the random points (detection is deterministic).
_SEED = 20261201


def _solver_pattern(problem, residual, x0) -> np.ndarray | None:
    """The numerical pattern of a solver's A, when every input's shape is known at build time
    and every parameter is a float (random values for index arrays would be meaningless)."""
    import pytensor
    import pytensor.tensor as pt

    from pymc_optim.linalg.structure import _concat_flat

    xs, params = problem.inner_xs, problem.inner_params
    x0s = None if x0 is None else (list(x0) if isinstance(x0, list | tuple) else [x0])
    starts = []
    for i, x in enumerate(xs):
        start = None
        if x0s is not None and i < len(x0s):
            try:
                start = np.asarray(pt.as_tensor_variable(x0s[i]).eval(), dtype=x.type.dtype)
            except Exception:  # a symbolic x0 that needs inputs: no values at build time
                start = None
        if start is None and None not in x.type.shape:
            start = np.zeros(x.type.shape, dtype=x.type.dtype)
        if start is None:
            return None
        starts.append(np.broadcast_to(start, start.shape if None in x.type.shape else x.type.shape))
    if any(None in p.type.shape or not _differentiable(p) for p in params):
        return None
    n = sum(s.size for s in starts)
    if n > NUMERIC_MAX_SIZE:
        return None
    F = _concat_flat(residual)
    w = pt.vector("w", dtype=F.type.dtype)
    W = pt.matrix("W", dtype=F.type.dtype)
    from pytensor.gradient import grad
    from pytensor.graph.replace import vectorize_graph

    rows = _concat_flat(grad((F * w).sum(), xs, disconnected_inputs="ignore"))
    try:
        fn = pytensor.function(
            [*xs, *params, W], vectorize_graph(rows, {w: W}), on_unused_input="ignore"
        )
    except Exception:  # an Op without a vectorized gradient: trust the explicit structure
        return None
    rng = np.random.default_rng(_SEED)

    def points():
        for _ in range(4):
            x_values = [
                (s + rng.uniform(-_CONTROL_JITTER, _CONTROL_JITTER, s.shape)).astype(s.dtype)
                for s in starts
            ]
            p_values = [
                rng.uniform(*_PARAMETER_RANGE, p.type.shape).astype(p.type.dtype) for p in params
            ]
            yield x_values, p_values

    def vjp(point, directions):
        x_values, p_values = point
        try:
            return np.asarray(fn(*x_values, *p_values, directions.astype(F.type.dtype)))
        except Exception:  # e.g. a parameter check raising at the random point
            return np.full(directions.shape, np.nan)

    # rows of the result are W_r A (vector–Jacobian products): the pattern of A itself
    return numeric_pattern(vjp, n, points())
