"""The graph-native damped Newton Op, shared by minimize, root, their scalar forms and fixed_point.

The Op holds the inner graphs of the merit function, F and A = ∂F/∂x (in the structure's compact
form); no scipy. Under the default backend `perform` runs the numpy loop of
:mod:`pymc_optim._iterations` on compiled inner graphs; under JAX the same loop is a
``jax.lax.while_loop`` (:mod:`pymc_optim._jax`). Differentiation is the shared implicit rule.
"""

from __future__ import annotations

from pymc_optim import _iterations
from pymc_optim._checks import check_iteration_limit, check_tolerance
from pymc_optim._implicit import OptimalityCondition
from pymc_optim._inner_graph import InnerProblem
from pymc_optim._scipy import Packer
from pymc_optim._solver_op import SolverOp

__all__ = ["DEFAULT_MAX_ITER", "DEFAULT_TOL", "NewtonOp", "newton_options"]

#: Stop when max|F| ≤ tol: Newton converges quadratically, so 1e-8 costs one step more than 1e-4.
DEFAULT_TOL = 1e-8
#: Newton needs few steps when it works; 100 leaves room for damped steps far from the solution.
DEFAULT_MAX_ITER = 100


def newton_options(optimizer_kwargs: dict) -> dict:
    """`tol` and `max_iter` from the user's `optimizer_kwargs` (the only ones Newton takes)."""
    unknown = set(optimizer_kwargs) - {"tol", "max_iter"}
    if unknown:
        raise ValueError(
            "`optimizer_kwargs` of `method='newton'` takes only 'tol' and 'max_iter'; got "
            f"{sorted(unknown)}."
        )
    tol = check_tolerance(optimizer_kwargs.get("tol", DEFAULT_TOL), "optimizer_kwargs['tol']")
    max_iter = check_iteration_limit(
        optimizer_kwargs.get("max_iter", DEFAULT_MAX_ITER), "optimizer_kwargs['max_iter']"
    )
    return {"tol": tol, "max_iter": max_iter}


class NewtonOp(SolverOp):
    """Damped Newton on an optimality condition F(x, θ) = 0 with a merit function.

    Parameters
    ----------
    problem : InnerProblem
    condition : OptimalityCondition
        F and the structure of A, on the problem's inner variables.
    merit : TensorVariable
        The objective (``minimization=True``, F its gradient) or ½‖F‖².
    value : TensorVariable
        What :func:`solution_info` reports (objective or residual norm).
    """

    method = "newton"

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition,
        merit,
        value,
        minimization: bool,
        tol: float,
        max_iter: int,
        n_extras: int = 0,
    ):
        super().__init__(problem, condition=condition, n_extras=n_extras)
        self.merit = merit
        self._value = value
        self.minimization = minimization
        self.tol = tol
        self.max_iter = max_iter

    @property
    def value(self):
        return self._value

    def numerical_functions(self):
        system = [self.merit, self.condition.flat_residual(), self.condition.jacobian()]
        return {"system": ([], system), "merit": ([], [self.merit])}

    def solve(self, fns, x0s, params, extras):
        packer = Packer(x0s)
        system_fn, merit_fn = fns["system"], fns["merit"]

        def system(z):
            m, F, A = system_fn(*packer.unpack(z), *params)
            return float(m), F, A

        def merit(z):
            return float(merit_fn(*packer.unpack(z), *params)[0])

        z, success, n_iterations, n_evaluations = _iterations.newton(
            system,
            merit,
            packer.pack(x0s),
            structure=self.condition.structure,
            minimization=self.minimization,
            tol=self.tol,
            max_iter=self.max_iter,
        )
        return packer.unpack(z), success, n_iterations, n_evaluations
