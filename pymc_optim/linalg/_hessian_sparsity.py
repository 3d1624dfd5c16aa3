"""The sparsity pattern of a scalar graph's Hessian, read off the graph by index sets.

Each variable v computed from the controls gets a boolean sparse matrix D_v of shape
(size of v, n): row e holds the elements of x that entry e of v depends on. The matrices are
propagated forward through the graph (a copy or an indexing selects rows; a sum or a product with
a constant matrix combines them), and every Op that is nonlinear in x adds to a global pattern
the pairs of elements whose second derivative it can make nonzero:

- an element-wise nonlinear function of entries u: the pairs D_uᵀ D_u (entry by entry);
- a product a · b of two dependent factors: D_aᵀ D_b + D_bᵀ D_a (each factor's own curvature
  was recorded when it was formed);
- anything else nonlinear: the same as an element-wise function of its output.

The pattern is a superset of the Hessian's (it is structural, never evaluated), it costs memory
O(Σ_e |D_v[e]|) per variable and O(nnz) for the pattern, never O(n²), and it gives up (returns
None) on an Op it does not know, on shapes it cannot read at build time, and as soon as the
pattern would exceed a budget of entries (a dense Hessian is not worth reading this way). This is
the classical forward index-set propagation of Hessian sparsity detection (Walther 2008,
"Computing sparse Hessians with automatic differentiation", ACM TOMS 34(1)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.rewriting import inline_ofg_node
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import graph_inputs, io_toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.scalar import basic as ps
from pytensor.tensor import basic as ptb
from pytensor.tensor import subtensor as pts
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.sharedvar import TensorSharedVariable

from pymc_optim._modes import PYTHON_MODE
from pymc_optim.linalg.detect import _COPIES  # the Ops whose entries copy input entries

__all__ = ["hessian_pattern"]

#: Element-wise scalar Ops linear in every argument that depends on x (the others fixed).
_LINEAR = (ps.Add, ps.Sub, ps.Neg, ps.Identity, ps.Cast, ps.Switch)
#: The read that matches each increment Op (its indexed positions).
_INCREMENT_READS = {
    pts.IncSubtensor: lambda op: pts.Subtensor(op.idx_list),
    pts.AdvancedIncSubtensor: lambda op: pts.AdvancedSubtensor(op.idx_list),
}


class _GiveUp(Exception):
    """The graph holds something the reading cannot follow, or the pattern is too dense."""


class _Dependence:
    """The entries' dependence sets: `matrix` (size, n) boolean CSR, entries in C order of
    `shape`."""

    __slots__ = ("matrix", "shape")

    def __init__(self, shape, matrix):
        self.shape = tuple(int(s) for s in shape)
        matrix = sp.csr_array(matrix)
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        self.matrix = sp.csr_array(
            (np.ones(matrix.nnz, dtype=bool), matrix.indices, matrix.indptr), shape=matrix.shape
        )

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def hessian_pattern(
    objective: Variable, xs: Sequence[Variable], sizes: Sequence[int], max_nnz: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The lower-triangle (rows, cols) of a superset of ∇²ₓ objective's pattern, diagonal
    included, for controls `xs` of `sizes` elements flattened and concatenated; None if the
    graph cannot be read or the pattern holds more than `max_nnz` entries (lower triangle)."""
    n = int(sum(sizes))
    reader = _Reader(n, max_nnz)
    if not _start(reader, xs, sizes):
        return None
    try:
        reader.run(objective, xs)
    except _GiveUp:
        return None
    except Exception:  # an Op whose python implementation refuses the labels: not readable
        return None
    pattern = reader.pattern()
    lower = sp.tril(pattern + sp.identity(n, dtype=bool, format="csr"), format="coo")
    order = np.lexsort((lower.row, lower.col))
    return lower.row[order].astype(np.int64), lower.col[order].astype(np.int64)


