"""Many INLA fits of one model structure: compiled once, run in this process or on a cluster."""

from __future__ import annotations

import threading
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from inspect import Parameter, signature

import numpy as np
import pymc as pm
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import ancestors

from pymc_optim._progress import Progress
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.model import inla
from pymc_optim.model.laplace_checks import check_flag, check_model

__all__ = ["FitFailure", "fit_inla_many"]

#: One fit at a time per process: the fits of one compiled model share its data's storage.
_FITTING = threading.Lock()


@dataclass(frozen=True)
class FitFailure:
    """What :func:`fit_inla_many` returns in place of a fit that raised.

    Attributes
    ----------
    index : int
        The data set's position in `datasets`.
    error_type : str
        The exception's class name, e.g. ``"ValueError"``.
    message : str
        The exception's message.
    traceback : str
        The formatted traceback, as on the process that ran the fit.
    """

    index: int
    error_type: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"data set {self.index}: {self.error_type}: {self.message}"


def fit_inla_many(
    model: pm.Model,
    latent,
    datasets: Sequence[Mapping[str, object]],
    *,
    client=None,
    random_seed=None,
    progressbar: bool = True,
    **fit_inla_kwargs,
) -> list:
    """:func:`pymc_optim.fit_inla` of one model on many data sets, compiled once.

    The model's data are its ``pm.Data`` variables; each data set gives new values to some of
    them, with the shapes the model has. The marginal model and its compiled function of θ are
    built once and every fit sets the data and reuses them (the compilation of
    ``fit_inla`` at G = 300 groups is ~10 s; a fit on the compiled function ~0.3–3 s), in
    this process or on each worker of a Dask cluster. Simulation studies, simulation-based
    calibration (SBC) and cross-validation refits are such loops.

    Parameters
    ----------
    model : pm.Model
        Left unchanged. Every observed variable's data must be a ``pm.Data`` variable (a data
        set can then replace it); so must every covariate a data set replaces.
    latent : str, TensorVariable or list of them
        The latent field, as for :func:`pymc_optim.fit_inla`.
    datasets : sequence of mappings
        One mapping per fit, {name of a ``pm.Data`` variable: its values}. A variable a data
        set does not name keeps the value it has in `model`. Checked, every one, before any
        compilation.
    client : distributed.Client, optional
        Run the fits on this Dask cluster: the compiled fitter is sent once to each worker
        (each worker then runs one fit at a time) and the data sets are mapped over the
        workers. Without it, the fits run one after the other in this process. Needs the
        ``cluster`` extra: ``pip install "pymc-optim[cluster]"``.
    random_seed : int, numpy.random.SeedSequence, numpy.random.Generator or a list of them, optional
        One seed for every fit (fit ``i`` then uses the ``i``-th of
        ``numpy.random.SeedSequence(random_seed).spawn(len(datasets))``, or of
        ``Generator.spawn``) or a list (or 1-d array) of one per data set (fit ``i`` is then
        ``fit_inla(..., random_seed=random_seed[i])`` on the model with data set ``i``).
    progressbar : bool, default True
        One progress bar over the fits (each fit's own bars are off).
    **fit_inla_kwargs
        Passed to :func:`pymc_optim.fit_inla` (``integration``, ``draws``,
        ``hessian_structure``, ``mean_correction``, ``laplace_error``, ``laplace_correction``
        and the options of :func:`pymc_optim.marginalize_laplace`), the same for every fit.

    Returns
    -------
    results : list
        One entry per data set, in their order: the ``xarray.DataTree`` that
        :func:`pymc_optim.fit_inla` returns for that data set (its attrs ``dataset_index``,
        ``fit_seconds`` and, when the fit warned, ``warnings``: the warnings' messages, one a
        line), or a :class:`FitFailure` (the exception's type, message and traceback) for a fit
        that raised, or whose worker died.

    Raises
    ------
    ValueError
        A data set names a variable that is not a ``pm.Data`` variable of `model`, gives one a
        shape other than the model's, or integer data values its dtype cannot hold (data are
        cast to their variable's dtype); an observed variable of `model` holds constant data
        (not ``pm.Data``); and as :func:`pymc_optim.fit_inla` for its options.
    TypeError
        `datasets` is not a sequence of mappings, or `client` is not a ``distributed.Client``.
    ImportError
        With a `client` but without Dask's ``distributed``.

    Warns
    -----
    PymcOptimWarning
        Once for all failed fits (how many, and the first failure), and once for all fits that
        warned (how many, and the first warning); each fit's own warnings are in its attrs.

    Notes
    -----
    *What is compiled once.* The marginal model of `model` and its one compiled function of θ
    (see :func:`pymc_optim.fit_inla`'s Notes): their graphs read the data from PyMC's shared
    variables, so a fit sets those and calls the same function. Each fit starts the inner
    solves from the model's initial point, as a separate ``fit_inla`` does, so its result
    does not depend on the fits before it. A model's Deterministics are computed by
    ``pm.compute_deterministics``, which compiles its own small function at every fit.

    *On a cluster.* The fitter (the models and the compiled functions) is pickled once and
    scattered to every worker, which unpickles it once: PyTensor relinks the compiled
    functions there without rewriting their graphs again, and numba's and PyTensor's on-disk
    caches serve the machine code when the workers share the scheduler's file system. A fit
    that raises is returned as a :class:`FitFailure` and the other fits go on; so is a fit
    whose worker died (Dask's ``KilledWorker``, after its retries). Use workers with one
    thread each (``LocalCluster(n_workers=k, threads_per_worker=1)``): a worker runs one fit
    at a time.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> import pymc_optim as pmo
    >>> rng = np.random.default_rng(0)
    >>> with pm.Model() as model:
    ...     y_data = pm.Data("y_data", rng.normal(size=6))
    ...     mu = pm.Normal("mu", 0.0, 2.0)
    ...     u = pm.Normal("u", mu, 1.0, shape=6)
    ...     obs = pm.Normal("y", u, 0.5, observed=y_data)
    >>> datasets = [{"y_data": rng.normal(size=6)} for _ in range(3)]
    >>> fits = pmo.fit_inla_many(
    ...     model, "u", datasets, draws=100, random_seed=1, progressbar=False
    ... )
    >>> [fit.posterior["u"].shape for fit in fits]
    [(1, 100, 6), (1, 100, 6), (1, 100, 6)]
    """
    check_model(model, "model", "fit_inla_many")
    check_flag(progressbar, "progressbar", "hide the progress bar")
    data = _data_variables(model)
    datasets = _checked_datasets(datasets, data)
    seeds = _seeds(random_seed, len(datasets))
    defaults = _fit_options()
    options = {name: fit_inla_kwargs.pop(name, default) for name, default in defaults.items()}
    flags = [
        n for n, p in signature(inla.fit_inla).parameters.items() if isinstance(p.default, bool)
    ]
    for name, value in [*options.items(), *fit_inla_kwargs.items()]:
        if name in flags:
            check_flag(value, name, "see `fit_inla`")
    inla._check_options(options["integration"], options["draws"])
    if client is not None:
        _check_client(client)
    if not datasets:
        return []
    fitter = _InlaFitter(model, latent, data, options, fit_inla_kwargs)
    if client is None:
        with Progress(progressbar, "fit_inla_many", len(datasets)) as progress:
            results = []
            for index, (dataset, seed) in enumerate(zip(datasets, seeds, strict=True)):
                results.append(fitter.fit_or_failure(index, dataset, seed))
                progress.advance()
    else:
        results = _fit_on_cluster(client, fitter, datasets, seeds, progressbar)
    _report(results)
    return results


