"""Germany oral cancer (pymc_optim.datasets.germany): the data, the BYM2 model, and its Laplace
marginal sampled by NUTS against the stored long full-model NUTS run."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

import pymc_optim as pmo
from pymc_optim.datasets import germany_bym2_model, load_germany, load_germany_reference
from pymc_optim.datasets.germany import icar_scaling_factor
from pymc_optim.linalg.sparse import SparseStructure


def test_load_germany_matches_the_readme():
    data = load_germany()
    assert data.y.shape == data.expected.shape == (544,)
    assert int(data.y.sum()) == 15466
    np.testing.assert_allclose(data.expected.sum(), 15466, rtol=1e-6)
    assert data.edges.shape == (1416, 2) and np.all(data.edges[:, 0] < data.edges[:, 1])
    W = sp.coo_matrix((np.ones(1416), tuple(data.edges.T)), shape=(544, 544))
    n_components, _ = connected_components(W + W.T, directed=False)
    assert n_components == 1
    assert np.all(np.bincount(data.edges.ravel(), minlength=544) > 0)


def test_scaling_factor_is_the_geometric_mean_of_the_icar_marginal_variances():
    # a path of three nodes: L⁺ has diagonal (5, 2, 5)/9
    edges = np.array([(0, 1), (1, 2)])
    np.testing.assert_allclose(icar_scaling_factor(edges, 3), (5 * 2 * 5 / 9**3) ** (1 / 3))


@pytest.mark.slow
def test_bym2_laplace_marginal_takes_the_sparse_path():
    """ "auto" reads the BYM2 Hessian's pattern (grounded graph Laplacian on φ, diagonal on θ,
    the φ_i–θ_i couplings) off the model graph."""
    model = germany_bym2_model(constraint="corner")
    marginal = pmo.marginalize_laplace(model, ["phi", "theta"])
    structure = pmo.laplace_info(marginal).structure
    assert isinstance(structure, SparseStructure)
    n_phi, n = 543, 543 + 544
    # 1,416 edges, of which those at district 0 (the corner) leave with it; 543 φ–θ couplings
    at_root = int(np.sum(load_germany().edges[:, 0] == 0))
    assert structure.pattern.n == n
    assert structure.pattern.nnz == n + (1416 - at_root) + n_phi
    dlogp = marginal.compile_dlogp()
    ops = {type(node.op).__name__ for node in dlogp.f.maker.fgraph.apply_nodes}
    assert {"SelectedInverseOp", "SparseSolveOp"} <= ops
    assert not ops & {"Cholesky", "Solve", "SLogDet"}


@pytest.mark.slow
def test_bym2_sum_to_zero_marginal_finds_its_mode_in_one_kkt_loop():
    """The default (sum-to-zero) model: H sparse in all 1,088 latent values, the constrained mode
    by one Newton loop on (x, λ) whose KKT matrix is solved through H's sparse factor."""
    from pytensor.graph.traversal import ancestors

    from pymc_optim.linalg.bordered import BorderedStructure

    marginal = pmo.marginalize_laplace(germany_bym2_model(), ["phi", "theta"])
    structure = pmo.laplace_info(marginal).structure
    assert isinstance(structure, SparseStructure) and structure.pattern.n == 544 + 544
    solvers = {
        v.owner.op
        for v in ancestors([marginal.logp()])
        if v.owner is not None and hasattr(v.owner.op, "n_controls")
    }
    kkt = [op.condition.structure for op in solvers if op.n_controls == 2]
    assert len(kkt) == 1 and isinstance(kkt[0], BorderedStructure)
    assert kkt[0].hessian == structure


@pytest.fixture(scope="module")
def laplace_run():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import bench_sparse_germany

    return bench_sparse_germany, bench_sparse_germany.run_laplace()


@pytest.mark.slow
def test_bym2_laplace_nuts_hyperparameters_agree_with_long_full_nuts(laplace_run):
    """Laplace marginal + NUTS (2 × 300 draws) against the stored full NUTS (4 × 2,500).

    Each difference of posterior means is divided by √(mcse_L² + mcse_ref²), the Monte Carlo
    standard error of the difference: ~N(0, 1) if the Laplace marginal of (σ, ρ) were exact.
    |z| ≤ 4 for each (a two-sided 6·10⁻⁵ level). Measured: z = 2.1 (σ), 1.4 (ρ)."""
    bench, result = laplace_run
    reference = load_germany_reference()["summaries"]
    assert isinstance(result["structure"], SparseStructure)
    for name in ("sigma", "rho"):
        assert abs(float(bench.z_scores(result["summaries"], reference, name))) <= 4, name


@pytest.mark.slow
def test_bym2_laplace_latent_field_agrees_with_long_full_nuts(laplace_run):
    """The latent field's summaries within Monte Carlo error of full NUTS: for the mean log
    relative risk |z| ≤ 4; for the 544 relative risks max |z| ≤ 4.5 (Bonferroni over 544 at a
    0.4 % family level). This needs `recover_latent`'s mean correction: draws centred at the
    conditional mode put the mean log relative risk 0.75 posterior sd above full NUTS (z = 22)."""
    bench, result = laplace_run
    reference = load_germany_reference()["summaries"]
    assert abs(float(bench.z_scores(result["summaries"], reference, "mean_log_risk"))) <= 4
    z = bench.z_scores(result["summaries"], reference, "relative_risk")
    assert np.abs(z).max() <= 4.5
