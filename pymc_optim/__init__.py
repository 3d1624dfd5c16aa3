"""pymc_optim: optimization inside probabilistic models, with implicit gradients."""

import importlib.util

from pymc_optim import _versions  # noqa: F401  (first: an old PyMC line is named, not a deep error)
from pymc_optim._deferred import after_import
from pymc_optim._warnings import PymcOptimWarning
from pymc_optim.backends import vectorize as _vectorize  # noqa: F401  (native batching)
from pymc_optim.graph.diagnostics import SolverInfo, solution_info, solver_trace
from pymc_optim.graph.status import SolverStatus
from pymc_optim.graph.trace import SolveTrace
from pymc_optim.model.agents import Equilibrium, Optimum
from pymc_optim.model.failure import CountingNUTS, failure_summary
from pymc_optim.model.inla import fit_inla, plot_inla_marginals
from pymc_optim.model.inla_many import FitFailure, fit_inla_many
from pymc_optim.model.laplace import LaplaceInfo, laplace_info, marginalize_laplace, recover_latent
from pymc_optim.model.laplace_error import LaplaceError, laplace_error
from pymc_optim.model.laplace_predictive import sample_posterior_predictive
from pymc_optim.problems.constrained import LagrangeMultipliers, lagrange_multipliers
from pymc_optim.problems.fixed_point import fixed_point
from pymc_optim.problems.minimize import minimize
from pymc_optim.problems.minimize_scalar import minimize_scalar
from pymc_optim.problems.root import root
from pymc_optim.problems.root_scalar import root_scalar
from pymc_optim.rewrites import blockwise_split as _blockwise_split  # noqa: F401  (registers it)
from pymc_optim.rewrites import composite_inputs as _composite_inputs  # noqa: F401  (same)
from pymc_optim.rewrites import scalar as _scalar  # noqa: F401  (registers the rewrite)
from pymc_optim.rewrites import stack_trace as _stack_trace  # noqa: F401  (wraps a rewrite)
from pymc_optim.rewrites import structured_linalg as _structured_linalg  # noqa: F401  (same)
from pymc_optim.rewrites.switch import disable_rewrites, enable_rewrites, rewrites_enabled

__all__ = [
    "CountingNUTS",
    "Equilibrium",
    "FitFailure",
    "LagrangeMultipliers",
    "LaplaceError",
    "LaplaceInfo",
    "Optimum",
    "PymcOptimWarning",
    "SolveTrace",
    "SolverInfo",
    "SolverStatus",
    "disable_rewrites",
    "enable_rewrites",
    "failure_summary",
    "fit_inla",
    "fit_inla_many",
    "fixed_point",
    "lagrange_multipliers",
    "laplace_error",
    "laplace_info",
    "marginalize_laplace",
    "minimize",
    "minimize_scalar",
    "plot_inla_marginals",
    "recover_latent",
    "rewrites_enabled",
    "root",
    "root_scalar",
    "sample_posterior_predictive",
    "solution_info",
    "solver_trace",
]

__version__ = "0.1.0"

if importlib.util.find_spec("numba") is not None:
    from pymc_optim.backends import numba as _numba  # noqa: F401  (numba implementations)
if importlib.util.find_spec("jax") is not None:
    # the JAX implementations, registered when PyTensor's JAX dispatch is first imported
    after_import(
        "pytensor.link.jax.dispatch", lambda: importlib.import_module("pymc_optim.backends.jax")
    )
