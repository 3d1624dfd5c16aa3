"""The graph-native fixed-point Op: plain and Anderson-accelerated iteration on compiled graphs."""

from __future__ import annotations

from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends import iterations as _iterations
from pymc_optim.backends.packing import Packer
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.graph.solver_op import SolverOp
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.structure import _concat_flat

__all__ = ["FixedPointOp"]


class FixedPointOp(SolverOp):
    """x* = T(x*, θ) by plain or Anderson-accelerated iteration; see :func:`fixed_point`."""

    __props__ = ("n_extras", "method", "tol", "max_iter")
    LOOP_OPTIONS = __props__

    def __init__(
        self,
        problem: InnerProblem,
        *,
        condition: OptimalityCondition,
        method: str,
        tol: float,
        max_iter: int,
    ):
        super().__init__(problem, condition=condition)
        self.method = method
        self.tol = _iterations.reachable_tolerance(tol, [x.type.dtype for x in problem.inner_xs])
        self.max_iter = max_iter

    @property
    def flat_update(self) -> TensorVariable:
        """T(x, θ) flattened, on the inner variables."""
        return _concat_flat(self.problem.inner_outputs)

    def numerical_functions(self):
        return {"update": ([], [self.flat_update])}

    def solve(self, fns, x0s, params, extras, state):
        packer = Packer(x0s)
        update_fn = fns["update"]

        def update(z):
            return update_fn(*packer.unpack(z), *params)[0]

        loop = (
            _iterations.anderson if self.method == "anderson" else _iterations.fixed_point_iteration
        )
        z, success, n_iterations, n_evaluations, status = loop(
            update, packer.pack(x0s), tol=self.tol, max_iter=self.max_iter
        )
        return packer.unpack(z), success, n_iterations, n_evaluations, status
