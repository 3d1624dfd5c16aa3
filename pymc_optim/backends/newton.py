"""The graph-native damped Newton Op, shared by minimize, root, their scalar forms and fixed_point.

The Op holds the inner graphs of the merit function, F and A = ∂F/∂x (in the structure's compact
form); no scipy. Under the default backend `perform` runs the numpy loop of
:mod:`pymc_optim.backends.iterations` on compiled inner graphs; under JAX the same loop is a
``jax.lax.while_loop`` (:mod:`pymc_optim.backends.jax`). Differentiation is the shared implicit
rule.
"""

from __future__ import annotations

from pymc_optim.backends import iterations as _iterations
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.implicit import OptimalityCondition

__all__ = ["DEFAULT_MAX_ITER", "DEFAULT_TOL", "NewtonOp"]

#: Stop when max|F| ≤ tol: Newton converges quadratically, so 1e-8 costs one step more than 1e-4.
DEFAULT_TOL = 1e-8
#: Newton needs few steps when it works; 100 leaves room for damped steps far from the solution.
DEFAULT_MAX_ITER = 100


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
