"""The KKT conditions of a constrained problem, on a solver Op's inner variables.

See :mod:`pymc_optim.problems.constrained` for the rows and how the active set is carried by the
signs of the multipliers.

The Newton-KKT matrix's layout, :class:`~pymc_optim.linalg.kkt.KKTStructure`, is in
:mod:`pymc_optim.linalg.kkt` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import pytensor.tensor as pt
from pytensor.gradient import grad
from pytensor.tensor.variable import TensorVariable

from pymc_optim.backends.newton import NewtonOp
from pymc_optim.graph.inner_graph import InnerProblem
from pymc_optim.implicit import OptimalityCondition
from pymc_optim.linalg.kkt import KKTStructure
from pymc_optim.linalg.structure import LinearStructure, _concat_flat

__all__ = ["KKT", "KKTNewtonOp", "KKTStructure"]


class KKT:
    """The KKT rows of the problem on the Op's inner variables (the rows:
    :mod:`pymc_optim.problems.constrained`; their Newton matrix: :mod:`pymc_optim.linalg.kkt`)."""

    def __init__(self, problem: InnerProblem, kinds: Sequence[str], bounds: Sequence):
        self.problem = problem
        self.kinds = list(kinds)
        self.bounds = list(bounds)  # [lower, upper] inner parameters, or []
        self.x = problem.inner_xs[0]
        self.objective = problem.inner_outputs[0]
        self.funs = list(problem.inner_outputs[1:])
        self.multipliers = list(problem.inner_xs[1 : 1 + len(self.funs)])
        self.bound_multiplier = problem.inner_xs[-1] if self.bounds else None

    @cached_property
    def lagrangian(self) -> TensorVariable:
        """f − Σ λ_kᵀc_k − Σ μ_kᵀd_k (without the bound term −νᵀx, linear in x)."""
        return self.objective - sum(
            (m * c).sum() for m, c in zip(self.multipliers, self.funs, strict=True)
        )

    @cached_property
    def lagrangian_gradient(self) -> TensorVariable:
        """∇ₓ(f − Σ λ_kᵀc_k − Σ μ_kᵀd_k) − ν."""
        g = grad(self.lagrangian, self.x)
        return g - self.bound_multiplier if self.bounds else g

    def residual(self, active_ineq, at_lower, at_upper) -> list[TensorVariable]:
        """The KKT rows with the active set given by boolean tensors (None: equality only)."""
        rows = [self.lagrangian_gradient]
        activity = iter(active_ineq)
        for c, m, kind in zip(self.funs, self.multipliers, self.kinds, strict=True):
            rows.append(c if kind == "eq" else pt.switch(next(activity), c, m))
        if self.bounds:
            lower, upper = (pt.broadcast_to(b, self.x.shape) for b in self.bounds)
            nu = self.bound_multiplier
            rows.append(
                pt.switch(at_lower, self.x - lower, pt.switch(at_upper, self.x - upper, nu))
            )
        return rows

    @cached_property
    def condition(self) -> OptimalityCondition:
        """F = 0 with the active set read from the multipliers' signs (the Op's outputs)."""
        ineq = [m > 0 for m, k in zip(self.multipliers, self.kinds, strict=True) if k == "ineq"]
        nu = self.bound_multiplier
        rows = self.residual(ineq, nu > 0 if self.bounds else None, nu < 0 if self.bounds else None)
        return OptimalityCondition(
            self.problem.inner_xs, self.problem.inner_params, rows, symmetric=False
        )

    def newton_condition(self, structure: LinearStructure) -> OptimalityCondition:
        """The equality-only KKT rows with A in `structure` (dense, or a :class:`KKTStructure`
        built from ∇ₓL and c, the condition's `parts`)."""
        condition = self.condition
        if not isinstance(structure, KKTStructure):
            return OptimalityCondition(
                condition.xs, condition.params, condition.residual, False, structure
            )
        parts = (self.lagrangian_gradient, _concat_flat(self.funs))
        return OptimalityCondition(
            condition.xs, condition.params, condition.residual, False, structure, parts
        )

    @cached_property
    def flags(self) -> list[TensorVariable]:
        """Boolean inputs that fix the active set, for the numerical polish."""
        flags = [
            pt.tensor(dtype="bool", shape=c.type.shape, name=f"active_{k}")
            for k, (c, kind) in enumerate(zip(self.funs, self.kinds, strict=True))
            if kind == "ineq"
        ]
        if self.bounds:
            flags += [pt.tensor(dtype="bool", shape=self.x.type.shape, name=s) for s in "lu"]
        return flags

    def fixed_set_system(self) -> tuple[list, list[TensorVariable]]:
        """``(flags, [F, A])``: the KKT residual and its dense Jacobian with the active set as
        inputs."""
        n_ineq = self.kinds.count("ineq")
        ineq = self.flags[:n_ineq]
        at_lower, at_upper = self.flags[n_ineq:] if self.bounds else (None, None)
        rows = self.residual(ineq, at_lower, at_upper)
        condition = OptimalityCondition(
            self.problem.inner_xs, self.problem.inner_params, rows, symmetric=False
        )
        return self.flags, [condition.flat_residual(), condition.jacobian_matrix()]


class KKTNewtonOp(NewtonOp):
    """Graph-native Newton on the KKT system of an equality-constrained problem.

    A NewtonOp that also carries its `kkt`, so that :func:`lagrange_multipliers` can tell its
    multiplier outputs apart.
    """

    def __init__(self, problem: InnerProblem, *, kkt: KKT, **newton_kwargs):
        super().__init__(problem, **newton_kwargs)
        self.kkt = kkt