def jacobian_pattern(
    residuals: Sequence[Variable], xs: Sequence[Variable], sizes: Sequence[int], max_nnz: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The (rows, cols) of a superset of ∂F/∂x's pattern, diagonal included, sorted by row then
    column, for F the flattened and concatenated `residuals` and x the controls `xs` of `sizes`
    elements (F as long as x); None if the graph cannot be read, F's length differs from x's, or
    the pattern holds more than `max_nnz` entries.

    The first-order half of the Hessian reading: F's own dependence sets (row e of D_F holds the
    elements of x that F_e depends on), with no pairs recorded. The diagonal is added so that a
    sparse LU of A (or of A − I, a fixed point's) has every pivot position in its pattern."""
    n = int(sum(sizes))
    reader = _FirstOrderReader(n, max_nnz)
    if not _start(reader, xs, sizes):
        return None
    try:
        for residual in residuals:
            reader.run_outputs([residual], xs)
        found = [reader.known.get(residual) for residual in residuals]
    except _GiveUp:
        return None
    except Exception:  # an Op whose python implementation refuses the labels: not readable
        return None
    rows = []
    for residual, dependence in zip(residuals, found, strict=True):
        size = int(np.prod(_shape_of(residual))) if dependence is None else dependence.size
        rows.append(
            sp.csr_array((size, n), dtype=bool) if dependence is None else dependence.matrix
        )
    pattern = sp.vstack(rows, format="csr") if rows else sp.csr_array((0, n), dtype=bool)
    if pattern.shape[0] != n:
        return None
    pattern = sp.coo_array(pattern + sp.identity(n, dtype=bool, format="csr"))
    if pattern.nnz > max_nnz:
        return None
    order = np.lexsort((pattern.col, pattern.row))
    return pattern.row[order].astype(np.int64), pattern.col[order].astype(np.int64)


def _start(reader, xs, sizes) -> bool:
    """Seed `reader` with the controls: each element of x depends on itself (False if a
    control's shape is not known)."""
    offset = 0
    for x, size in zip(xs, sizes, strict=True):
        shape = _static_shape(x) or ((size,) if x.type.ndim == 1 else None)
        if shape is None or int(np.prod(shape, dtype=np.int64)) != size:
            return False
        eye = sp.csr_array(
            (np.ones(size, dtype=bool), (np.arange(size), offset + np.arange(size))),
            shape=(size, reader.n),
        )
        reader.known[x] = _Dependence(shape, eye)
        offset += size
    return True


class _Reader:
    def __init__(self, n: int, max_nnz: int):
        self.n = n
        self.max_nnz = int(max_nnz)
        self.known: dict[Variable, _Dependence] = {}
        self.pieces: list[sp.csr_array] = []
        self.bound = 0  # an upper bound on the pattern's entries (both triangles)

    # --- the pattern ------------------------------------------------------------------------
    def add_pairs(self, left: sp.csr_array, right: sp.csr_array) -> None:
        """Add the pairs (i, j) with i in left[e] and j in right[e] for some entry e, and the
        transposed pairs."""
        if left.nnz == 0 or right.nnz == 0:
            return
        left_counts = np.diff(left.indptr).astype(np.int64)
        right_counts = np.diff(right.indptr).astype(np.int64)
        # one entry's a × b pairs are distinct: the product alone holds at least the largest,
        # so give up before forming it (a rank-one term's d² pairs: 2.6 GB at d = 10⁴)
        if int((left_counts * right_counts).max()) > 2 * self.max_nnz + 2 * self.n:
            raise _GiveUp("too dense")
        self.bound += 2 * int(left_counts @ right_counts)
        if self.bound > 2 * self.max_nnz + 2 * self.n:
            self.condense()
        product = (left.T.astype(np.float64) @ right.astype(np.float64)).astype(bool)
        self.pieces.append(sp.csr_array(product + product.T))

    def condense(self) -> None:
        total = self.pattern()
        self.pieces = [total]
        self.bound = int(total.nnz)
        if (total.nnz - self.n) / 2 > self.max_nnz:
            raise _GiveUp("too dense")

    def pattern(self) -> sp.csr_array:
        total = sp.csr_array((self.n, self.n), dtype=bool)
        for piece in self.pieces:
            total = total + piece
        return sp.csr_array(total.astype(bool))

    # --- the pass ---------------------------------------------------------------------------
    def run(self, objective, xs) -> None:
        self.run_outputs([objective], xs)
        if (objective.ndim != 0) or (objective in self.known and self.known[objective].size != 1):
            raise _GiveUp("the objective is not a scalar")
        self.condense()

    def run_outputs(self, outputs, xs) -> None:
        """The dependence sets of every variable between `xs` and `outputs`."""
        for node in io_toposort(list(xs), list(outputs)):
            dependent = [self.known.get(i) for i in node.inputs]
            if all(d is None for d in dependent):
                continue
            outputs = [o for o in node.outputs if _differentiable(o)]
            if not outputs:
                continue
            if isinstance(node.op, OpFromGraph):
                # its inner graph rebuilt on the node's inputs (PyTensor's LogSumExp, XLogY,
                # pt.diag are such Ops), read node by node
                inner = inline_ofg_node(node)
                self.run_outputs(inner, node.inputs)
                for out, value in zip(node.outputs, inner, strict=True):
                    if _differentiable(out) and value in self.known:
                        self.known[out] = self.known[value]
                continue
            if isinstance(node.op, ptb.Split):
                for out, found in zip(node.outputs, self.copies(node, dependent), strict=True):
                    self.known[out] = found
                continue
            if len(node.outputs) != 1:
                raise _GiveUp(f"multi-output {node.op}")
            self.known[node.outputs[0]] = self.rule(node, dependent)

    def rule(self, node, dependent) -> _Dependence:
        op = node.op
        out = node.outputs[0]
        if isinstance(op, CheckAndRaise | SpecifyShape):
            if dependent[0] is None:
                raise _GiveUp("a check on an x-dependent condition only")
            return dependent[0]
        if isinstance(op, Elemwise):
            return self.elemwise(node, dependent)
        if isinstance(op, _COPIES):
            return self.copies(node, dependent)[0]
        if type(op) in _INCREMENT_READS:
            return self.increment(node, dependent)
        if isinstance(op, CAReduce):
            reduced = self.reduce(node, dependent[0])
            if not isinstance(op.scalar_op, ps.Add):
                self.add_pairs(reduced.matrix, reduced.matrix)
            return reduced
        if isinstance(op, Dot) or (isinstance(op, Blockwise) and isinstance(op.core_op, Dot)):
            return self.dot(node, dependent)
        raise _GiveUp(f"unknown Op {op} producing {out}")

    # --- rules --------------------------------------------------------------------------------
    def elemwise(self, node, dependent) -> _Dependence:
        out_shape = _elemwise_shape(node, dependent)
        scalar_op = node.op.scalar_op
        parts = {
            i: self.broadcast(d, node.inputs[i], out_shape)
            for i, d in enumerate(dependent)
            if d is not None
        }
        if isinstance(scalar_op, ps.Second):
            # fill(a, b): b's values in a's shape; a only gives the shape
            matrix = parts.get(1, sp.csr_array((int(np.prod(out_shape)), self.n), dtype=bool))
            return _Dependence(out_shape, matrix)
        union = None
        for matrix in parts.values():
            union = matrix if union is None else union + matrix
        result = _Dependence(out_shape, union)
        if isinstance(scalar_op, _LINEAR):
            return result
        if isinstance(scalar_op, ps.Mul):
            if len(parts) == 1:
                return result
            matrices = list(parts.values())
            for a in range(len(matrices)):
                for b in range(a + 1, len(matrices)):
                    self.add_pairs(matrices[a], matrices[b])
            return result
        if isinstance(scalar_op, ps.TrueDiv) and list(parts) == [0]:
            return result
        self.add_pairs(result.matrix, result.matrix)
        return result

    def broadcast(self, dependence: _Dependence, var, out_shape) -> sp.csr_array:
        in_shape = dependence.shape
        if in_shape == tuple(out_shape):
            return dependence.matrix
        if len(in_shape) != len(out_shape):
            raise _GiveUp("elemwise inputs of different ranks")
        labels = np.arange(dependence.size).reshape(in_shape)
        selected = np.broadcast_to(labels, out_shape).ravel()
        return dependence.matrix[selected]

    def copies(self, node, dependent) -> _Dependence:
        """Evaluate the Op on labels: entry k of the stacked dependent inputs is label k + 1,
        x-independent entries 0; the output's labels say which input entry each copies."""
        values, stacked, offset = [], [], 0
        for var, d in zip(node.inputs, dependent, strict=True):
            if d is not None:
                labels = np.arange(offset + 1, offset + d.size + 1).reshape(d.shape)
                values.append(labels.astype(var.type.dtype))
                stacked.append(d.matrix)
                offset += d.size
            elif _differentiable(var):
                shape = _static_shape(var)
                if shape is None:
                    value = _constant_value(var)
                    shape = np.shape(value)
                values.append(np.zeros(shape, dtype=var.type.dtype))
            else:
                values.append(_constant_value(var))
        if offset >= 2**24 and node.outputs[0].type.dtype == "float32":
            raise _GiveUp("too many entries for float32 labels")
        all_rows = sp.vstack(stacked, format="csr")
        out = []
        for labels in _perform(node, values, every_output=True):
            labels = np.asarray(labels).astype(np.int64)
            out.append(_Dependence(labels.shape, _select(all_rows, labels.ravel() - 1, self.n)))
        return out

    def increment(self, node, dependent) -> _Dependence:
        op = node.op
        base = node.inputs[0]
        indices = [_constant_value(i) for i in node.inputs[2:]]
        shape = _static_shape(base) or (None if dependent[0] is None else dependent[0].shape)
        if shape is None:
            shape = np.shape(_constant_value(base))
        size = int(np.prod(shape, dtype=np.int64))
        read = _INCREMENT_READS[type(op)](op)
        labels = np.arange(size, dtype=np.float64).reshape(shape)
        read_node = read.make_node(ptb.as_tensor_variable(labels), *node.inputs[2:])
        positions = np.asarray(_perform(read_node, [labels, *indices])).astype(np.int64)
        if dependent[0] is None:
            matrix = sp.csr_array((size, self.n), dtype=bool)
        else:
            matrix = dependent[0].matrix
        if op.set_instead_of_inc:
            keep = np.ones(size, dtype=bool)
            keep[positions.ravel()] = False
            matrix = sp.csr_array(sp.diags_array(keep.astype(float)) @ matrix.astype(float))
        if dependent[1] is not None:
            y_rows = dependent[1].matrix
            y_labels = np.arange(dependent[1].size).reshape(dependent[1].shape)
            source = np.broadcast_to(y_labels, positions.shape).ravel()
            scatter = sp.csr_array(
                (np.ones(source.size), (positions.ravel(), source)),
                shape=(size, dependent[1].size),
            )
            matrix = matrix.astype(float) + scatter @ y_rows.astype(float)
        return _Dependence(shape, matrix)

    def reduce(self, node, dependence: _Dependence | None) -> _Dependence:
        if dependence is None:
            raise _GiveUp("a reduction of an x-independent value")
        axis = node.op.axis
        ndim = len(dependence.shape)
        if ndim == 0:
            return dependence
        axes = tuple(range(ndim)) if axis is None else tuple(a % ndim for a in axis)
        kept = [k for k in range(ndim) if k not in axes]
        out_shape = tuple(dependence.shape[k] for k in kept)
        index = np.indices(dependence.shape).reshape(ndim, -1)
        target = (
            np.ravel_multi_index(tuple(index[k] for k in kept), out_shape)
            if kept
            else np.zeros(dependence.size, dtype=np.int64)
        )
        size_out = int(np.prod(out_shape, dtype=np.int64))
        reducer = sp.csr_array(
            (np.ones(dependence.size), (target, np.arange(dependence.size))),
            shape=(size_out, dependence.size),
        )
        return _Dependence(out_shape, reducer @ dependence.matrix.astype(float))

    def dot(self, node, dependent) -> _Dependence:
        a, b = node.inputs
        da, db = dependent
        if a.type.ndim > 2 or b.type.ndim > 2:
            raise _GiveUp("a batched matrix product")
        shape_a = da.shape if da is not None else _shape_of(a)
        shape_b = db.shape if db is not None else _shape_of(b)
        as_matrix_a = shape_a if len(shape_a) == 2 else (1, shape_a[0])
        as_matrix_b = shape_b if len(shape_b) == 2 else (shape_b[0], 1)
        m, k = as_matrix_a
        j = as_matrix_b[1]
        out_shape = tuple(
            [m] * (len(shape_a) == 2) + [j] * (len(shape_b) == 2)
        )  # numpy's rule for 1-d operands
        if da is not None and db is not None:
            # bilinear: entry (i, j) depends on row i of a and column j of b
            rows_a = _kron_rows(da.matrix, m, k, j, left=True)
            rows_b = _kron_rows(db.matrix, k, j, m, left=False)
            self.add_pairs(rows_a, rows_b)
            return _Dependence(out_shape, rows_a + rows_b)
        if da is not None:
            nonzero_b = _nonzero(b, as_matrix_b)
            # out[i, j] = Σ_k a[i, k] b[k, j]: rows of a combined by the columns of b
            selector = sp.kron(sp.identity(m), sp.csr_array(nonzero_b.T), format="csr")
            return _Dependence(out_shape, selector @ da.matrix.astype(float))
        nonzero_a = _nonzero(a, as_matrix_a)
        selector = sp.kron(sp.csr_array(nonzero_a), sp.identity(j), format="csr")
        return _Dependence(out_shape, selector @ db.matrix.astype(float))


# --- helpers ---------------------------------------------------------------------------------


def _differentiable(var) -> bool:
    dtype = getattr(var.type, "dtype", "")
    return dtype.startswith("float") or dtype.startswith("complex")


def _static_shape(var):
    shape = getattr(var.type, "shape", None)
    if shape is None or None in shape:
        return None
    return tuple(int(s) for s in shape)


class _FirstOrderReader(_Reader):
    """The dependence sets alone (a Jacobian's pattern): no second-order pairs are recorded."""

    def add_pairs(self, left, right) -> None:
        return None


def _shape_of(var):
    shape = _static_shape(var)
    if shape is None:
        shape = np.shape(_constant_value(var))
    return shape


def _constant_value(var):
    """The value of an x-independent input that only constants and shared variables feed
    (indices, shapes, constant matrices); otherwise give up."""
    if isinstance(var, Constant):
        return var.data
    if isinstance(var, TensorSharedVariable):
        return var.get_value(borrow=True)
    roots = list(graph_inputs([var]))
    if not all(isinstance(r, Constant | TensorSharedVariable) for r in roots):
        raise _GiveUp(f"{var} is not a constant of the graph")
    # each Op's perform, in order, without compiling (no rewrites, no C module cache); except
    # that a cast is numpy's: PyTensor's Elemwise{Cast}.perform calls a Python function per entry
    values = {r: _constant_value(r) for r in roots}
    try:
        for node in io_toposort(roots, [var]):
            inputs = [values[i] for i in node.inputs]
            if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, ps.Cast):
                outputs = [np.asarray(inputs[0]).astype(node.outputs[0].type.dtype)]
            else:
                outputs = _perform(node, inputs, every_output=True)
            values.update(zip(node.outputs, outputs, strict=True))
    except NotImplementedError:  # an Op without a Python implementation: compile it
        import pytensor

        return pytensor.function([], var, mode=PYTHON_MODE)()
    return values[var]