class _InlaFitter:
    """The marginal model of a model and its compiled target, and fits at given data values.

    Picklable: it pickles the model copy, the marginal model and the compiled functions
    (PyTensor relinks them when unpickled, without rewriting their graphs).
    """

    def __init__(self, model, latent, data, options, compile_options):
        # a copy whose data values this fitter may set; the user's model is left unchanged
        self.model = pm.model.fgraph.clone_model(model)
        order = {rv.name: i for i, rv in enumerate(model.free_RVs)}  # θ in the user's order
        self.model.free_RVs.sort(key=lambda rv: order[rv.name])
        self.options = {**options, "draws": int(options["draws"])}
        compile_options = dict(compile_options)
        hessian_structure = compile_options.pop("hessian_structure", "auto")
        mean_correction = compile_options.pop("mean_correction", True)
        self.marginal_model, self.target = inla._compile(
            self.model, latent, hessian_structure, mean_correction, compile_options
        )
        # every shared variable of each model that holds a data variable, by name; the values
        # each fit starts from
        self.shared = {
            name: [m[name] for m in (self.model, self.marginal_model) if name in m.named_vars]
            for name in data
        }
        self.defaults = {name: variable.get_value() for name, variable in data.items()}

    def fit(self, dataset: Mapping[str, np.ndarray], seed) -> object:
        """`fit_inla`'s result at the data `dataset` (names not in it: the model's values)."""
        started = time.perf_counter()
        with _FITTING:
            for name, variables in self.shared.items():
                value = dataset.get(name, self.defaults[name])
                for variable in variables:
                    variable.set_value(value)
            # the state a fresh target starts from: inner solves from the initial point
            self.target.x0 = self.target.cold_start
            self.target.n_evaluations = 0
            self.target.progress = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                idata = inla._fit_compiled(
                    self.model,
                    self.marginal_model,
                    self.target,
                    np.random.default_rng(seed),
                    progressbar=False,
                    started=started,
                    **self.options,
                )
        idata.attrs["fit_seconds"] = time.perf_counter() - started
        if caught:
            idata.attrs["warnings"] = "\n".join(
                f"{w.category.__name__}: {w.message}" for w in caught
            )
        return idata

    def fit_or_failure(self, index: int, dataset, seed):
        """:meth:`fit` with ``dataset_index`` in its attrs, or a :class:`FitFailure`."""
        try:
            idata = self.fit(dataset, seed)
        except Exception as error:  # any failure of one fit is that fit's result
            return _failure(index, error)
        idata.attrs["dataset_index"] = index
        return idata


