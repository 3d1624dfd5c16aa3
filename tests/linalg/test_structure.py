"""`pymc_optim.linalg.structure`: the layout of A read off a sparsity pattern, its solve, and
every structure with every solver that takes it against the dense oracle."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from numpy.testing import assert_allclose
from pytensor.graph.replace import vectorize_graph

import pymc_optim as pmo
from pymc_optim.linalg.arrowhead import ArrowheadStructure
from pymc_optim.linalg.sparse import SparseStructure
from pymc_optim.linalg.structure import LinearStructure, structure_from_pattern


def _blocks(n_blocks, b):
    return np.kron(np.eye(n_blocks, dtype=bool), np.ones((b, b), dtype=bool))


def test_diagonal_pattern():
    assert structure_from_pattern(np.eye(5, dtype=bool)) == LinearStructure("diagonal")


@pytest.mark.parametrize("b", [2, 3, 5])
def test_block_pattern_gives_its_block_size(b):
    assert structure_from_pattern(_blocks(4, b)) == LinearStructure("block_diagonal", b)


def test_partly_filled_blocks_give_the_smallest_enclosing_block_size():
    """Blocks of 4 where only some entries are nonzero still need blocks of 4 (not 2)."""
    pattern = np.eye(8, dtype=bool)
    pattern[0, 3] = pattern[3, 0] = pattern[5, 6] = pattern[6, 5] = True
    assert structure_from_pattern(pattern) == LinearStructure("block_diagonal", 4)


def test_entry_across_blocks_gives_dense():
    pattern = _blocks(4, 2)
    pattern[1, 2] = pattern[2, 1] = True  # couples blocks 0 and 1: blocks of 4 hold it
    assert structure_from_pattern(pattern) == LinearStructure("block_diagonal", 4)
    pattern[0, 7] = pattern[7, 0] = True  # couples the first and the last element
    assert structure_from_pattern(pattern) == LinearStructure("dense")


def test_a_single_block_is_dense():
    assert structure_from_pattern(np.ones((4, 4), dtype=bool)) == LinearStructure("dense")


@pytest.mark.parametrize(
    ("structure", "singular"),
    [
        (LinearStructure("dense"), np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]])),
        (LinearStructure("dense"), np.full((3, 3), np.nan)),
        (
            LinearStructure("block_diagonal", 2),
            np.array([[[1.0, 1.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 3.0]]]),
        ),
    ],
    ids=["dense-singular", "dense-nan", "block-singular"],
)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("mode", ["FAST_RUN", "FAST_COMPILE"])
def test_a_singular_or_nan_solve_gives_nan_shaped_like_the_right_hand_side(
    structure, singular, symmetric, mode
):
    # pytensor's Solve returns NaN shaped like A here; the structure's solve must keep rhs's
    # shape so that the graph around it (a squeeze, a reshape) still runs.
    A = pt.tensor("A", shape=(None,) * singular.ndim)
    rhs = pt.vector("rhs")
    y = structure.solve(A, rhs, transposed=True, symmetric=symmetric)
    fn = pytensor.function([A, rhs], y * 2.0, mode=mode)
    n = singular.shape[0] * singular.shape[-1] if singular.ndim == 3 else singular.shape[0]
    got = fn(singular, np.ones(n))
    assert got.shape == (n,)
    assert np.isnan(got).any()
    regular = singular.copy()
    regular[np.isnan(regular)] = 0.0
    regular += 5.0 * np.eye(singular.shape[-1])
    expected = np.linalg.solve(regular, np.ones(regular.shape[:-1]).reshape(*regular.shape[:-1], 1))
    assert_allclose(fn(regular, np.ones(n)), 2.0 * expected.reshape(-1), rtol=1e-12)


def _positive_definite_cases():
    """Compact A's with the truth per part: eigenvalues decide, NaN is never positive definite."""
    rng = np.random.default_rng(7)

    def spd(b, shift):
        M = rng.standard_normal((b, b))
        return M @ M.T + shift * np.eye(b)

    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and −1
    with_nan = np.array([[1.0, np.nan], [np.nan, 1.0]])
    blocks = np.stack([spd(2, 0.5), indefinite, with_nan, spd(2, 1.0)])
    return [
        (LinearStructure("diagonal"), np.array([1.0, -1.0, 0.0, np.nan, 2.0])),
        (LinearStructure("dense"), spd(4, 0.1)),
        (LinearStructure("dense"), np.kron(np.eye(2), indefinite)),
        (LinearStructure("dense"), np.eye(3) * np.array([1.0, np.nan, 1.0])),
        (LinearStructure("block_diagonal", 2), blocks),
    ]


