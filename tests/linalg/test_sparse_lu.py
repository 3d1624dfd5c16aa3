"""`pymc_optim.linalg.sparse_lu`: sparse non-symmetric Jacobians (root and fixed-point Newton)
solved by a sparse LU, against dense linear algebra and the dense structure."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose

import pymc_optim as pmo
from pymc_optim.linalg._hessian_sparsity import jacobian_pattern
from pymc_optim.linalg.sparse_lu import JacobianPattern, SparseJacobianStructure, SparseLUSolveOp

RNG = np.random.default_rng(5)


def random_pattern(n=30, density=0.1):
    """A random non-symmetric pattern with its diagonal, and values making A well conditioned."""
    mask = RNG.uniform(size=(n, n)) < density
    np.fill_diagonal(mask, True)
    rows, cols = np.nonzero(mask)
    values = RNG.normal(size=rows.size) + np.where(rows == cols, 2.0 * n * density + 2.0, 0.0)
    return JacobianPattern(rows, cols, n), values


def dense(pattern, values):
    A = np.zeros((pattern.n, pattern.n))
    A[pattern.rows, pattern.cols] = values
    return A


def test_solves_and_transposed_solves_equal_dense_ones():
    pattern, values = random_pattern()
    A, b = dense(pattern, values), RNG.normal(size=pattern.n)
    assert_allclose(pattern.solve_numpy(values, b), np.linalg.solve(A, b), rtol=1e-12, atol=1e-12)
    assert_allclose(
        pattern.solve_numpy(values, b, transposed=True),
        np.linalg.solve(A.T, b),
        rtol=1e-12,
        atol=1e-12,
    )
    # a later factorization keeps the first one's column order (analysed once)
    order = pattern._column_order.copy()
    assert_allclose(pattern.solve_numpy(2 * values, b), np.linalg.solve(2 * A, b), rtol=1e-12)
    np.testing.assert_array_equal(pattern._column_order, order)
    singular = values.copy()
    singular[pattern.rows == 0] = 0.0  # an empty row
    assert np.isnan(pattern.solve_numpy(singular, b)).all()


def test_rows_of_a_colour_share_no_column_and_a_band_needs_three_colours():
    pattern, _ = random_pattern()
    for color in range(pattern.n_colors):
        rows = np.flatnonzero(pattern.row_colors == color)
        columns = pattern.cols[np.isin(pattern.rows, rows)]
        assert columns.size == np.unique(columns).size
    n = 200
    band = [(i, j) for i in range(n) for j in (i - 1, i, i + 1) if 0 <= j < n]
    assert JacobianPattern(*np.array(band).T, n).n_colors == 3


def test_solve_op_gradient_equals_the_dense_solve_gradient():
    pattern, values = random_pattern(n=12, density=0.25)
    v, b = pt.vector("v"), pt.vector("b")
    A = pt.zeros((pattern.n, pattern.n))[pattern.rows, pattern.cols].set(v)
    w = RNG.normal(size=pattern.n)
    point = {v: values, b: RNG.normal(size=pattern.n)}
    for transposed in (False, True):
        sparse = SparseLUSolveOp(pattern, transposed)(v, b)
        reference = pt.linalg.solve(A.T if transposed else A, b)
        got = pytensor.function([v, b], pt.grad((w * sparse).sum(), [v, b]))(*point.values())
        want = pytensor.function([v, b], pt.grad((w * reference).sum(), [v, b]))(*point.values())
        for g, r in zip(got, want, strict=True):
            assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_pattern_errors():
    with pytest.raises(ValueError, match="must include every diagonal entry; \\(1, 1\\)"):
        JacobianPattern([0, 0], [0, 1], 2)
    with pytest.raises(ValueError, match="must not repeat an entry"):
        JacobianPattern([0, 0, 1], [0, 0, 1], 2)
    with pytest.raises(ValueError, match=r"must lie in \[0, n\)"):
        JacobianPattern([0, 2], [0, 2], 2)
    with pytest.raises(TypeError, match="`pattern` must be a JacobianPattern"):
        SparseJacobianStructure(pattern=None)


def chain_problem(n):
    """Tridiagonal, non-symmetric equations (a root) and a contraction on a chain (a fixed
    point), written with concatenations, as a user writes neighbours."""
    x, a = pt.vector("x", shape=(n,)), pt.vector("a", shape=(n,))
    left = pt.concatenate([[0.0], x[:-1]])
    right = pt.concatenate([x[1:], [0.0]])
    equations = x**3 + 2 * x - 0.5 * left - 0.3 * right - a
    update = 0.5 * pt.tanh(left) + 0.3 * pt.cos(right) + a
    return x, a, equations, update


def test_the_read_pattern_is_the_jacobians():
    n = 9
    x, a, equations, _ = chain_problem(n)
    rows, cols = jacobian_pattern([equations], [x], [n], max_nnz=n * n)
    J = pytensor.function([x, a], pytensor.gradient.jacobian(equations, x))(
        RNG.normal(size=n), RNG.normal(size=n)
    )
    read = np.zeros((n, n), dtype=bool)
    read[rows, cols] = True
    np.testing.assert_array_equal(read, (J != 0) | np.eye(n, dtype=bool))


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "NUMBA"])
def test_root_and_fixed_point_on_a_sparse_jacobian_equal_the_dense_structure(mode):
    """Solutions, success and implicit gradients equal the dense structure's to 1e-12 (measured
    ≤ 1e-14); the compiled function solves by the sparse LU, with no dense solve; numba runs
    the sparse Ops in object mode inside its compiled Newton loop."""
    if mode == "NUMBA":
        pytest.importorskip("numba")
    n = 40
    x, a, equations, update = chain_problem(n)
    results = {}
    for structure in ("sparse", "dense"):
        x_root, ok_root = pmo.root(
            equations, x, x0=np.zeros(n), method="newton", structure=structure
        )
        x_fixed, ok_fixed = pmo.fixed_point(
            update, x, x0=np.zeros(n), method="newton", structure=structure
        )
        if structure == "sparse":
            assert isinstance(x_root.owner.op.condition.structure, SparseJacobianStructure)
            assert x_root.owner.op.condition.structure.pattern.n_colors == 3
        loss = (x_root * np.arange(n)).sum() + (x_fixed**2).sum()
        fn = pytensor.function(
            [a], [x_root, ok_root, x_fixed, ok_fixed, pt.grad(loss, a)], mode=mode
        )
        if structure == "sparse" and mode is None:
            ops = {type(node.op).__name__ for node in fn.maker.fgraph.toposort()}
            assert "SparseLUSolveOp" in ops and not ops & {"Solve", "LUFactor"}
        results[structure] = fn(np.linspace(-1.0, 2.0, n))
    sparse, reference = results["sparse"], results["dense"]
    assert sparse[1] and sparse[3]
    for got, want in zip(sparse, reference, strict=True):
        assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=1e-12, atol=1e-12)


def test_sparse_jacobian_refuses_jax_naming_the_backends_that_run_it():
    pytest.importorskip("jax")
    n = 5
    x, a, equations, _ = chain_problem(n)
    x_root, _ = pmo.root(equations, x, x0=np.zeros(n), method="newton", structure="sparse")
    with pytest.raises(
        NotImplementedError,
        match=r"SparseLUSolveOp \(sparse LU\) has no JAX implementation; compile with PyTensor's "
        r"default C backend or mode='NUMBA' \(object mode\), or pass `structure='dense'`",
    ):
        pytensor.function([a], x_root, mode="JAX")


def test_sparse_jacobian_errors():
    x, a = pt.vector("x"), pt.vector("a")
    with pytest.raises(ValueError, match=r"`structure='sparse'` needs the size of `x`"):
        pmo.root(x**3 - a, x, method="newton", structure="sparse")
    unreadable = pt.cumsum(x) ** 3 - a  # CumOp is not followed
    with pytest.raises(ValueError, match=r"the Jacobian's sparsity pattern cannot be read"):
        pmo.root(unreadable, x, x0=np.zeros(3), method="newton", structure="sparse")


@pytest.mark.parametrize("solve", ["root", "minimize", "fixed_point"])
def test_sparse_structure_of_a_control_without_static_shape_takes_x0s_size(solve):
    """pt.vector("x") with a numeric x0: the pattern is read on x of x0's shape (the reading
    had stopped at the unknown sizes: 'cannot be read off the graph'), and the solution equals
    that of a statically shaped x."""
    b = pt.vector("b")
    b_value = np.linspace(0.5, 2.0, 6)
    found = []
    for x in (pt.vector("x"), pt.vector("x", shape=(6,))):
        if solve == "root":
            x_star, ok = pmo.root(
                x**3 + x - b, x, x0=np.zeros(6), method="newton", structure="sparse"
            )
        elif solve == "minimize":
            objective = (x**4 / 4 + x**2 / 2 - b * x).sum() + (x[1:] * x[:-1]).sum() / 10
            x_star, ok = pmo.minimize(
                objective, x, x0=np.zeros(6), method="newton", structure="sparse"
            )
        else:
            x_star, ok = pmo.fixed_point(
                0.5 * pt.cos(x) + b, x, x0=np.zeros(6), method="newton", structure="sparse"
            )
        value, success = pytensor.function([b], [x_star, ok])(b_value)
        assert success
        found.append(value)
    assert_allclose(found[0], found[1], rtol=1e-12)