def _fit_options() -> dict:
    """`fit_inla`'s options that apply per fit (the keyword-only arguments of
    `inla._fit_compiled`, the others shape the compiled marginal), with `fit_inla`'s defaults."""
    per_fit = [
        name
        for name, parameter in signature(inla._fit_compiled).parameters.items()
        if parameter.kind is Parameter.KEYWORD_ONLY and name not in ("progressbar", "started")
    ]
    parameters = signature(inla.fit_inla).parameters
    return {name: parameters[name].default for name in per_fit}


def _fit_on_cluster(client, fitter, datasets, seeds, progressbar):
    """The fits mapped over `client`'s workers, gathered in the order of `datasets`."""
    from distributed import as_completed

    # broadcast: every worker receives (and unpickles) the fitter once, before any fit
    scattered = client.scatter(fitter, broadcast=True, hash=False)
    futures = client.map(
        _fit_on_worker,
        range(len(datasets)),
        datasets,
        seeds,
        fitter=scattered,
        pure=False,
    )
    results = [None] * len(futures)
    position = {future.key: i for i, future in enumerate(futures)}
    with Progress(progressbar, "fit_inla_many", len(futures)) as progress:
        for future in as_completed(futures):
            i = position[future.key]
            try:
                results[i] = future.result()
            except Exception as error:  # the task itself failed: e.g. its worker died
                results[i] = _failure(i, error)
            progress.advance()
    for future in futures:
        future.release()
    scattered.release()
    return results


def _fit_on_worker(index, dataset, seed, fitter):
    return fitter.fit_or_failure(index, dataset, seed)


def _failure(index, error) -> FitFailure:
    formatted = "".join(traceback.format_exception(error))
    return FitFailure(index, type(error).__name__, str(error), formatted)


def _report(results) -> None:
    """One warning for the failed fits, one for the fits that warned."""
    failures = [r for r in results if isinstance(r, FitFailure)]
    if failures:
        warnings.warn(
            f"fit_inla_many: {len(failures)} of {len(results)} fits failed (their entries are "
            f"FitFailure records); the first, {failures[0]}",
            PymcOptimWarning,
            stacklevel=3,
        )
    warned = [r for r in results if not isinstance(r, FitFailure) and "warnings" in r.attrs]
    if warned:
        first = warned[0].attrs["warnings"].splitlines()[0]
        warnings.warn(
            f"fit_inla_many: {len(warned)} of {len(results)} fits warned (their messages are "
            f"in each result's attrs['warnings']); the first, data set "
            f"{warned[0].attrs['dataset_index']}: {first}",
            PymcOptimWarning,
            stacklevel=3,
        )


