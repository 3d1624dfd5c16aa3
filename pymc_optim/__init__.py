"""pymc_optim: optimization inside probabilistic models, with implicit gradients."""

from pymc_optim._solver_op import SolverInfo, solution_info
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.minimize import minimize
from pymc_optim.minimize_scalar import minimize_scalar
from pymc_optim.root import root
from pymc_optim.root_scalar import root_scalar

__all__ = [
    "PymcOptimWarning",
    "SolverInfo",
    "minimize",
    "minimize_scalar",
    "root",
    "root_scalar",
    "solution_info",
]

__version__ = "0.1.0"
