"""Epil (Thall & Vail 1990): seizure counts of 59 epileptics, a Poisson model with patient effects.

The data's README (``data/README.md`` next to this module) gives the source (MASS's ``epil``,
via the ``pydataset`` package), the licence, the model and where the reference results come
from.
"""

from __future__ import annotations

import io
import json
from importlib.resources import files
from typing import NamedTuple

import numpy as np

__all__ = ["FIXED_EFFECTS", "EpilData", "epil_model", "load_epil", "load_epil_reference"]

#: The fixed effects of :func:`epil_model` with ``design="separate"``, in BUGS's order: the
#: intercept, log(Base/4), Trt, Trt·log(Base/4), log(Age), V4.
FIXED_EFFECTS = ("beta0", "beta_base", "beta_trt", "beta_bt", "beta_age", "beta_v4")
#: The columns of the design matrix of ``design="matrix"`` (its ``coefficient`` coordinate).
COEFFICIENTS = ("intercept", "base", "trt", "bt", "age", "v4")


class EpilData(NamedTuple):
    """The Epil data, one row per patient.

    Attributes
    ----------
    y : (59, 4) int array, the seizure counts of each two-week period.
    trt : (59,) int array, 1 for progabide, 0 for placebo.
    base : (59,) int array, the seizure count of the eight weeks before treatment.
    age : (59,) int array, the age in years.
    v4 : (4,) int array, 1 for the fourth period.
    """

    y: np.ndarray
    trt: np.ndarray
    base: np.ndarray
    age: np.ndarray
    v4: np.ndarray


def load_epil() -> EpilData:
    """Load the Epil data shipped with the package (MASS's ``epil``, 236 rows).

    Returns
    -------
    data : EpilData

    Raises
    ------
    ValueError
        If a patient's rows disagree on a covariate or the periods are not 1 to 4 (a corrupted
        copy).

    Examples
    --------
    >>> from pymc_optim.datasets import load_epil
    >>> data = load_epil()
    >>> data.y.shape, int(data.y.sum()), int(data.trt.sum())
    ((59, 4), 1948, 31)
    """
    text = files("pymc_optim.datasets.epil").joinpath("data", "epil.csv").read_text()
    table = np.genfromtxt(io.StringIO(text), delimiter=",", names=True, dtype=None, encoding=None)
    order = np.lexsort((table["period"], table["subject"]))
    table = table[order]
    subjects = np.unique(table["subject"])
    if table.size != 4 * subjects.size or not np.array_equal(
        table["period"], np.tile([1, 2, 3, 4], subjects.size)
    ):
        raise ValueError("epil.csv: every patient must have the four periods 1, 2, 3, 4.")
    rows = table.reshape(subjects.size, 4)
    for column in ("trt", "base", "age"):
        if not np.all(rows[column] == rows[column][:, :1]):
            raise ValueError(f"epil.csv: `{column}` differs between one patient's rows.")
    return EpilData(
        y=rows["y"].astype(np.int64),
        trt=(rows["trt"][:, 0] == "progabide").astype(np.int64),
        base=rows["base"][:, 0].astype(np.int64),
        age=rows["age"][:, 0].astype(np.int64),
        v4=rows["V4"][0].astype(np.int64),
    )


def load_epil_reference() -> dict:
    """The stored long full-model NUTS run of :func:`epil_model` (posterior means, standard
    deviations and Monte Carlo standard errors, with the run's settings and time).

    Examples
    --------
    >>> from pymc_optim.datasets import load_epil_reference
    >>> sorted(load_epil_reference()["settings"])[:2]
    ['chains', 'draws']
    """
    path = files("pymc_optim.datasets.epil").joinpath("data", "reference_nuts.json")
    return json.loads(path.read_text())


def epil_covariates(data: EpilData) -> np.ndarray:
    """The (59, 4, 6) design of BUGS's Epil, centred as BUGS centres it: 1, log(Base/4),
    Trt, Trt·log(Base/4) and log(Age) minus their means over patients, V4 minus its mean over
    periods (0.25); the intercept column is 1."""
    log_base = np.log(data.base / 4.0)
    per_patient = np.column_stack([log_base, data.trt, data.trt * log_base, np.log(data.age)])
    per_patient = per_patient - per_patient.mean(axis=0)
    n, k = data.y.shape
    design = np.empty((n, k, 6))
    design[..., 0] = 1.0
    design[..., 1:5] = per_patient[:, None, :]
    design[..., 5] = (data.v4 - data.v4.mean())[None, :]
    return design


