"""Epil (pymc_optim.datasets.epil): the data, the model in both designs, and fit_inla with the
fixed effects in the latent field against the stored long full-model NUTS run."""

import numpy as np
import pytest

import pymc_optim as pmo
from pymc_optim.datasets import epil_model, load_epil, load_epil_reference
from pymc_optim.datasets.epil import FIXED_EFFECTS, epil_covariates
from pymc_optim.linalg.arrowhead import ArrowheadStructure


def test_load_epil_matches_the_readme():
    data = load_epil()
    assert data.y.shape == (59, 4) and int(data.y.sum()) == 1948
    assert data.trt.shape == data.base.shape == data.age.shape == (59,)
    assert int(data.trt.sum()) == 31  # 31 on progabide, 28 on placebo
    assert data.v4.tolist() == [0, 0, 0, 1]
    # the first patient of MASS's epil: placebo, base 11, age 31, counts 5 3 3 3
    assert data.y[0].tolist() == [5, 3, 3, 3]
    assert (data.trt[0], data.base[0], data.age[0]) == (0, 11, 31)


def test_covariates_are_centred_as_in_bugs():
    data = load_epil()
    X = epil_covariates(data)
    assert X.shape == (59, 4, 6)
    np.testing.assert_allclose(X[..., 0], 1.0)
    np.testing.assert_allclose(X[:, 0, 1:5].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X[0, :, 5], [-0.25, -0.25, -0.25, 0.75])
    log_base = np.log(data.base / 4.0)
    np.testing.assert_allclose(X[:, 0, 3], data.trt * log_base - np.mean(data.trt * log_base))


@pytest.mark.parametrize("design", ["separate", "matrix"])
def test_the_two_designs_are_one_model(design):
    model = epil_model(design=design)
    names = [rv.name for rv in model.free_RVs]
    fixed = list(FIXED_EFFECTS) if design == "separate" else ["beta"]
    assert names == [*fixed, "sigma", "b1"]
    assert model.initial_point()["b1"].shape == (59,)
    assert model.named_vars_to_dims["y"] == ("patient", "period")
    # the same log density at the same point, fixed effects packed or one by one
    rng = np.random.default_rng(0)
    beta = rng.normal(0.0, 0.3, 6)
    point = {"sigma_log__": -0.6, "b1": rng.normal(0.0, 0.5, 59)}
    if design == "separate":
        point.update(dict(zip(FIXED_EFFECTS, beta, strict=True)))
    else:
        point["beta"] = beta
    other = epil_model(design="matrix" if design == "separate" else "separate")
    other_point = {k: v for k, v in point.items() if k in ("sigma_log__", "b1")}
    if design == "separate":
        other_point["beta"] = beta
    else:
        other_point.update(dict(zip(FIXED_EFFECTS, beta, strict=True)))
    np.testing.assert_allclose(
        model.compile_logp(vars=[model["y"]])(point),
        other.compile_logp(vars=[other["y"]])(other_point),
        rtol=1e-12,
    )


def test_an_unknown_design_is_refused():
    with pytest.raises(ValueError, match="`design` must be 'separate' or 'matrix'; got 'dense'"):
        epil_model(design="dense")


def test_the_stored_reference_describes_its_run():
    reference = load_epil_reference()
    assert reference["settings"]["chains"] * reference["settings"]["draws"] >= 8000
    assert reference["diverging"] == 0 and reference["max_rhat"] < 1.01
    for name in (*FIXED_EFFECTS, "sigma"):
        summary = reference["summaries"][name]
        assert summary["mcse"] < 0.05 * summary["sd"], name  # ≥ 400 effective draws


@pytest.mark.slow
@pytest.mark.parametrize("design", ["separate", "matrix"])
def test_fixed_effects_in_the_latent_give_an_arrowhead(design):
    latent = [*FIXED_EFFECTS, "b1"] if design == "separate" else ["beta", "b1"]
    marginal = pmo.marginalize_laplace(epil_model(design=design), latent)
    assert pmo.laplace_info(marginal).structure == ArrowheadStructure(border=np.arange(6), n=65)


@pytest.mark.slow
def test_fit_inla_with_the_fixed_effects_in_the_latent_agrees_with_long_full_nuts():
    """fit_inla's posterior means within 0.1 posterior sd of the stored full NUTS (4 × 2,000).

    The allowance: 0.1 sd for the approximation itself (the accuracy fit_inla aims at), plus
    four Monte Carlo errors of the difference: fit_inla's 1,000 independent draws (sd/√1000;
    none for σ, whose mean comes from the grid) and the reference's MCSE (≤ 0.02 sd)."""
    idata = pmo.fit_inla(
        epil_model(), [*FIXED_EFFECTS, "b1"], draws=1000, random_seed=1, progressbar=False
    )
    reference = load_epil_reference()["summaries"]
    assert idata.inla.attrs["integration"] == "grid"
    for name in (*FIXED_EFFECTS, "sigma"):
        ref = reference[name]
        if name == "sigma":
            mean, mcse = float(idata.inla.dataset["mean"].sel(hyperparameter="sigma")), 0.0
        else:
            draws = idata.posterior[name]
            mean, mcse = float(draws.mean()), float(draws.std()) / np.sqrt(draws.size)
        allowed = 0.1 * ref["sd"] + 4 * np.hypot(mcse, ref["mcse"])
        assert abs(mean - ref["mean"]) <= allowed, (name, mean, ref["mean"], ref["sd"])
    b1 = np.asarray(idata.posterior["b1"].mean(("chain", "draw")))
    ref_b1, sd_b1 = np.asarray(reference["b1"]["mean"]), np.asarray(reference["b1"]["sd"])
    # the 59 patient effects: 0.1 sd plus four Monte Carlo errors of the difference (1,000
    # draws: 0.032 sd; the reference's ≲ 0.02 sd; together ≲ 0.035 sd): 0.25 sd
    assert np.max(np.abs(b1 - ref_b1) / sd_b1) <= 0.25
