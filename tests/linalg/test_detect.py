"""`pymc_optim.linalg.detect`: the structural reading of Hessians and Jacobians.

Each layout the reading proves is checked against the exact Hessian (or Jacobian) evaluated at
a random point: the proved layout must hold every nonzero entry, and where the graph's pattern
is generic it must be the tightest layout (`structure_from_pattern` of the exact matrix).
"""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from pytensor.gradient import hessian, jacobian
from pytensor.graph.replace import graph_replace

from pymc_optim.linalg.detect import (
    PROBE_CHUNK,
    dropped_entries,
    hessian_structure,
    jacobian_structure,
    numeric_pattern,
)
from pymc_optim.linalg.structure import LinearStructure, structure_from_pattern

S = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]])
RNG = np.random.default_rng(7)


def _flat(xs, shapes):
    """A flat vector z and the controls as pieces of it (the packed order of the solvers)."""
    sizes = [int(np.prod(s)) for s in shapes]
    z = pt.vector("z", shape=(sum(sizes),))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    pieces = [z[a:e].reshape(s) for a, e, s in zip(starts[:-1], starts[1:], shapes, strict=True)]
    return z, dict(zip(xs, pieces, strict=True))


def _exact_hessian_pattern(objective, xs, shapes):
    z, replace = _flat(xs, shapes)
    h = hessian(graph_replace(objective, replace), z)
    value = h.eval({z: RNG.normal(size=z.type.shape)})
    return value != 0


def _exact_jacobian_pattern(residual, xs, shapes):
    z, replace = _flat(xs, shapes)
    flat = pt.concatenate([r.ravel() for r in graph_replace(residual, replace)])
    value = jacobian(flat, z).eval({z: RNG.normal(size=z.type.shape)})
    return value != 0


X, V, Y = pt.matrix("X"), pt.vector("v"), pt.vector("y")


def _slices(x, starts, width):
    return [x[s : s + width] for s in starts]


BLOCK_CASES = {
    # rows of a matrix-shaped x: a quadratic form per row, then a sum
    "matrix rows": (lambda: ((X @ S) * X).sum() + pt.exp(X).sum(), [X], [(5, 3)], 3),
    # a reduction inside rows, then a nonlinear function of each row's value
    "row reductions": (lambda: (pt.logsumexp(X, axis=1) ** 2).sum(), [X], [(4, 4)], 4),
    # a vector reshaped into rows (how a (G, b) latent is packed)
    "vector reshaped": (
        lambda: ((V.reshape((-1, 3)) @ S) * V.reshape((-1, 3))).sum(),
        [V],
        [(12,)],
        3,
    ),
    # a sum of per-group objectives, written as a Python loop over constant slices
    "loop of slices": (
        lambda: sum((s @ S) @ s + pt.cosh(s.sum()) for s in _slices(V, range(0, 15, 3), 3)),
        [V],
        [(15,)],
        3,
    ),
    # a slice of the packed vector reshaped into rows, next to element-wise terms
    "slice then reshape": (
        lambda: (pt.exp(V[:12].reshape((4, 3)).sum(axis=1)) ** 2).sum() + pt.exp(V[12:]).sum(),
        [V],
        [(18,)],
        3,
    ),
    # several controls: matrix rows and an element-wise vector
    "several controls": (
        lambda: (pt.logsumexp(X, axis=1)).sum() + (pt.exp(Y) - Y).sum(),
        [X, Y],
        [(4, 3), (6,)],
        3,
    ),
    # PyMC's MvNormal of a (G, b) value: a Blockwise triangular solve batched over the rows
    "pm.logp of MvNormal rows": (
        lambda: pm.logp(pm.MvNormal.dist(mu=np.zeros(3), cov=S), X).sum() + pt.exp(X).sum(),
        [X],
        [(4, 3)],
        3,
    ),
    # single rows of a matrix taken by constant indices
    "indexed rows": (lambda: sum(pt.exp(X[g] @ S @ X[g]) for g in range(4)), [X], [(4, 3)], 3),
}


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_block_diagonal_hessians_are_proved_structurally(case):
    build, xs, shapes, block = BLOCK_CASES[case]
    objective = build()
    proved = hessian_structure(objective, xs, shapes)
    exact = _exact_hessian_pattern(objective, xs, shapes)
    assert proved == LinearStructure("block_diagonal", block)
    assert structure_from_pattern(exact) == proved  # the tightest layout
    assert dropped_entries(proved, exact).size == 0