def _truth(structure, A):
    if structure.kind == "diagonal":
        return A > 0
    blocks = A if structure.kind == "block_diagonal" else A[None]
    return np.array([np.all(np.isfinite(b)) and np.linalg.eigvalsh(b).min() > 0 for b in blocks])


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_positive_definite_is_per_part_and_agrees_between_numpy_and_the_graph(mode):
    """The curvature test every Newton loop uses: one flag per diagonal entry, per block, or
    for the whole dense A; the numpy method and the compiled graph (default, JAX, NUMBA) agree
    with the eigenvalues."""
    if mode is not None:
        pytest.importorskip(mode.lower())
    for structure, A in _positive_definite_cases():
        truth = _truth(structure, A)
        np.testing.assert_array_equal(structure.positive_definite_numpy(A), truth)
        A_in = pt.tensor("A", dtype="float64", shape=(None,) * structure.compact_ndim)
        fn = pytensor.function([A_in], structure.positive_definite(A_in), mode=mode)
        np.testing.assert_array_equal(np.asarray(fn(A)), truth, err_msg=str(structure))


@pytest.mark.parametrize("mode", [None, "JAX", "NUMBA"])
def test_finite_is_per_part_and_agrees_between_numpy_and_the_graph(mode):
    """The test by which every Newton loop rejects a trial point whose A holds NaN or ±inf: one
    flag per diagonal entry, per block, or for the whole dense A."""
    if mode is not None:
        pytest.importorskip(mode.lower())
    for structure, A in _positive_definite_cases():
        A = np.where(A == 0.0, np.inf, A) if structure.kind == "diagonal" else A
        blocks = A if structure.kind == "block_diagonal" else A[None]
        truth = (
            np.isfinite(A)
            if structure.kind == "diagonal"
            else np.array([np.isfinite(b).all() for b in blocks])
        )
        np.testing.assert_array_equal(structure.finite_numpy(A), truth)
        A_in = pt.tensor("A", dtype="float64", shape=(None,) * structure.compact_ndim)
        fn = pytensor.function([A_in], structure.finite(A_in), mode=mode)
        np.testing.assert_array_equal(np.asarray(fn(A)), truth, err_msg=str(structure))


# --- every structure with every solver that takes it, against the dense oracle ----------------
# One problem per structure: minimize f(x, t) = ½ q(x) + Σ (exp(x) − t·x), q a quadratic whose
# Hessian has the structure's layout, so H = Q + diag(exp(x)) is symmetric positive definite.
# Each solver (graph-native Newton, scipy's trust-exact and BFGS, Newton on ∇f = 0 with `root`,
# and a vectorized batch over t) runs with the structure and with ``structure="dense"``: the
# solutions and the implicit gradients of a loss in t agree.

N = 24
P = 3  # border of the arrowhead problem
#: "auto" splits off a low-rank part where the pattern is too dense to pay as sparse: n ≥ 256
N_LOW_RANK = 300


def _chain(x):
    return ((x[1:] - x[:-1]) ** 2).sum()


def _dense_q(x):
    M = np.random.default_rng(3).normal(size=(N, N)) / N
    return ((pt.as_tensor(M) @ x) ** 2).sum()


def _pairs(x):
    return ((x[0::2] - x[1::2]) ** 2).sum()


def _low_rank(x):
    return _chain(x) + 0.5 * x.sum() ** 2


