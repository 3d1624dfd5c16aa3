"""pymc_optim._deferred: JAX's dispatch for our Ops is registered on PyTensor's first
import of it, so ``import pymc_optim`` does not import JAX."""

import subprocess
import sys
import textwrap

import pytest

from pymc_optim._deferred import after_import

JAX_SOLVE = """
import numpy as np, pytensor, pytensor.tensor as pt
x, a = pt.vector("x"), pt.scalar("a")
x_star, _ = pmo.minimize(((x - a) ** 2).sum(), x, x0=pt.zeros(3), method="newton")
f = pytensor.function([a], [x_star, pytensor.grad(x_star.sum(), a)], mode="JAX")
value, slope = f(2.0)
assert np.allclose(value, 2.0) and np.isclose(slope, 3.0), (value, slope)
"""


def _run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_import_does_not_import_jax_and_the_jax_backend_still_compiles_solvers():
    pytest.importorskip("jax")
    prelude = """
        import sys
        import pymc_optim as pmo
        assert "jax" not in sys.modules, "import pymc_optim imported JAX"
    """
    _run(textwrap.dedent(prelude) + JAX_SOLVE)


@pytest.mark.slow
def test_jax_dispatch_imported_before_the_package_is_registered_at_once():
    pytest.importorskip("jax")
    _run("import pytensor.link.jax.dispatch\nimport pymc_optim as pmo\n" + JAX_SOLVE)


def test_after_import_runs_once_after_the_module_executed(tmp_path, monkeypatch):
    (tmp_path / "deferred_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("deferred_probe", lambda: seen.append(sys.modules["deferred_probe"].VALUE))
    assert seen == []  # not imported yet: nothing ran
    import deferred_probe

    assert seen == [42] and deferred_probe.VALUE == 42
    assert type(deferred_probe.__loader__).__name__ != "_ThenRegister"
    after_import("deferred_probe", lambda: seen.append("again"))  # imported: runs now
    assert seen == [42, "again"]
    monkeypatch.delitem(sys.modules, "deferred_probe")
