"""`pymc_optim.fit_inla_many`: one model structure fitted to many data sets, compiled once.

The model is a Gaussian–Gaussian random-intercepts model (the Laplace marginal is exact, so no
fit warns) whose observations are a ``pm.Data`` variable. Each fit must equal a separate
``fit_inla`` call on a model built with that data set, with the same seed.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import warnings

import numpy as np
import pymc as pm
import pytest
import xarray as xr
from numpy.testing import assert_allclose

import pymc_optim as pmo
from pymc_optim.model import inla_many

F64 = np.float64
N_GROUPS, N_PER_GROUP = 5, 3
GROUP = np.repeat(np.arange(N_GROUPS), N_PER_GROUP)
#: Fit options that keep each fit under a second (the draws are few; the grid is the default).
FAST = {"draws": 50}
#: Two fits of one data set with one seed agree to rounding: the inner Newton solves converge
#: to ~1e-10, and the fits differ only in where an earlier solve left scratch state.
TOLERANCE = 1e-8


def _observations(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(1.0, 0.7, N_GROUPS)[GROUP] + rng.normal(0.0, 1.0, GROUP.size)


def gaussian_model(y: np.ndarray, *, data: bool = True) -> pm.Model:
    """x_g ~ N(mu, sigma), y_gj ~ N(x_g, 1); `y` a pm.Data variable unless `data` is False."""
    with pm.Model(coords={"group": np.arange(N_GROUPS)}) as model:
        observed = pm.Data("y_data", y) if data else y
        mu = pm.Normal("mu", F64(0.0), F64(5.0))
        sigma = pm.HalfNormal("sigma", F64(2.0))
        x = pm.Normal("x", mu, sigma, dims="group")
        pm.Normal("y", x[GROUP], F64(1.0), observed=observed)
    return model


def _datasets(n: int) -> list[dict]:
    return [{"y_data": _observations(seed)} for seed in range(10, 10 + n)]


def _assert_same_fit(actual, expected):
    for name in ("mu", "sigma", "x"):
        assert_allclose(
            actual.posterior[name].values, expected.posterior[name].values, atol=TOLERANCE
        )
    for name in ("mean", "sd", "log_weights"):
        assert_allclose(actual.inla[name].values, expected.inla[name].values, atol=TOLERANCE)


def test_each_fit_equals_a_separate_fit_inla_call():
    datasets = _datasets(3)
    seeds = [4, 5, 6]
    model = gaussian_model(_observations(0))
    fits = pmo.fit_inla_many(model, "x", datasets, random_seed=seeds, progressbar=False, **FAST)
    assert [fit.attrs["dataset_index"] for fit in fits] == [0, 1, 2]
    for fit, dataset, seed in zip(fits, datasets, seeds, strict=True):
        expected = pmo.fit_inla(
            gaussian_model(dataset["y_data"]), "x", random_seed=seed, progressbar=False, **FAST
        )
        _assert_same_fit(fit, expected)
    # the data sets differ, so do the fits; the user's model keeps its data
    assert not np.allclose(fits[0].inla["mean"], fits[1].inla["mean"])
    assert_allclose(model["y_data"].get_value(), _observations(0))


def test_one_seed_gives_each_fit_a_child_seed():
    datasets = _datasets(2)
    model = gaussian_model(_observations(0))
    fits = pmo.fit_inla_many(model, "x", datasets, random_seed=7, progressbar=False, **FAST)
    children = np.random.SeedSequence(7).spawn(2)
    expected = pmo.fit_inla(
        gaussian_model(datasets[1]["y_data"]),
        "x",
        random_seed=children[1],
        progressbar=False,
        **FAST,
    )
    _assert_same_fit(fits[1], expected)


@pytest.fixture
def compilations(monkeypatch):
    """The number of PyTensor functions compiled (FunctionMaker instances) so far."""
    from pytensor.compile.maker import FunctionMaker

    count = [0]
    original = FunctionMaker.__init__

    def counting(self, *args, **kwargs):
        count[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(FunctionMaker, "__init__", counting)
    return count


@pytest.mark.parametrize("laplace_error", [False, True])
def test_the_model_is_compiled_once_for_all_fits(compilations, laplace_error):
    model = gaussian_model(_observations(0))
    options = {**FAST, "laplace_error": laplace_error}
    pmo.fit_inla_many(model, "x", _datasets(1), progressbar=False, **options)
    one = compilations[0]
    compilations[0] = 0
    pmo.fit_inla_many(model, "x", _datasets(4), progressbar=False, **options)
    assert one > 0
    assert compilations[0] == one  # three more fits, nothing more compiled


def test_a_failing_fit_is_reported_and_the_others_complete():
    datasets = _datasets(3)
    datasets[1] = {"y_data": np.full(GROUP.size, np.nan)}  # log p(y | θ) is NaN everywhere
    model = gaussian_model(_observations(0))
    with pytest.warns(pmo.PymcOptimWarning, match=r"1 of 3 fits failed.*data set 1: ValueError"):
        fits = pmo.fit_inla_many(model, "x", datasets, random_seed=1, progressbar=False, **FAST)
    assert isinstance(fits[0], xr.DataTree) and isinstance(fits[2], xr.DataTree)
    failure = fits[1]
    assert isinstance(failure, pmo.FitFailure)
    assert failure.index == 1 and failure.error_type == "ValueError"
    assert "not finite at the starting point" in failure.message
    assert "_find_mode" in failure.traceback


def test_a_fit_that_warns_keeps_its_warnings_and_one_summary_is_issued(monkeypatch):
    original = inla_many.inla._fit_compiled

    @functools.wraps(original)  # fit_inla_many reads the per-fit options from its signature
    def warning_fit(*args, **kwargs):
        warnings.warn("a warning of the fit", pmo.PymcOptimWarning, stacklevel=1)
        return original(*args, **kwargs)

    monkeypatch.setattr(inla_many.inla, "_fit_compiled", warning_fit)
    model = gaussian_model(_observations(0))
    with pytest.warns(pmo.PymcOptimWarning, match=r"2 of 2 fits warned.*a warning of the fit"):
        fits = pmo.fit_inla_many(model, "x", _datasets(2), progressbar=False, **FAST)
    assert fits[1].attrs["warnings"] == "PymcOptimWarning: a warning of the fit"


# --- bad input: refused before anything is compiled --------------------------------------------


def test_a_constant_observed_variable_is_refused():
    model = gaussian_model(_observations(0), data=False)
    with pytest.raises(ValueError, match=r"observed variable 'y' holds constant data.*pm\.Data"):
        pmo.fit_inla_many(model, "x", [{"y": _observations(1)}])


def test_an_unknown_name_is_refused():
    model = gaussian_model(_observations(0))
    datasets = [*_datasets(2), {"y": _observations(1)}]
    with pytest.raises(
        ValueError, match=r"`datasets\[2\]` names 'y', which is not a `pm\.Data`.*\['y_data'\]"
    ):
        pmo.fit_inla_many(model, "x", datasets)


def test_a_shape_other_than_the_models_is_refused():
    model = gaussian_model(_observations(0))
    datasets = [*_datasets(1), {"y_data": np.zeros(GROUP.size + 1)}]
    with pytest.raises(
        ValueError, match=r"`datasets\[1\]\['y_data'\]` has shape \(16,\).*has shape \(15,\)"
    ):
        pmo.fit_inla_many(model, "x", datasets)


def test_integer_data_are_cast_and_non_integers_refused():
    counts = np.arange(GROUP.size) % 4
    with pm.Model() as model:
        y_data = pm.Data("y_data", counts)  # stored as int32
        mu = pm.Normal("mu", F64(0.0), F64(1.0))
        sigma = pm.HalfNormal("sigma", F64(1.0))
        u = pm.Normal("u", mu, sigma, shape=N_GROUPS)
        pm.Poisson("y", pm.math.exp(u[GROUP]), observed=y_data)
    data = inla_many._data_variables(model)
    (checked,) = inla_many._checked_datasets([{"y_data": counts.astype("int64")}], data)
    assert checked["y_data"].dtype == np.dtype(model["y_data"].type.dtype)
    with pytest.raises(ValueError, match=r"`datasets\[0\]\['y_data'\]` has values.*non-integer"):
        pmo.fit_inla_many(model, "u", [{"y_data": counts + 0.5}])


@pytest.mark.parametrize(
    ("datasets", "match"),
    [
        ({"y_data": np.zeros(15)}, r"`datasets` must be a sequence.*pass `\[dataset\]`"),
        ([np.zeros(15)], r"`datasets\[0\]` must be a mapping"),
    ],
)
def test_datasets_must_be_a_sequence_of_mappings(datasets, match):
    with pytest.raises(TypeError, match=match):
        pmo.fit_inla_many(gaussian_model(_observations(0)), "x", datasets)


def test_one_seed_per_data_set_or_one_seed():
    with pytest.raises(ValueError, match=r"`random_seed` has 2 seeds for 3 data sets"):
        pmo.fit_inla_many(gaussian_model(_observations(0)), "x", _datasets(3), random_seed=[1, 2])


def test_fit_inla_options_are_checked_before_compiling():
    model = gaussian_model(_observations(0))
    with pytest.raises(ValueError, match=r"`draws` must be a positive integer; got 0"):
        pmo.fit_inla_many(model, "x", _datasets(1), draws=0)
    with pytest.raises(TypeError, match=r"`mean_correction` must be True or False"):
        pmo.fit_inla_many(model, "x", _datasets(1), mean_correction="yes")


def test_client_must_be_a_dask_client():
    pytest.importorskip("distributed")
    with pytest.raises(TypeError, match=r"`client` must be a `distributed\.Client`.*got str"):
        pmo.fit_inla_many(gaussian_model(_observations(0)), "x", _datasets(1), client="local")


def test_a_client_without_dask_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    with pytest.raises(ImportError, match=r'pip install "pymc-optim\[cluster\]"'):
        pmo.fit_inla_many(gaussian_model(_observations(0)), "x", _datasets(1), client=object())


def test_importing_the_package_does_not_import_dask():
    code = "import sys, pymc_optim; print(sorted({'dask', 'distributed'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- a Dask cluster of two worker processes ----------------------------------------------------


@pytest.mark.slow
def test_fits_on_a_local_cluster_equal_the_fits_in_this_process():
    distributed = pytest.importorskip("distributed")
    datasets = _datasets(4)
    datasets[2] = {"y_data": np.full(GROUP.size, np.nan)}
    model = gaussian_model(_observations(0))
    with pytest.warns(pmo.PymcOptimWarning, match=r"1 of 4 fits failed.*data set 2"):
        local = pmo.fit_inla_many(model, "x", datasets, random_seed=3, progressbar=False, **FAST)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        pytest.warns(pmo.PymcOptimWarning, match=r"1 of 4 fits failed.*data set 2"),
    ):
        remote = pmo.fit_inla_many(
            model, "x", datasets, client=client, random_seed=3, progressbar=False, **FAST
        )
        workers = client.run(lambda: __import__("os").getpid())
    assert len(set(workers.values())) == 2  # two processes, not this one
    assert isinstance(remote[2], pmo.FitFailure) and remote[2].index == 2
    for i in (0, 1, 3):
        assert remote[i].attrs["dataset_index"] == i
        _assert_same_fit(remote[i], local[i])
