"""pymc_optim: optimization inside probabilistic models, with implicit gradients."""

import importlib.util

from pymc_optim import (
    _rewrites,  # noqa: F401  (registers the scalar-specialization rewrite)
    _structured_linalg,  # noqa: F401  (registers the Kronecker / block-diagonal rewrites)
    _vectorize,  # noqa: F401  (registers native batching)
)
from pymc_optim._solver_op import SolverInfo, solution_info
from pymc_optim._structured_linalg import disable_rewrites, enable_rewrites, rewrites_enabled
from pymc_optim._trace import SolveTrace, solver_trace
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.agents import Equilibrium, Optimum
from pymc_optim.constrained import LagrangeMultipliers, lagrange_multipliers
from pymc_optim.fixed_point import fixed_point
from pymc_optim.laplace import marginalize_laplace, recover_latent
from pymc_optim.minimize import minimize
from pymc_optim.minimize_scalar import minimize_scalar
from pymc_optim.root import root
from pymc_optim.root_scalar import root_scalar

__all__ = [
    "Equilibrium",
    "LagrangeMultipliers",
    "Optimum",
    "PymcOptimWarning",
    "SolveTrace",
    "SolverInfo",
    "disable_rewrites",
    "enable_rewrites",
    "fixed_point",
    "lagrange_multipliers",
    "marginalize_laplace",
    "minimize",
    "minimize_scalar",
    "recover_latent",
    "rewrites_enabled",
    "root",
    "root_scalar",
    "solution_info",
    "solver_trace",
]

__version__ = "0.1.0"

if importlib.util.find_spec("numba") is not None:
    from pymc_optim import _numba  # noqa: F401  (registers the numba implementations)
if importlib.util.find_spec("jax") is not None:
    from pymc_optim import _jax  # noqa: F401  (registers the JAX implementations)