def _perform(node, values, every_output=False):
    storage = [[None] for _ in node.outputs]
    node.op.perform(node, list(values), storage)
    return [cell[0] for cell in storage] if every_output else storage[0][0]


def _elemwise_shape(node, dependent):
    shape = _static_shape(node.outputs[0])
    if shape is not None:
        return shape
    ndim = node.outputs[0].type.ndim
    out = [1] * ndim
    for var, d in zip(node.inputs, dependent, strict=True):
        in_shape = d.shape if d is not None else None
        for k in range(ndim):
            if in_shape is not None:
                size = in_shape[k]
            elif var.type.shape[k] is not None:
                size = var.type.shape[k]
            elif var.type.broadcastable[k]:
                size = 1
            else:
                raise _GiveUp("an element-wise output of unknown shape")
            out[k] = max(out[k], int(size))
    return tuple(out)


def _select(rows: sp.csr_array, index: np.ndarray, n: int) -> sp.csr_array:
    """Rows `index` of `rows`, zero rows where `index` is −1."""
    present = index >= 0
    selector = sp.csr_array(
        (np.ones(int(present.sum())), (np.flatnonzero(present), index[present])),
        shape=(index.size, rows.shape[0]),
    )
    return selector @ rows.astype(float)


def _nonzero(var, as_matrix_shape):
    try:
        value = _constant_value(var)
    except _GiveUp:
        return np.ones(as_matrix_shape, dtype=float)  # a parameter: every entry may be nonzero
    return (np.asarray(value) != 0).reshape(as_matrix_shape).astype(float)


def _kron_rows(matrix, rows, inner, other, *, left):
    """Dependence of out[i, j] on all of row i of a (left) or column j of b (right)."""
    if left:  # a is (rows, inner): out[i, j] ← a[i, :]
        combine = sp.kron(sp.identity(rows), np.ones((1, inner)), format="csr")
        per_row = combine @ matrix.astype(float)  # (rows, n)
        return sp.csr_array(sp.kron(per_row, np.ones((other, 1)), format="csr"))
    # b is (rows=inner, inner=j): out[i, j] ← b[:, j]
    combine = sp.kron(np.ones((1, rows)), sp.identity(inner), format="csr")
    per_column = combine @ matrix.astype(float)  # (j, n)
    return sp.csr_array(sp.kron(np.ones((other, 1)), per_column, format="csr"))