def epil_model(data: EpilData | None = None, *, design: str = "separate"):
    """Model 5.1 of Fong, Rue & Wakefield (2010), BUGS's Epil with patient effects, as a
    ``pm.Model``.

    y_jk ~ Poisson(μ_jk), log μ_jk = β0 + β_base log(Base_j/4) + β_trt Trt_j
    + β_bt Trt_j log(Base_j/4) + β_age log(Age_j) + β_v4 V4_k + b1_j, with the covariates
    centred as in BUGS (:func:`epil_covariates`) and one random intercept per patient,
    b1_j ~ N(0, σ²) (the variant without BUGS's per-visit effects b_jk). Priors: β ~ N(0, 100²)
    each (BUGS's ``dnorm(0, 1.0E-4)``); σ = τ^(-1/2) ~ Exponential(λ), λ = −log(0.01) / 1, the
    penalized-complexity prior of τ with P(σ > 1) = 0.01 (Simpson et al. 2017).

    The fixed effects are ordinary free variables: `pmo.fit_inla` takes them as hyperparameters
    (``fit_inla(model, "b1")``: 7 of them, a central composite design) or, as R-INLA formulates
    every model, in the latent field (``fit_inla(model, [*FIXED_EFFECTS, "b1"])`` or
    ``fit_inla(model, ["beta", "b1"])``: one hyperparameter, a grid), where the Hessian is an
    arrowhead (:class:`pymc_optim.linalg.arrowhead.ArrowheadStructure`).

    Parameters
    ----------
    data : EpilData, optional
        Defaults to :func:`load_epil`.
    design : {"separate", "matrix"}, default "separate"
        ``"separate"``: one ``pm.Normal`` per fixed effect, named as in ``FIXED_EFFECTS``.
        ``"matrix"``: one vector ``beta`` (dims ``coefficient``) behind the design matrix,
        η = X β + b1.

    Returns
    -------
    model : pm.Model
        Free variables the fixed effects, ``sigma`` and ``b1`` (dims ``patient``); the
        Deterministic ``tau`` = σ⁻²; the observed ``y`` (dims ``patient, period``).

    Raises
    ------
    ValueError
        If `design` is neither ``"separate"`` nor ``"matrix"``.

    Examples
    --------
    >>> from pymc_optim.datasets import epil_model
    >>> [rv.name for rv in epil_model().free_RVs]
    ['beta0', 'beta_base', 'beta_trt', 'beta_bt', 'beta_age', 'beta_v4', 'sigma', 'b1']
    >>> [rv.name for rv in epil_model(design="matrix").free_RVs]
    ['beta', 'sigma', 'b1']
    """
    import pymc as pm
    import pytensor.tensor as pt

    if design not in ("separate", "matrix"):
        raise ValueError(f"`design` must be 'separate' or 'matrix'; got {design!r}.")
    data = load_epil() if data is None else data
    X = epil_covariates(data)
    n, k = data.y.shape
    coords = {"patient": np.arange(1, n + 1), "period": np.arange(1, k + 1)}
    if design == "matrix":
        coords["coefficient"] = list(COEFFICIENTS)
    with pm.Model(coords=coords) as model:
        if design == "separate":
            betas = [pm.Normal(name, 0.0, 100.0) for name in FIXED_EFFECTS]
            fixed = sum(beta * X[..., i] for i, beta in enumerate(betas))
        else:
            beta = pm.Normal("beta", 0.0, 100.0, dims="coefficient")
            fixed = pt.dot(X, beta)
        sigma = pm.Exponential("sigma", -np.log(0.01))
        pm.Deterministic("tau", sigma**-2)
        b1 = pm.Normal("b1", 0.0, sigma, dims="patient")
        pm.Poisson("y", mu=pt.exp(fixed + b1[:, None]), observed=data.y, dims=("patient", "period"))
    return model
