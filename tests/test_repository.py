"""The repository keeps its promises: the README's commands are the ones CI and users run."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci_script.splitlines()


def test_ruff_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_demo_runs_and_checks_itself():
    demo = quick_start_commands()[0].split("&&")[-1].split()
    result = subprocess.run(
        [sys.executable, *demo[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "posterior of c" in result.stdout


def test_readme_lists_every_public_name():
    from pymc_optim import __all__ as public
    from pymc_optim.datasets import __all__ as datasets
    from pymc_optim.distributions import __all__ as distributions

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What is there", 1)[1].split("\n\n", 2)[1]
    names = [*public, *datasets, *distributions]
    missing = [name for name in names if not re.search(rf"\b{name}\b", table)]
    assert not missing, f"the README's table lacks {missing}"


def test_readme_table_names_import_where_it_says():
    """Every dotted `pymc_optim.<module>.<Name>` in the README's table is importable as written."""
    import importlib

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What is there", 1)[1].split("\n\n", 2)[1]
    dotted = set(re.findall(r"`(pymc_optim(?:\.\w+)+)", table))
    assert dotted, "the table names no module path"
    unreachable = []
    for path in sorted(dotted):
        module, _, name = path.rpartition(".")
        try:
            importlib.import_module(path)
        except ImportError:
            if not hasattr(importlib.import_module(module), name):
                unreachable.append(path)
    assert not unreachable, f"the README names {unreachable}, which do not import as written"


@pytest.mark.slow
def test_blackjax_sampler_runs_a_solver_model():
    # The README promises pm.sample(nuts_sampler="blackjax") after installing the backends
    # extra, whose blackjax pin this checks (a graph-native solve inside the model).
    pytest.importorskip("blackjax")
    import pymc as pm
    import pytensor.tensor as pt

    import pymc_optim as pmo

    with pm.Model():
        a = pm.LogNormal("a", 0.0, 0.3)
        p = pt.scalar("p")
        price = pmo.Equilibrium("price", a / p - p, p, x0=1.0, method="newton")
        pm.Normal("obs", price, 0.1, observed=[2.0, 2.1])
        idata = pm.sample(
            100, tune=100, chains=1, nuts_sampler="blackjax", progressbar=False, random_seed=1
        )
    # the equilibrium price is sqrt(a). Newton stops at |F| <= 1e-8 and |F'| = a/p² + 1 >= 1,
    # so |p - sqrt(a)| <= 1e-8 to first order; 1e-7 leaves room for rounding.
    a_draws, price_draws = idata.posterior["a"].values, idata.posterior["price"].values
    assert a_draws.shape == (1, 100)
    assert abs(price_draws - a_draws**0.5).max() < 1e-7
