"""Germany oral-cavity cancer (544 districts): a BYM2 disease map, ICAR plus iid under Poisson.

The data's README (``data/README.md`` next to this module) gives the source (the R-INLA
repository, MIT licence; Knorr-Held & Raßer 2000), the model of R-INLA's example and where the
reference results come from.
"""

from __future__ import annotations

import io
import json
from importlib.resources import files
from typing import NamedTuple

import numpy as np

__all__ = ["GermanyData", "germany_bym2_model", "load_germany", "load_germany_reference"]


class GermanyData(NamedTuple):
    """The Germany oral-cancer data.

    Attributes
    ----------
    y : (544,) int array, the observed deaths per district.
    expected : (544,) float array, the expected deaths (internally standardised).
    edges : (1416, 2) int array, the district adjacency, each undirected edge once (i < j).
    """

    y: np.ndarray
    expected: np.ndarray
    edges: np.ndarray


def load_germany() -> GermanyData:
    """Load the 544-district Germany oral-cancer data shipped with the package.

    Returns
    -------
    data : GermanyData

    Raises
    ------
    ValueError
        If the graph file is not symmetric (a corrupted copy).

    Examples
    --------
    >>> from pymc_optim.datasets import load_germany
    >>> data = load_germany()
    >>> data.y.shape, int(data.y.sum()), data.edges.shape
    ((544,), 15466, (1416, 2))
    """
    folder = files("pymc_optim.datasets.germany").joinpath("data")
    table = np.loadtxt(io.StringIO(folder.joinpath("oral.txt").read_text()))
    order = np.argsort(table[:, 0])
    table = table[order]
    lines = folder.joinpath("germany.graph").read_text().split("\n")
    n = int(lines[0])
    pairs = set()
    for line in lines[1 : n + 1]:
        fields = [int(v) for v in line.split()]
        node, count, neighbours = fields[0], fields[1], fields[2:]
        if len(neighbours) != count:
            raise ValueError(f"germany.graph: node {node} lists {len(neighbours)} of {count}.")
        pairs.update((node, m) for m in neighbours)
    asymmetric = [(i, j) for i, j in pairs if (j, i) not in pairs]
    if asymmetric:
        raise ValueError(f"germany.graph is not symmetric, e.g. {asymmetric[0]}.")
    edges = np.array(sorted((i, j) for i, j in pairs if i < j), dtype=np.int64)
    return GermanyData(
        y=table[:, 2].astype(np.int64), expected=table[:, 1].astype(np.float64), edges=edges
    )


def load_germany_reference() -> dict:
    """The stored long full-model NUTS run of :func:`germany_bym2_model` (posterior means,
    standard deviations and Monte Carlo standard errors, with the run's settings and time).

    Examples
    --------
    >>> from pymc_optim.datasets import load_germany_reference
    >>> sorted(load_germany_reference()["settings"])[:2]
    ['chains', 'draws']
    """
    path = files("pymc_optim.datasets.germany").joinpath("data", "reference_nuts.json")
    return json.loads(path.read_text())


def icar_scaling_factor(edges: np.ndarray, n: int) -> float:
    """The geometric mean of the ICAR's marginal variances, exp(mean log diag L⁺) for the graph
    Laplacian L (Riebler et al. 2016's scaling: the ICAR divided by its square root has unit
    generalised variance). Dense pseudo-inverse: for graphs of a few thousand nodes."""
    laplacian = np.zeros((n, n))
    i, j = edges[:, 0], edges[:, 1]
    np.add.at(laplacian, (i, j), -1.0)
    np.add.at(laplacian, (j, i), -1.0)
    laplacian[np.diag_indices(n)] = -laplacian.sum(axis=1)
    return float(np.exp(np.log(np.diag(np.linalg.pinv(laplacian, hermitian=True))).mean()))


def germany_bym2_model(data: GermanyData | None = None, *, constraint: str = "sum_to_zero"):
    """The BYM2 disease map of the README as a ``pm.Model``.

    log RR_i = μ + σ (√(ρ/s) φ_i + √(1 − ρ) θ_i), y_i ~ Poisson(E_i RR_i), with φ a unit-scale
    ICAR on the district graph (:class:`pymc_optim.distributions.gmrf.ICAR`), s its scaling
    factor (the geometric mean of its marginal variances), θ ~ N(0, 1) iid; μ ~ N(0, 5²),
    σ ~ Exponential(λ) with λ = −log(0.01)/1 (the PC prior P(σ > 1) = 0.01 of Riebler et al.),
    ρ ~ Beta(1, 1).

    The two constraints give the same relative risks, σ and ρ, and differ in what μ means:
    with ``"sum_to_zero"`` φ sums to zero (INLA's ``constr=TRUE``) and μ is identified; with
    ``"corner"`` φ is zero at district 0, so μ absorbs a shift of the field and is weakly
    identified (NUTS mixes slowly on it: full NUTS gave μ an effective sample size of 9 in
    4 × 2,000 draws). :func:`pymc_optim.marginalize_laplace` keeps H sparse with either, at
    about the same cost per evaluation. The Deterministic ``mean_log_risk`` =
    μ + mean_i(field_i), the mean log relative risk, is the same quantity in both.

    Parameters
    ----------
    data : GermanyData, optional
        Defaults to :func:`load_germany`.
    constraint : {"sum_to_zero", "corner"}, default "sum_to_zero"
        The ICAR's constraint (see above).

    Returns
    -------
    model : pm.Model
        Free variables ``mu``, ``sigma``, ``rho``, ``phi`` and ``theta``; the Deterministics
        ``mean_log_risk`` and ``relative_risk``.

    Examples
    --------
    >>> from pymc_optim.datasets import germany_bym2_model
    >>> model = germany_bym2_model()
    >>> [rv.name for rv in model.free_RVs]
    ['mu', 'sigma', 'rho', 'phi', 'theta']
    """
    import pymc as pm
    import pytensor.tensor as pt

    from pymc_optim.distributions.gmrf import ICAR

    data = load_germany() if data is None else data
    n = data.y.size
    scaling = icar_scaling_factor(data.edges, n)
    with pm.Model(coords={"district": np.arange(n)}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.Exponential("sigma", -np.log(0.01))
        rho = pm.Beta("rho", 1.0, 1.0)
        phi = ICAR("phi", edges=data.edges, n=n, constraint=constraint, dims="district")
        theta = pm.Normal("theta", 0.0, 1.0, dims="district")
        field = sigma * (pt.sqrt(rho / scaling) * phi + pt.sqrt(1.0 - rho) * theta)
        log_risk = mu + field
        pm.Deterministic("mean_log_risk", log_risk.mean())
        pm.Deterministic("relative_risk", pt.exp(log_risk), dims="district")
        pm.Poisson("y", mu=data.expected * pt.exp(log_risk), observed=data.y, dims="district")
    return model