def _data_variables(model: pm.Model) -> dict[str, SharedVariable]:
    """The model's ``pm.Data`` variables by name; a ValueError if an observed variable's data
    is not one of them."""
    data = {name: v for name, v in model.named_vars.items() if isinstance(v, SharedVariable)}
    for rv in model.observed_RVs:
        value = model.rvs_to_values[rv]
        if not any(v in data.values() for v in ancestors([value])):
            raise ValueError(
                f"`model`: the observed variable {rv.name!r} holds constant data, so every "
                "data set would be fitted to the same values. Declare its data with `pm.Data` "
                f"(`{rv.name}_data = pm.Data('{rv.name}_data', values)`, then "
                f"`observed={rv.name}_data`) and give new values under that name in each "
                "data set."
            )
    return data


def _checked_datasets(datasets, data: dict[str, SharedVariable]) -> list[dict]:
    """Each data set's values, cast to their variables' dtypes; a ValueError naming the data
    set and the variable for an unknown name, a shape other than the model's, or integer
    values that change in the cast."""
    if isinstance(datasets, Mapping) or not isinstance(datasets, Sequence):
        raise TypeError(
            "`datasets` must be a sequence (e.g. a list) of mappings {data variable name: "
            f"values}}, one per fit; got {type(datasets).__name__}. For one data set, pass "
            "`[dataset]`."
        )
    checked = []
    for i, dataset in enumerate(datasets):
        if not isinstance(dataset, Mapping):
            raise TypeError(
                f"`datasets[{i}]` must be a mapping {{data variable name: values}}; got "
                f"{type(dataset).__name__}."
            )
        values = {}
        for name, value in dataset.items():
            if name not in data:
                raise ValueError(
                    f"`datasets[{i}]` names {name!r}, which is not a `pm.Data` variable of "
                    f"`model`; its data variables are {sorted(data)}. Declare the data with "
                    "`pm.Data` in the model, or correct the name."
                )
            expected = np.shape(data[name].get_value())
            array = np.asarray(value)
            if array.shape != expected:
                raise ValueError(
                    f"`datasets[{i}][{name!r}]` has shape {array.shape}, but the compiled "
                    f"model's {name!r} has shape {expected}: every data set must keep the "
                    "model's shapes (its functions are compiled for them). Fit a data set of "
                    "another shape with a model built for it."
                )
            dtype = np.dtype(data[name].type.dtype)
            value = array.astype(dtype)
            # integer data (pm.Data stores small integers as int32) must keep their values
            if dtype.kind in "biu" and not np.array_equal(value, array):
                raise ValueError(
                    f"`datasets[{i}][{name!r}]` has values that the model's {name!r}, of dtype "
                    f"{dtype}, cannot hold (non-integer or out of range); got dtype "
                    f"{array.dtype}. Pass integer values in the range of {dtype}."
                )
            values[name] = value
        checked.append(values)
    return checked


def _seeds(random_seed, n: int) -> list:
    """One seed per fit: the given ones, or `n` children of one seed."""
    if isinstance(random_seed, np.ndarray) and random_seed.ndim == 1:
        random_seed = random_seed.tolist()
    if isinstance(random_seed, Sequence) and not isinstance(random_seed, str):
        if len(random_seed) != n:
            raise ValueError(
                f"`random_seed` has {len(random_seed)} seeds for {n} data sets; pass one seed "
                "per data set, or a single seed."
            )
        return list(random_seed)
    if isinstance(random_seed, np.random.Generator):
        return random_seed.spawn(n)
    sequence = (
        random_seed
        if isinstance(random_seed, np.random.SeedSequence)
        else np.random.SeedSequence(random_seed)
    )
    return sequence.spawn(n)


def _check_client(client) -> None:
    try:
        from distributed import Client
    except ImportError as error:
        raise ImportError(
            "`client` needs Dask's distributed scheduler, which is not installed. Install the "
            'cluster extra: pip install "pymc-optim[cluster]".'
        ) from error
    if not isinstance(client, Client):
        raise TypeError(
            f"`client` must be a `distributed.Client` (e.g. `Client(LocalCluster(n_workers=2, "
            f"threads_per_worker=1))`); got {type(client).__name__}. Pass None to fit in this "
            "process."
        )
