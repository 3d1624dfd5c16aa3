"""Every structure of A with every solver that takes it, against the dense oracle.

One problem per structure: minimize f(x, t) = ½ q(x) + Σ (exp(x) − t·x), q a quadratic whose
Hessian has the structure's layout, so H = Q + diag(exp(x)) is symmetric positive definite. Each
solver (graph-native Newton, scipy's trust-exact and BFGS, Newton on ∇f = 0 with `root`, and a
vectorized batch over t) is run with the structure and compared with the same solver on
``structure="dense"``: the solution and the implicit gradient of a loss in t.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.replace import vectorize_graph

import pymc_optim as pmo
from pymc_optim.linalg.arrowhead import ArrowheadStructure
from pymc_optim.linalg.sparse import SparseStructure

N = 24
P = 3  # border of the arrowhead problem
#: "auto" splits off a low-rank part where the pattern is too dense to pay as sparse: n ≥ 256
N_LOW_RANK = 300


def _chain(x):
    return ((x[1:] - x[:-1]) ** 2).sum()


def _dense_q(x):
    M = np.random.default_rng(3).normal(size=(N, N)) / N
    return ((pt.as_tensor(M) @ x) ** 2).sum()


def _blocks(x):
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
    "block_diagonal": (_blocks, ("block_diagonal", 2), "block_diagonal", N),
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
