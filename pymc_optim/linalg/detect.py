"""The layout of A = ∂F/∂x read off the graph: one detection for the solvers and the Laplace model.

Two readings, the first always, the second where values exist to evaluate the graph at:

1. **Structural** (:func:`hessian_structure`, :func:`jacobian_structure`): one pass over the
   graph's nodes, independent of the size n of x (no compilation, no evaluation, no memory in
   n; choosing a block size is O(√n) integer arithmetic), so it works for x of unknown static
   shape, symbolic x0, several controls and under `vectorize_graph` (the structure is decided
   on the core problem). Each variable v computed from x gets a class (:class:`_Dep`,
   :class:`_Sum` or full) recording what is known:

   - *local* (with a key): every entry of v depends on at most one element of x, and two
     variables with the same key read the same element at the same entry (an element-wise
     expression of x keeps x's key; an indexing, reshaping or broadcasting gets a new key,
     equal for the same operation on the same key and index variables);
   - *rows*: every entry ``v[r, …]`` depends only on group r of a grouping of a control's
     leading axis (the rows of a matrix-shaped x, a vector reshaped into rows of b, a constant
     slice of them), kept by element-wise Ops, products ``v @ C``, reductions inside rows and
     Blockwise Ops batched over the rows (PyMC's MvNormal of a (G, b) value solves row by row);
   - *span*: the whole of v depends only on a constant interval of a control's leading axis
     (constant indices and slices, and then any Op of such values);
   - *sum*: every entry of v is a sum of terms each depending on one element, one group or one
     span (a sum of local or row-wise entries, a linear map, a linear combination of such);
   - *full*: anything else (a nonlinear function of a sum, a product of two differently indexed
     copies of x, an Op the analysis does not know applied to values without a common span).

   A scalar objective that is local or a sum of element-local terms has a diagonal Hessian; a
   sum of terms on groups and spans has a block-diagonal one, with the smallest block size of
   the packed x (dividing its size) whose aligned blocks hold every group and span — which needs
   the controls' sizes (static shapes, or x0's). Equations F whose pieces are local with their
   own control's key (F_i reads x_i only) have a diagonal Jacobian, and pieces shaped like a
   matrix-shaped control whose row r reads row r of the control a block-diagonal one.
   Values that are not floating point (comparisons, indices, PyMC's parameter checks) have no
   derivative and count as independent of x. The reading is conservative: "dense" means "not
   proved otherwise", never "known to be dense".

2. **Numerical** (:func:`numeric_pattern`): the exact pattern of A at random points, from n
   vector–Jacobian products compiled as one vectorized function and evaluated in chunks of
   ``PROBE_CHUNK`` directions. Structural zeros of the graph are exact zeros in floating point,
   while an entry vanishing at two random points would be a coincidence. It needs values for
   every input (the Laplace marginal has the model's initial point) and an (n, n) boolean array,
   so it runs only up to ``NUMERIC_MAX_SIZE`` elements; it finds the layouts the structural
   reading cannot prove (e.g. a Gaussian prior whose precision happens to be diagonal or
   block-diagonal, given as a dense matrix).

Explicit structures are verified once at build time (:func:`verify_structure`): when the
structural reading proves the Jacobian fits the given structure, nothing more is done; otherwise,
where values exist, the numerical pattern is computed and a structure that drops nonzero entries
is a ValueError naming them.

Build-time cost (measured in ``benchmarks/bench_user_graphs.py``): the structural reading is
linear in the number of graph nodes and does not depend on n; the numerical pattern costs one
compilation plus n reverse passes per point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.rewriting import inline_ofg_node
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import io_toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.scalar import basic as ps
from pytensor.tensor import basic as ptb
from pytensor.tensor import subtensor as pts
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.linalg import CholeskySolve, Solve, SolveTriangular
from pytensor.tensor.math import Dot, Sum
from pytensor.tensor.shape import Reshape, SpecifyShape

from pymc_optim._modes import PYTHON_MODE
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
    "resolve_hessian_structure",
    "resolve_structure",
    "sparse_hessian_structure",
    "sparse_jacobian_structure",
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
class _Dep:
    """A variable computed from x, with what is known of how its entries depend on x.

    - `key`: every entry depends on at most one element of x, and equal keys read equal
      elements at equal entries (None: not known);
    - `rows`: a grouping ``(i, b, s)`` of control i's leading axis into groups of b consecutive
      entries starting at s; every entry ``v[r, …]`` depends on group r only (None: not known);
    - `span`: ``(i, lo, hi)``: the whole variable depends only on the entries lo ≤ k < hi of
      control i's leading axis (None: not known).
    """

    key: object = None
    rows: tuple | None = None
    span: tuple | None = None


@dataclass(frozen=True)
class _Sum:
    """Every entry is a sum of terms, each depending on one element of x, or on one group of a
    grouping in `groups` (``("rows", grouping)``), or on one span in `groups` (``("span", span)``);
    `span` as in :class:`_Dep` for the whole variable."""

    groups: frozenset = frozenset()
    span: tuple | None = None


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
    pts.AdvancedSubtensor,
    ptb.Alloc,
    ptb.Join,
    ptb.Split,
    ptb.ExtractDiag,
    ptb.MakeVector,
    ptb.TensorFromScalar,
    ptb.ScalarFromTensor,
)
_INCREMENTS = (pts.IncSubtensor, pts.AdvancedIncSubtensor)
#: Linear in their right-hand side (input 1) when the matrix (input 0) does not depend on x.
_LINEAR_SOLVES = (Solve, SolveTriangular, CholeskySolve)


def hessian_structure(
    objective: Variable, xs: Sequence[Variable], shapes: Sequence[tuple] | None = None
) -> LinearStructure:
    """The layout of ∇²ₓ objective proved by the graph: diagonal, block-diagonal or dense
    (= not proved).

    Block-diagonal layouts are those of a sum of terms each depending on one group of
    consecutive elements of the packed x: the rows of a matrix-shaped x (row-wise terms, then a
    sum), a vector reshaped into rows, or constant slices and indices of x (a sum of per-group
    objectives). Their block size needs the controls' sizes: their static shapes, or `shapes`.
    """
    kind = _classify([objective], xs).get(objective)
    if kind is None:
        return LinearStructure("diagonal")
    if isinstance(kind, _Dep):
        if kind.key is not None:
            return LinearStructure("diagonal")
        if kind.span is None:
            return LinearStructure("dense")
        kind = _Sum(frozenset({("span", kind.span)}))
    if not isinstance(kind, _Sum):
        return LinearStructure("dense")
    return _block_layout(kind.groups, xs, shapes)


def jacobian_structure(
    residual: Sequence[Variable], xs: Sequence[Variable], shapes: Sequence[tuple] | None = None
) -> LinearStructure:
    """The layout of ∂F/∂x (F the flattened concatenation of `residual`) proved by the graph.

    Diagonal when there is one piece per control, each piece reading its control element by
    element (same shape, no broadcasting); block-diagonal when a piece shaped like a
    matrix-shaped control computes each row from the same row of the control; else dense
    (= not proved).
    """
    residual, xs = list(residual), list(xs)
    if len(residual) != len(xs):
        return LinearStructure("dense")
    classes = _classify(residual, xs)
    groups = set()
    for i, (piece, x) in enumerate(zip(residual, xs, strict=True)):
        kind = classes.get(piece)
        if kind is None:
            continue  # a piece independent of x: zero rows, still diagonal
        if not isinstance(kind, _Dep) or piece.type.broadcastable != x.type.broadcastable:
            return LinearStructure("dense")
        if kind.key == ("control", i):
            continue
        if kind.rows != (i, 1, 0):
            return LinearStructure("dense")
        groups.add(("rows", kind.rows))
    return _block_layout(frozenset(groups), xs, shapes)


def _classify(outputs, xs) -> dict:
    # a control's entry r (along its leading axis) is its own group r
    classes: dict = {
        x: _Dep(key=("control", i), rows=(i, 1, 0) if x.type.ndim >= 1 else None)
        for i, x in enumerate(xs)
    }
    _classify_nodes(io_toposort(list(xs), list(outputs)), classes)
    return classes


def _classify_nodes(nodes, classes: dict) -> None:
    for node in nodes:
        inputs = [classes.get(i) for i in node.inputs]
        if all(c is None for c in inputs):
            continue
        if isinstance(node.op, OpFromGraph):
            # its inner graph rebuilt on the node's inputs (PyTensor's LogSumExp, XLogY, pt.diag
            # are such Ops), read node by node
            inner = inline_ofg_node(node)
            _classify_nodes(io_toposort(list(node.inputs), inner), classes)
            for out, value in zip(node.outputs, inner, strict=True):
                if _differentiable(out) and value in classes:
                    classes[out] = classes[value]
            continue
        kind = _FULL if _FULL in inputs else _rule(node, inputs)
        if kind == _FULL:
            # whatever the Op, its outputs depend only on what its inputs depend on
            span = _common_span(c for c in inputs if c is not None)
            kind = _FULL if span is None else _Dep(span=span)
        for out in node.outputs:
            if _differentiable(out):
                classes[out] = kind


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
        return _copy(node, inputs, dependent)
    if isinstance(op, _INCREMENTS):
        if op.set_instead_of_inc and all(_is_local(c) for _, c in dependent):
            return _Dep(key=_structural_key(node, inputs))
        return _linear([c for _, c in dependent])
    if isinstance(op, CAReduce):
        return _reduce(node, inputs[0])
    if isinstance(op, Dot) or (isinstance(op, Blockwise) and _is_matmul(op)):
        if len(dependent) != 1:
            return _FULL
        [(i, c)] = dependent
        if i == 0 and isinstance(c, _Dep) and c.rows and node.inputs[0].ndim == 2:
            return _Dep(rows=c.rows, span=c.span)  # row r of X C is row r of X times C
        return _linear([c])
    if isinstance(op, Blockwise) and (rows := _batched_rows(node, dependent)) is not None:
        # entry r of a batch axis is computed from entry r of the inputs only
        return _Dep(rows=rows, span=_common_span(c for _, c in dependent))
    core = op.core_op if isinstance(op, Blockwise) else op
    if isinstance(core, _LINEAR_SOLVES) and [i for i, _ in dependent] == [1]:
        return _linear([c for _, c in dependent])
    return _FULL


def _batched_rows(node, dependent):
    """The common rows of a Blockwise's x-dependent inputs when their leading axis is a batch
    axis (not broadcast against the output's), else None: PyMC's MvNormal solves row by row."""
    out = node.outputs[0]
    batch_ndim = node.op.batch_ndim(node)
    rows = set()
    for i, c in dependent:
        x = node.inputs[i]
        core_ndim = len(node.op.inputs_sig[i])
        aligned = (
            batch_ndim >= 1
            and x.ndim - core_ndim == batch_ndim
            and x.type.broadcastable[0] == out.type.broadcastable[0]
        )
        rows.add(c.rows if aligned and isinstance(c, _Dep) else None)
    return rows.pop() if len(rows) == 1 else None


def _is_matmul(op) -> bool:
    return isinstance(op.core_op, Dot)


def _is_local(c) -> bool:
    return isinstance(c, _Dep) and c.key is not None


def _common_span(classes):
    """The hull of the classes' spans if they all have one on the same control, else None."""
    spans = [getattr(c, "span", None) for c in classes]
    if not spans or None in spans or len({i for i, _, _ in spans}) != 1:
        return None
    return (spans[0][0], min(lo for _, lo, _ in spans), max(hi for _, _, hi in spans))


def _groups(c):
    """The terms of c as a sum (see :class:`_Sum`), or None when c is no such sum."""
    if isinstance(c, _Sum):
        return c.groups
    if not isinstance(c, _Dep):
        return None
    if c.key is not None:
        return frozenset()
    if c.rows is not None:
        return frozenset({("rows", c.rows)})
    if c.span is not None:
        return frozenset({("span", c.span)})
    return None


def _linear(classes):
    """A linear combination of `classes` (entry by entry, or summed)."""
    groups = [_groups(c) for c in classes]
    if None in groups:
        return _FULL
    return _Sum(frozenset().union(*groups), _common_span(classes))


def _elemwise(node, inputs, dependent):
    out_broadcastable = node.outputs[0].type.broadcastable
    keys, rows = set(), set()
    for i, c in dependent:
        if _is_local(c):
            pattern = node.inputs[i].type.broadcastable
            keys.add(c.key if pattern == out_broadcastable else ("broadcast", c.key, pattern))
        else:
            keys.add(None)
        aligned = (
            isinstance(c, _Dep)
            and c.rows is not None
            and node.inputs[i].type.broadcastable[:1] == out_broadcastable[:1]
        )
        rows.add(c.rows if aligned else None)
    key = keys.pop() if len(keys) == 1 else None
    row = rows.pop() if len(rows) == 1 else None
    span = _common_span(c for _, c in dependent)
    scalar_op = node.op.scalar_op
    linear = isinstance(scalar_op, _LINEAR_SCALAR) or (
        isinstance(scalar_op, ps.Mul) and len(dependent) == 1
    )
    if isinstance(scalar_op, _LINEAR_IN_FIRST) and [i for i, _ in dependent] == [0]:
        linear = True
    if key is not None or row is not None:
        return _Dep(key=key, rows=row, span=span)
    if linear:
        # a sum of separate terms, more precise than the hull of their spans
        return _linear([c for _, c in dependent])
    return _FULL  # (the caller keeps the span)


def _copy(node, inputs, dependent):
    """Copies of entries: an element-wise key, rows kept where the leading axis is, spans of
    constant indices into the leading axis."""
    if not all(isinstance(c, _Dep) for _, c in dependent):
        return _linear([c for _, c in dependent])
    key = None
    if all(_is_local(c) for _, c in dependent):
        key = _structural_key(node, inputs)
    rows, span = None, _common_span(c for _, c in dependent)
    source = inputs[0]
    if len(dependent) == 1 and dependent[0][0] == 0:
        rows, span = _leading_axis(node, source, span)
    if key is None and rows is None and span is None:
        return _linear([c for _, c in dependent])
    return _Dep(key=key, rows=rows, span=span)


def _leading_axis(node, c, span):
    """(rows, span) of a copy of `c` (the Op's only x-dependent input, its first)."""
    op = node.op
    x, out = node.inputs[0], node.outputs[0]
    if c.rows is None or x.ndim == 0:
        return None, span
    i, b, s = c.rows
    if isinstance(op, DimShuffle):
        return (c.rows if out.ndim >= 1 and op.new_order[0] == 0 else None), span
    if isinstance(op, Reshape):
        # element by element (b = 1), a vector reshaped into rows of `size` entries
        shape = _constant_shape(node.inputs[1])
        if b == 1 and x.ndim == 1 and shape is not None and len(shape) >= 2:
            size = int(np.prod(shape[1:]))
            if all(d is not None and d > 0 for d in shape[1:]):
                return (i, size, s), span
        return None, span
    if isinstance(op, pts.Subtensor):
        indices = pts.get_idx_list(node.inputs, op.idx_list)
        first = indices[0] if indices else slice(None)
        if first == slice(None):
            return c.rows, span
        bounds = _constant_bounds(first)
        if bounds is None:
            return None, span
        lo, hi = bounds
        group_span = (i, s + lo * b, s + hi * b)
        return ((i, b, s + lo * b) if isinstance(first, slice) else None), group_span
    return None, span


def _reduce(node, c):
    """A reduction: sums are linear; any reduction keeps rows it does not reduce over."""
    x = node.inputs[0]
    axes = tuple(range(x.ndim)) if node.op.axis is None else tuple(node.op.axis)
    if isinstance(c, _Dep) and c.rows is not None and 0 not in axes:
        return _Dep(rows=c.rows, span=c.span)
    if isinstance(node.op, Sum):
        return _linear([c])
    return _FULL  # max, prod, …: each entry a nonlinear function of several elements


def _constant(var):
    if not isinstance(var, Variable):
        return int(var)  # an index given as a Python integer
    try:
        return int(ptb.get_underlying_scalar_constant_value(var))
    except NotScalarConstantError:
        return None


def _constant_shape(var):
    """The entries of a shape vector (None where not constant), or None if not known."""
    if isinstance(var, Constant):
        return [int(d) for d in np.ravel(var.data)]
    if var.owner is not None and isinstance(var.owner.op, ptb.MakeVector):
        return [_constant(d) for d in var.owner.inputs]
    return None


def _constant_bounds(index):
    """(lo, hi) of a constant index or step-1 slice with non-negative constant bounds."""
    if isinstance(index, slice):
        if index.step is not None and _constant(index.step) != 1:
            return None
        lo = 0 if index.start is None else _constant(index.start)
        hi = None if index.stop is None else _constant(index.stop)
        if lo is None or hi is None or lo < 0 or hi < lo:
            return None
        return lo, hi
    g = _constant(index)
    return None if g is None or g < 0 else (g, g + 1)


def _structural_key(node, inputs):
    """Equal for the same copying Op applied to the same keys and the same other inputs."""
    return (
        node.op,
        tuple(c.key if _is_local(c) else v for v, c in zip(node.inputs, inputs, strict=True)),
    )


def _block_layout(groups, xs, shapes) -> LinearStructure:
    """The smallest block size of the packed x whose blocks hold every group of `groups`
    (diagonal when there is none; dense when the sizes are unknown or no block size fits)."""
    if not groups:
        return LinearStructure("diagonal")
    sizes = []
    for k, x in enumerate(xs):
        shape = x.type.shape
        if None in shape and shapes is not None and k < len(shapes):
            shape = tuple(shapes[k])
        if None in shape:
            return LinearStructure("dense")
        sizes.append(tuple(int(d) for d in shape))
    row_size = [int(np.prod(s[1:], dtype=int)) if s else 1 for s in sizes]
    offset = np.concatenate([[0], np.cumsum([int(np.prod(s, dtype=int)) for s in sizes])])
    n = int(offset[-1])
    # every group as (period p, start a, stop e) in packed elements: rows tile [a, e) by p
    tiles = []
    for what, (i, *rest) in groups:
        u = row_size[i]
        if what == "rows":
            b, s = rest
            tiles.append((b * u, offset[i] + s * u, offset[i + 1]))
        else:
            lo, hi = rest
            tiles.append((None, offset[i] + lo * u, offset[i] + hi * u))
    for block in _divisors(n):
        if all(_holds(block, *tile) for tile in tiles):
            if block == 1:
                return LinearStructure("diagonal")
            if block == n:
                break
            return LinearStructure("block_diagonal", block)
    return LinearStructure("dense")


def _holds(block, period, start, stop) -> bool:
    """Whether every aligned block of `block` elements holds each group of the tile."""
    if period is None:  # one group [start, stop)
        return stop <= start or start // block == (stop - 1) // block
    return block % period == 0 and start % period == 0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(np.sqrt(n)) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


# --- structures as layouts -------------------------------------------------------------------


def fits(inner: LinearStructure, outer: LinearStructure) -> bool:
    """Whether every matrix with layout `inner` also has layout `outer` (a low-rank update or
    KKT structure is built by the package for the graph it is verified against)."""
    if outer.kind in ("dense", "sparse_low_rank", "bordered") or inner.kind == "diagonal":
        return True
    if outer.kind in ("diagonal", "arrowhead"):  # an arrowhead is verified on the pattern
        return False
    return inner.kind == "block_diagonal" and outer.block_size % inner.block_size == 0


def dropped_entries(structure: LinearStructure, pattern: np.ndarray) -> np.ndarray:
    """The (row, column) pairs of nonzero `pattern` entries outside `structure`'s layout."""
    rows, cols = np.nonzero(pattern)
    if structure.kind == "dense":
        keep = np.ones(rows.shape, dtype=bool)
    elif structure.kind == "diagonal":
        keep = rows == cols
    elif structure.kind == "sparse":  # the structure's own pattern
        from pymc_optim.linalg.sparse_lu import SparseJacobianStructure

        pairs = zip(structure.pattern.rows.tolist(), structure.pattern.cols.tolist(), strict=True)
        stated = set(pairs)
        if not isinstance(structure, SparseJacobianStructure):  # a symmetric A's lower triangle
            stated |= {(j, i) for i, j in stated}
        keep = np.array([(i, j) in stated for i, j in zip(rows, cols, strict=True)], dtype=bool)
    elif structure.kind == "arrowhead":
        keep = structure.holds(rows, cols)
    else:
        keep = rows // structure.block_size == cols // structure.block_size
    return np.stack([rows[~keep], cols[~keep]], axis=1)


# --- the numerical reading -------------------------------------------------------------------


def numeric_pattern(
    vjp: Callable[[object, np.ndarray], np.ndarray],
    n: int,
    points: Sequence,
    on_chunk: Callable[[], None] | None = None,
) -> np.ndarray | None:
    """The nonzero pattern of A (n × n) at `points`, or None if no point gives finite values.

    `vjp(point, W)` must return Wᵀ-products Aᵀ applied to the rows of `W` (shape (k, n)) at
    `point`, as rows: row r is (Aᵀ W_r)ᵀ = W_r A. The union over the first two finite points is
    returned; points with a non-finite product are skipped. `on_chunk()` is called after each
    call of `vjp` (a progress bar: ⌈n / PROBE_CHUNK⌉ calls per point). Memory: two (n, n)
    boolean arrays and one chunk of products, never an (n, n) array of floats.
    """
    pattern, found = np.zeros((n, n), dtype=bool), 0
    for point in points:
        at_point = np.zeros((n, n), dtype=bool)
        for start in range(0, n, PROBE_CHUNK):
            k = min(PROBE_CHUNK, n - start)
            directions = np.zeros((k, n))
            directions[np.arange(k), start + np.arange(k)] = 1.0
            rows = vjp(point, directions)
            if on_chunk is not None:
                on_chunk()
            if not np.all(np.isfinite(rows)):
                break
            at_point[start : start + k] = rows != 0
        else:
            pattern |= at_point
            found += 1
            if found == 2:
                return pattern
    return pattern if found else None


def _sizes_unknown(argument: str) -> ValueError:
    return ValueError(
        f"`{argument}='sparse'` needs the size of `x` when the graph is built; `x` has no "
        "static shape and `x0` gives none. Give `x` a static shape (e.g. "
        "`pt.vector('x', shape=(n,))`) or a numeric `x0`."
    )


def sparse_jacobian_structure(residual: Sequence[Variable], xs, sizes, *, argument: str):
    """A :class:`~pymc_optim.linalg.sparse_lu.SparseJacobianStructure` on the pattern of ∂F/∂x
    read off the graph (the dependence sets of F's entries; memory O(nnz)), for an explicit
    ``"sparse"`` of a root or fixed point; a ValueError naming `argument` where x's size is
    unknown or the pattern cannot be read."""
    if sizes is None:
        raise _sizes_unknown(argument)
    from pymc_optim.linalg import _hessian_sparsity
    from pymc_optim.linalg.sparse_lu import JacobianPattern, SparseJacobianStructure

    n = int(sum(sizes))
    found = _hessian_sparsity.jacobian_pattern(list(residual), xs, sizes, max_nnz=n * n)
    if found is None:
        raise ValueError(
            f"`{argument}='sparse'`: the Jacobian's sparsity pattern cannot be read off the graph "
            "(it holds an Op the structural reading does not follow, or an index that is not a "
            f"constant). Pass `{argument}='dense'`."
        )
    return SparseJacobianStructure(pattern=JacobianPattern(*found, n))


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
    sparse factorization within that fraction of the dense one's flops. A pattern that is an
    arrowhead (a few dense rows around a diagonal or block-diagonal part: fixed effects stacked
    with random effects) gets its own layout instead, from ``arrowhead.AUTO_MIN_SIZE``
    elements on (:class:`~pymc_optim.linalg.arrowhead.ArrowheadStructure`): a sparse layout
    would build it from n Hessian-vector products. With ``required=True``
    (an explicit ``"sparse"``) any readable pattern is used, and an unreadable one is a
    ValueError naming `argument`.
    """
    if sizes is None:
        if not required:
            return None
        raise _sizes_unknown(argument)
    from pymc_optim.linalg import _cholesky, _hessian_sparsity
    from pymc_optim.linalg.arrowhead import arrowhead_hessian_structure, arrowhead_of_pattern

    n = int(sum(sizes))
    triangle = n * (n + 1) // 2
    if not required and (n < SPARSE_MIN_SIZE or _cholesky.numba is None):
        # below SPARSE_MIN_SIZE only an arrowhead (fixed effects around random effects) pays
        return arrowhead_hessian_structure(objective, xs, sizes)
    budget = int(SPARSE_MAX_DENSITY * triangle)
    found = _hessian_sparsity.hessian_pattern(objective, xs, sizes, budget)
    if found is None:  # dense, or sparse but for a few sums of x: S + Jᵀ C J
        from pymc_optim.linalg.low_rank import low_rank_hessian_structure

        split = low_rank_hessian_structure(objective, xs, sizes, budget)
        if split is not None:
            flops = split.sparse.pattern._analysis().factor_flops
            return split if required or flops <= SPARSE_MAX_DENSITY * n**3 / 3 else None
        if not required:  # an arrowhead too dense for the sparse budget (n < 40 (p + 1))
            return arrowhead_hessian_structure(objective, xs, sizes)
    if found is not None and not required:
        # a distance-2 colouring of an arrowhead needs n colours: its own layout takes b + p
        arrow = arrowhead_of_pattern(*found, n)
        if arrow is not None:
            return arrow
    if found is None and required:
        found = _hessian_sparsity.hessian_pattern(objective, xs, sizes, triangle)
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


def _control_sizes(xs, shapes) -> list[int] | None:
    """The sizes of the controls, from their static shapes or else `shapes` (`_x0_shapes`);
    None where one is unknown at build time."""
    shapes = shapes if shapes is not None else [x.type.shape for x in xs]
    if any(None in shape for shape in shapes):
        return None
    return [int(np.prod(shape, dtype=int)) for shape in shapes]


# --- the solvers' entry point -------------------------------------------------------------------


def resolve_structure(
    structure,
    problem,
    *,
    residual: Sequence[Variable],
    objective: Variable | None = None,
    x0=None,
    argument: str = "structure",
    what: str = "A = ∂F/∂x",
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
    what : str, optional
        How the error of a wrong explicit structure names the matrix.
    """
    xs = problem.inner_xs
    shapes = _x0_shapes(x0, xs)
    pattern = lambda: _solver_pattern(problem, residual, x0)
    if objective is not None:
        return resolve_hessian_structure(
            structure, objective, xs, shapes=shapes, pattern=pattern, argument=argument, what=what
        )
    if structure == SPARSE:  # a root's or fixed point's Jacobian: no symmetry, a sparse LU
        sizes = _control_sizes(xs, shapes)
        if sizes is not None and shapes is not None:
            residual, _, xs = _with_shapes(residual, None, xs, shapes)
        return sparse_jacobian_structure(residual, xs, sizes, argument=argument)
    proved = jacobian_structure(residual, xs, shapes)
    if structure == AUTO:
        return proved
    verify_structure(structure, proved, pattern, argument=argument, what=what)
    return structure


def resolve_hessian_structure(
    structure,
    objective: Variable,
    xs: Sequence[Variable],
    *,
    shapes: Sequence[tuple] | None = None,
    pattern: Callable[[], np.ndarray | None],
    argument: str = "structure",
    what: str = "A = ∂F/∂x",
) -> LinearStructure:
    """The layout of ∇²ₓ `objective`: the one policy of the solvers and the Laplace marginal.

    ``"sparse"``: a sparse layout on the pattern read off the graph
    (:func:`sparse_hessian_structure`, a ValueError naming `argument` where it cannot be read).
    ``"auto"``: the structural reading (:func:`hessian_structure`) where it proves a diagonal
    or block-diagonal layout; else a sparse layout where it pays; else ``"dense"``, which
    means "not proved by the graph" (a caller with values for every input may then probe the
    pattern numerically, as the Laplace marginal does). An explicit structure is verified:
    against the structural reading, then, where that does not prove it, against `pattern()`
    (:func:`verify_structure`).

    Parameters
    ----------
    structure : "auto", "sparse" or LinearStructure
    objective : Variable
        The scalar whose Hessian in `xs` is the matrix.
    xs : sequence of Variable
        The controls.
    shapes : sequence of tuple, optional
        The controls' shapes where their static types leave them unknown (x0's).
    pattern : callable
        The numerical pattern of the matrix (:func:`numeric_pattern`), or None where it
        cannot be computed; called only to verify an explicit structure.
    argument, what : str
        How the errors name the argument and the matrix.
    """
    sizes = _control_sizes(xs, shapes)
    if structure == SPARSE:
        if sizes is not None and shapes is not None:
            _, objective, xs = _with_shapes([], objective, xs, shapes)
        return sparse_hessian_structure(objective, xs, sizes, required=True, argument=argument)
    proved = hessian_structure(objective, xs, shapes)
    if structure == AUTO:
        if proved.kind == "dense" and sizes is not None:
            if shapes is not None:
                _, objective, xs = _with_shapes([], objective, xs, shapes)
            found = sparse_hessian_structure(objective, xs, sizes)
            if found is not None:
                return found
        return proved
    verify_structure(structure, proved, pattern, argument=argument, what=what)
    return structure


def _with_shapes(residual, objective, xs, shapes):
    """`residual`, `objective` and `xs` on stand-ins of the controls with `shapes` (x0's) as
    static shapes: the structural reading follows sizes through the graph, which a control
    without a static shape (``pt.vector("x")``) leaves unknown."""
    from pytensor.graph.replace import clone_replace

    typed = [x.type.clone(shape=shape)(name=x.name) for x, shape in zip(xs, shapes, strict=True)]
    replace = dict(zip(xs, typed, strict=True))
    # rebuilt node by node (rebuild_strict=False), so that the shapes reach every output type
    outputs = clone_replace(
        [*residual, *([] if objective is None else [objective])], replace, rebuild_strict=False
    )
    if objective is None:
        return outputs, None, typed
    return outputs[:-1], outputs[-1], typed


def _x0_shapes(x0, xs) -> list[tuple] | None:
    """The controls' shapes, from their static types or else from x0's (None if unknown)."""
    if x0 is None:
        return None
    import pytensor.tensor as pt

    x0s = list(x0) if isinstance(x0, list | tuple) else [x0]
    if len(x0s) != len(xs):
        return None
    shapes = []
    for x, start in zip(xs, x0s, strict=True):
        try:
            shape = pt.as_tensor_variable(start).type.shape
        except (TypeError, ValueError):
            return None
        if len(shape) != x.type.ndim:
            return None  # x0 broadcast to x: its shape says nothing
        known = zip(x.type.shape, shape, strict=True)
        shapes.append(tuple(d if d is not None else s for d, s in known))
    return shapes


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
            [*xs, *params, W],
            vectorize_graph(rows, {w: W}),
            on_unused_input="ignore",
            mode=PYTHON_MODE,
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