def _arrowhead(x):
    u, beta = x[: N - P], x[N - P :]
    return ((u - pt.tile(beta, (N - P) // P)) ** 2).sum() + (beta**2).sum()


def _chain_edges():
    return np.column_stack([np.arange(N - 1), np.arange(1, N)])


#: name → (q, the structure to pass, the kind the solve must use, n)
PROBLEMS = {
    "dense": (_dense_q, "dense", "dense", N),
    "diagonal": (lambda x: 0.0 * x.sum(), "diagonal", "diagonal", N),
    "block_diagonal": (_pairs, ("block_diagonal", 2), "block_diagonal", N),
    "sparse": (_chain, SparseStructure.from_edges(_chain_edges(), N), "sparse", N),
    "sparse_low_rank": (_low_rank, "auto", "sparse_low_rank", N_LOW_RANK),
    "arrowhead": (
        _arrowhead,
        ArrowheadStructure(border=np.arange(N - P, N), n=N),
        "arrowhead",
        N,
    ),
}

SOLVERS = ["newton", "trust-exact", "BFGS", "root-newton"]
#: (structure, solver) pairs not taken: root finding has no symmetric structure to split a
#: low-rank part from (its "auto" reads the Jacobian's pattern, dense here)
NOT_TAKEN = {("sparse_low_rank", "root-newton")}
CASES = [
    (name, solver)
    for name in sorted(PROBLEMS)
    for solver in SOLVERS
    if (name, solver) not in NOT_TAKEN
]


def _problem(name):
    q, structure, kind, n = PROBLEMS[name]
    x, t = pt.vector("x", shape=(n,)), pt.vector("t", shape=(n,))
    objective = 0.5 * q(x) + (pt.exp(x) - t * x).sum()
    return x, t, objective, structure, kind, np.linspace(0.5, 2.0, n)


def _solve(solver, x, objective, structure):
    block_size = None
    if isinstance(structure, tuple):
        structure, block_size = structure
    x0 = np.zeros(x.type.shape)
    if solver == "root-newton":
        if isinstance(structure, SparseStructure):
            structure = "sparse"  # (a Jacobian: the sparse LU, read off the graph)
        return pmo.root(
            pt.grad(objective, x),
            x,
            x0=x0,
            method="newton",
            structure=structure,
            block_size=block_size,
        )
    options = {"hess": True} if solver == "trust-exact" else {}
    return pmo.minimize(
        objective,
        x,
        x0=x0,
        method=solver,
        structure=structure,
        block_size=block_size,
        **options,
    )


@pytest.mark.parametrize("name, solver", CASES)
def test_every_structure_agrees_with_the_dense_oracle(name, solver):
    x, t, objective, structure, kind, t_value = _problem(name)
    x_star, success = _solve(solver, x, objective, structure)
    dense_star, dense_success = _solve(solver, x, objective, "dense")
    if solver in ("newton", "root-newton"):  # (scipy's methods test curvature with it)
        assert x_star.owner.op.condition.structure.kind == kind
    loss = (x_star**2).sum() + x_star[0]
    dense_loss = (dense_star**2).sum() + dense_star[0]
    f = pytensor.function(
        [t],
        [x_star, success, pt.grad(loss, t), dense_star, dense_success, pt.grad(dense_loss, t)],
        mode="FAST_RUN",
    )
    got, ok, grad, expected, dense_ok, dense_grad = f(t_value)
    assert ok and dense_ok
    # Newton stops at max|∇f| ≤ 1e-8 with cond(H) ≲ 10 (the final step leaves ~1e-16); the
    # scipy methods run the same iterations with either structure, which only their curvature
    # check and the implicit gradient use
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grad, dense_grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_structure_solves_a_vectorized_batch(name):
    """A batch of three t's through `vectorize_graph`: each problem's solution as its own
    solve's (the dense oracle per row)."""
    x, t, objective, structure, _, t_value = _problem(name)
    x_star, _ = _solve("newton", x, objective, structure)
    dense_star, _ = _solve("newton", x, objective, "dense")
    ts = pt.matrix("ts", shape=(3, t_value.size))
    batched = vectorize_graph(x_star, {t: ts})
    batch = np.stack([t_value, t_value[::-1], 1.0 + 0.0 * t_value])
    got = pytensor.function([ts], batched, mode="FAST_RUN")(batch)
    one = pytensor.function([t], dense_star, mode="FAST_RUN")
    for row, t_value in zip(got, batch, strict=True):
        np.testing.assert_allclose(row, one(t_value), rtol=1e-7, atol=1e-9)
