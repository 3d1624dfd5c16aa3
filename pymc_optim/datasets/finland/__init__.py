"""Finland disease map (100 counties): a Gaussian-process latent field under Poisson counts.

The data's README (``data/finland/README.md`` next to this module) gives the source
(Vanhatalo, Pietiläinen & Vehtari 2010; the 100-county sample of Margossian et al. 2020, the
reference example of Stan's embedded Laplace approximation), the model and the published
posterior summaries.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import NamedTuple

import numpy as np

__all__ = ["FinlandData", "finland_model", "load_finland"]


class FinlandData(NamedTuple):
    """The Finland disease-map data.

    Attributes
    ----------
    x : (100, 2) float array, the county coordinates.
    y : (100,) int array, the observed counts.
    ye : (100,) float array, the expected counts.
    rho_prior : (alpha, beta) of the InverseGamma prior of the length scale ρ.
    alpha_prior : (alpha, beta) of the InverseGamma prior of the marginal sd α.
    """

    x: np.ndarray
    y: np.ndarray
    ye: np.ndarray
    rho_prior: tuple[float, float]
    alpha_prior: tuple[float, float]


def load_finland() -> FinlandData:
    """Load the 100-county Finland disease-map data shipped with the package.

    Returns
    -------
    data : FinlandData

    Examples
    --------
    >>> from pymc_optim.datasets import load_finland
    >>> data = load_finland()
    >>> data.x.shape, int(data.y.sum())
    ((100, 2), 8090)
    """
    raw = json.loads(
        files("pymc_optim.datasets.finland").joinpath("data", "disease_100.json").read_text()
    )
    return FinlandData(
        x=np.asarray(raw["x"], dtype="float64"),
        y=np.asarray(raw["y"], dtype="int64"),
        ye=np.asarray(raw["ye"], dtype="float64"),
        rho_prior=(float(raw["rho_location_prior"]), float(raw["rho_scale_prior"])),
        alpha_prior=(float(raw["alpha_location_prior"]), float(raw["alpha_scale_prior"])),
    )


def finland_model(data: FinlandData | None = None, *, centered: bool = True):
    """The disease-map model of the README as a ``pm.Model``.

    y_i ~ Poisson(ye_i exp θ_i), θ ~ MvNormal(0, K), K_ij = α² exp(−|x_i − x_j|²/(2ρ²)) + 1e-8
    δ_ij, ρ ~ InverseGamma(``*rho_prior``), α ~ InverseGamma(``*alpha_prior``).

    Parameters
    ----------
    data : FinlandData, optional
        Defaults to :func:`load_finland` (any coordinates, counts and expected counts work).
    centered : bool, default True
        ``True``: θ is the free variable (the form :func:`pymc_optim.marginalize_laplace`
        integrates out); ``False``: θ = L η with η ~ N(0, I) free and L the Cholesky factor of K
        (the form full NUTS samples best).

    Returns
    -------
    model : pm.Model
        Free variables ``rho``, ``alpha`` and ``theta`` (centered) or ``eta`` with the
        Deterministic ``theta`` (non-centered).

    Examples
    --------
    >>> from pymc_optim.datasets import finland_model
    >>> model = finland_model(centered=False)
    >>> sorted(rv.name for rv in model.free_RVs)
    ['alpha', 'eta', 'rho']
    """
    import pymc as pm
    import pytensor.tensor as pt

    data = load_finland() if data is None else data
    n = data.y.size
    # 1e-8 jitter, as in the Stan model: keeps the Cholesky of K defined at large ρ
    jitter = 1e-8
    squared_distances = ((data.x[:, None, :] - data.x[None, :, :]) ** 2).sum(-1)
    with pm.Model(coords={"county": np.arange(n)}) as model:
        rho = pm.InverseGamma("rho", *data.rho_prior)
        alpha = pm.InverseGamma("alpha", *data.alpha_prior)
        K = alpha**2 * pt.exp(-squared_distances / (2 * rho**2)) + jitter * np.eye(n)
        if centered:
            theta = pm.MvNormal("theta", mu=np.zeros(n), cov=K, dims="county")
        else:
            eta = pm.Normal("eta", 0.0, 1.0, dims="county")
            theta = pm.Deterministic("theta", pt.linalg.cholesky(K) @ eta, dims="county")
        pm.Poisson("y", mu=data.ye * pt.exp(theta), observed=data.y, dims="county")
    return model
