"""`pymc_optim.backends.numba_outline`: a numba function called through its address.

The caller must not contain the callee's code, must get its results, references and
exceptions as from a linked call, and a solver's loop must be found again, from numba's disk
cache, in a new process whose log density PyTensor loads from its own cache.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.testing import assert_allclose

numba = pytest.importorskip("numba")

from pytensor.link.numba.dispatch.basic import numba_njit  # noqa: E402

from pymc_optim.backends.numba_outline import call_outlined, outline  # noqa: E402


@numba_njit
def _scaled_copy(x, scale):
    if scale < 0:
        raise ValueError("negative scale")
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = scale * x[i]
    return out, x.sum()


outline("test_scaled_copy", _scaled_copy)


@numba.njit  # (PyTensor's numba_njit has no wrapper to be called from Python)
def _caller(x, scale):
    out, total = call_outlined("test_scaled_copy", (x, scale))
    return out + 1.0, total


@numba.njit
def _caller_catching(x, scale):
    try:
        out, _ = call_outlined("test_scaled_copy", (x, scale))
    except Exception:
        return np.full(x.shape, np.nan)
    return out


def test_results_and_exceptions_are_those_of_the_callee():
    x = np.arange(4.0)
    out, total = _caller(x, 2.0)
    assert_allclose(out, 2.0 * x + 1.0)
    assert total == 6.0
    with pytest.raises(ValueError, match="negative scale"):
        _caller(x, -1.0)
    assert np.isnan(_caller_catching(x, -1.0)).all()
    assert_allclose(_caller_catching(x, 3.0), 3.0 * x)


def _linked(library, seen=None) -> set:
    """The libraries numba links into `library`'s module, recursively."""
    seen = set() if seen is None else seen
    for dependency in library._linking_libraries:
        if dependency not in seen:
            seen.add(dependency)
            _linked(dependency, seen)
    return seen


def test_the_caller_holds_no_copy_of_the_callee():
    @numba.njit
    def linked_caller(x, scale):
        return _scaled_copy(x, scale)

    _caller(np.arange(3.0), 1.0)
    linked_caller(np.arange(3.0), 1.0)
    (callee,) = _scaled_copy.overloads.values()
    (caller,) = _caller.overloads.values()
    (linking,) = linked_caller.overloads.values()
    assert callee.library in _linked(linking.library)  # what a direct call does
    assert callee.library not in _linked(caller.library)


def test_an_unregistered_key_is_refused_when_the_caller_is_compiled():
    @numba.njit
    def unknown(x):
        return call_outlined("no such function", (x,))

    with pytest.raises(Exception, match="no numba function is registered"):
        unknown(np.zeros(2))


_SOLVE = textwrap.dedent(
    """
    import json
    import numpy as np
    import pytensor
    import pytensor.tensor as pt
    import pymc_optim as pmo
    from pymc_optim.backends import numba_outline

    x, a = pt.vector("x"), pt.vector("a")
    objective = ((x - a) ** 2).sum() + ((x[1:] - x[:-1]) ** 2).sum() + (x**4).sum()
    x_star, _ = pmo.minimize(objective, x, x0=pt.zeros_like(a), method="newton")
    fn = pytensor.function([a], [x_star, pytensor.grad(x_star.sum(), a)], mode="NUMBA")
    values = [v.tolist() for v in fn(np.linspace(-1.0, 1.0, 5))]
    hits = sum(sum(d.stats.cache_hits.values()) for d in numba_outline._FUNCTIONS.values())
    print(json.dumps({"values": values, "cache_hits": hits}))
    """
)


@pytest.mark.slow
def test_a_new_process_loads_the_solver_loop_from_the_disk_cache(tmp_path):
    """The second process compiles nothing of the loop and gets the first one's numbers."""
    import json

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    env["PYTENSOR_FLAGS"] = f"base_compiledir={tmp_path / 'pytensor'}"
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _SOLVE], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["cache_hits"] == 0
    assert runs[1]["cache_hits"] >= 1
    for first, second in zip(runs[0]["values"], runs[1]["values"], strict=True):
        assert_allclose(second, first, rtol=0, atol=0)