NOT_PROVED = {
    "columns coupled": (lambda: pt.logsumexp(X, axis=0).sum(), [X], [(4, 3)]),
    "a product of rows": (lambda: ((X @ X.T) ** 2).sum(), [X], [(4, 3)]),
    "a nonlinear function of the whole sum": (lambda: (X**2).sum() ** 2, [X], [(4, 3)]),
    "misaligned slices": (
        lambda: sum((s**2).sum() ** 2 for s in _slices(V, range(1, 13, 3), 3)),
        [V],
        [(15,)],
    ),
    "neighbours": (lambda: ((V[1:] - V[:-1]) ** 2).sum() ** 2, [V], [(6,)]),
}


@pytest.mark.parametrize("case", list(NOT_PROVED))
def test_couplings_across_groups_stay_dense(case):
    build, xs, shapes = NOT_PROVED[case]
    objective = build()
    assert hessian_structure(objective, xs, shapes).kind == "dense"
    # the exact Hessian has entries outside every aligned block layout but the whole matrix
    assert structure_from_pattern(_exact_hessian_pattern(objective, xs, shapes)).kind == "dense"


def test_block_size_needs_the_sizes():
    objective = ((X @ S) * X).sum()
    assert hessian_structure(objective, [X]).kind == "dense"  # rows of unknown length
    assert hessian_structure(objective, [X], [(7, 3)]) == LinearStructure("block_diagonal", 3)
    shaped = pt.matrix("shaped", shape=(7, 3))
    assert hessian_structure(((shaped @ S) * shaped).sum(), [shaped]).block_size == 3


def test_element_wise_objectives_stay_diagonal():
    a = pt.vector("a")
    assert hessian_structure((pt.exp(V) - a * V).sum(), [V]).kind == "diagonal"
    assert hessian_structure(pt.exp(X).sum(), [X], [(4, 3)]).kind == "diagonal"


def test_jacobian_of_row_wise_equations_is_block_diagonal():
    residual = [pt.tanh(X @ S) - X]
    proved = jacobian_structure(residual, [X], [(5, 3)])
    exact = _exact_jacobian_pattern(residual, [X], [(5, 3)])
    assert proved == LinearStructure("block_diagonal", 3)
    assert structure_from_pattern(exact | exact.T) == proved
    # mixing the rows couples them
    columns = [pt.tanh(S @ X) - X]
    assert jacobian_structure(columns, [X], [(3, 3)]).kind == "dense"
    assert structure_from_pattern(_exact_jacobian_pattern(columns, [X], [(3, 3)])).kind == "dense"


def test_numeric_pattern_is_the_union_at_the_first_two_finite_points():
    """Chunks of at most PROBE_CHUNK unit directions; a point whose products are not finite is
    dropped at the first chunk that shows it; `on_chunk` counts the calls (a progress bar)."""
    n = 2 * PROBE_CHUNK + 5
    rng = np.random.default_rng(3)
    matrices = [np.where(rng.uniform(size=(n, n)) < 0.01, rng.normal(size=(n, n)), 0.0)]
    matrices += [np.where(rng.uniform(size=(n, n)) < 0.01, 1.0, 0.0) for _ in range(3)]
    matrices[0][n - 1, 0] = np.nan  # the first point fails in its last chunk
    seen, calls = [], []

    def vjp(point, directions):
        rows = directions.argmax(axis=1)
        assert np.array_equal(directions, np.eye(n)[rows])  # unit directions, one per row
        assert np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
        seen.append(len(rows))
        return matrices[point][rows]  # the rows W A, without 0 · NaN spreading a NaN

    found = numeric_pattern(vjp, n, range(4), on_chunk=lambda: calls.append(1))
    assert np.array_equal(found, (matrices[1] != 0) | (matrices[2] != 0))
    assert max(seen) == PROBE_CHUNK and len(calls) == len(seen) == 9  # 3 chunks at 3 points
    assert numeric_pattern(vjp, n, [0]) is None  # no finite point
