"""The one implicit-function-theorem rule that differentiates every solver in the package.

Every problem reduces to an optimality condition F(x*, θ) = 0 with a square Jacobian
A = ∂F/∂x: the gradient of the objective for minimization, the equations for root finding,
x − T(x, θ) for a fixed point, the KKT rows (active bounds fixed) for constrained problems.

Notes
-----
Differentiating F(x*(θ), θ) = 0 gives A dx*/dθ + ∂F/∂θ = 0, so for an output gradient ḡ the
pullback is

    solve Aᵀ w = ḡ,      θ̄ = −(∂F/∂θ)ᵀ w = ∂/∂θ [ −wᵀ F(x*, θ) ]   (w and x* held fixed).

That is one linear solve plus one reverse pass of a scalar, whatever the number of parameters:
∂F/∂θ is never formed. The scalar −wᵀF is built on stand-in variables for x* and w, and the
stand-ins are substituted afterwards, so that the returned graph stays connected to x*(θ) and
w(θ): differentiating it again (second derivatives, Hessian-vector products) is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import pytensor.tensor as pt
from pytensor.compile.builders import OpFromGraph
from pytensor.gradient import DisconnectedType, grad
from pytensor.graph.basic import Variable
from pytensor.graph.op import io_connection_pattern
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors, apply_ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg.structure import LinearStructure, _concat_flat

__all__ = ["OptimalityCondition", "differentiated_elsewhere", "implicit_pullback"]


@dataclass(frozen=True)
class OptimalityCondition:
    """F(x, θ) = 0 at the solution, written on a solver Op's inner variables.

    Attributes
    ----------
    xs : the inner control variables (x may be several tensors; F concatenates their sizes).
    params : the inner parameter variables θ.
    residual : the pieces of F, each any shape; their flattened concatenation is F.
    symmetric : whether A = ∂F/∂x is symmetric (true for gradients of an objective).
    structure : the layout of A (dense, diagonal, block-diagonal), see
        :mod:`pymc_optim.linalg.structure`.
    parts : inner expressions a structure builds A from instead of differentiating F (a latent
        Gaussian's prior matrix and likelihood curvature,
        :mod:`pymc_optim.linalg.latent_gaussian`); empty for the other structures.
    """

    xs: Sequence[TensorVariable]
    params: Sequence[TensorVariable]
    residual: Sequence[TensorVariable]
    symmetric: bool
    structure: LinearStructure = LinearStructure()
    parts: Sequence[TensorVariable] = ()

    def flat_residual(self) -> TensorVariable:
        return _concat_flat(self.residual)

    def on(self, xs, params) -> OptimalityCondition:
        """The same condition written on other variables (``xs`` and ``params`` substituted)."""
        replace = dict(zip([*self.xs, *self.params], [*xs, *params], strict=True))
        residual = graph_replace(list(self.residual), replace, strict=False)
        parts = graph_replace(list(self.parts), replace, strict=False) if self.parts else ()
        return OptimalityCondition(xs, params, residual, self.symmetric, self.structure, parts)

    def residual_norm(self) -> TensorVariable:
        """‖F‖₂: what root-finding and fixed-point solvers report as their `value`."""
        # Written on |F|: for a one-element F pytensor's rewrites turn sqrt(F²) into
        # switch(F >= 0, F, nan), which is NaN for F < 0 (and norm(F) into that); on |F| ≥ 0
        # the rewritten form is exact.
        magnitude = pt.abs(self.flat_residual())
        return pt.sqrt((magnitude * magnitude).sum())

    def jacobian(self) -> TensorVariable:
        """A = ∂F/∂x on the inner variables, in the compact form of `structure`."""
        return self.structure.jacobian(self.flat_residual(), self.xs, *self.parts)

    def jacobian_at(self, x_stars, outer_params) -> TensorVariable:
        """A at the solution: `jacobian` with `x_stars` and `outer_params` substituted.

        With `parts` that A is built from alone (``structure.from_parts_alone``), they are
        computed by one Op per condition (an inline OpFromGraph, expanded at compile time) and
        A is built from them by the structure's `jacobian_at_solution`. Every graph that asks
        for A at x* (a Laplace marginal's log-determinant, the implicit pullback's solve) then
        holds the same copy, which merges into one factorization, although PyMC rewrites the
        logp graph (canonicalize, stabilize) before it differentiates it: written out, the two
        copies of A came out of those rewrites in different forms and A was factorized twice
        per evaluation.
        """
        outer = [*x_stars, *outer_params]
        if self.parts and self.structure.from_parts_alone:
            return self.structure.jacobian_at_solution(*self._parts_op(*outer))
        # built on stand-ins with the outer variables' types: static shapes known outside (the
        # size of x, which a dense Jacobian's identity matrix needs) become constants of it
        at = self.on([x.type() for x in x_stars], [p.type() for p in outer_params])
        replace = dict(zip([*at.xs, *at.params], outer, strict=True))
        return graph_replace(at.jacobian(), replace, strict=False)

    @cached_property
    def _parts_op(self) -> OpFromGraph:
        # cached on the condition (cached_property writes past the frozen dataclass's
        # __setattr__): one Op, so equal applications merge
        return OpFromGraph(
            [*self.xs, *self.params],
            list(self.parts),
            inline=True,
            on_unused_input="ignore",
            name="parts_at_solution",
        )

    def jacobian_matrix(self) -> TensorVariable:
        """A = ∂F/∂x as a dense (n, n) matrix on the inner variables."""
        return LinearStructure().jacobian(self.flat_residual(), self.xs)


def implicit_pullback(
    condition: OptimalityCondition,
    x_stars: Sequence[Variable],
    outer_params: Sequence[Variable],
    output_grads: Sequence[Variable],
    *,
    disconnected: bool = False,
) -> list[Variable]:
    """Gradients of the loss with respect to `outer_params`, given ḡ for each of `x_stars`.

    Parameters
    ----------
    condition : OptimalityCondition
        F on the Op's inner variables.
    x_stars : sequence of Variable
        The solution, one outer variable per inner control (substituted for ``condition.xs``).
    outer_params : sequence of Variable
        The outer parameters, one per inner parameter (substituted for ``condition.params``).
    output_grads : sequence of Variable
        ∂L/∂x* for each control; disconnected ones count as zero.
    disconnected : bool, default False
        Return a `DisconnectedType` variable, not zeros, for a parameter that F reaches only
        through inputs differentiated elsewhere (:func:`differentiated_elsewhere`, e.g. the
        Cholesky factor of `covariance_solve`): zeros sent on would be pulled back through the
        parameter's own graph (a Cholesky's gradient of a zero matrix costs two triangular
        solves with n right-hand sides, which no rewrite removes).

    Returns
    -------
    param_grads : list of Variable
        θ̄ for every outer parameter (zeros for parameters F does not depend on, or
        `DisconnectedType` for those differentiated elsewhere, with `disconnected`; ``None`` for
        parameters that are not continuous, e.g. integer or boolean ones).
    """
    g_bar = _concat_flat(
        [
            x.zeros_like(dtype=x.type.dtype) if isinstance(g.type, DisconnectedType) else g
            for x, g in zip(x_stars, output_grads, strict=True)
        ]
    )
    # Stand-ins with the outer variables' types: static shapes known outside become constants
    # of this graph.
    original = condition
    condition = condition.on([x.type() for x in x_stars], [p.type() for p in outer_params])
    F = condition.flat_residual()
    F_params = list(condition.params)
    w_standin = F.type("w")
    continuous = [p for p in condition.params if _is_continuous(p)]
    continuous_grads = grad(
        -(w_standin * F).sum(),
        continuous,
        disconnected_inputs="ignore",
        return_disconnected="disconnected",
    )
    elsewhere = differentiated_elsewhere(condition) if disconnected else [False] * len(F_params)
    cut = {p for p, e in zip(F_params, elsewhere, strict=True) if e}
    continuous_grads = [
        p.zeros_like() if _is_disconnected(g) and p not in cut else g
        for p, g in zip(continuous, continuous_grads, strict=True)
    ]
    by_param = dict(zip(continuous, continuous_grads, strict=True))
    param_grads = [by_param.get(p, pt.constant(0.0)) for p in condition.params]

    to_outer = dict(zip(condition.xs, x_stars, strict=True))
    to_outer.update(zip(condition.params, outer_params, strict=True))
    A = original.jacobian_at(x_stars, outer_params)
    w = condition.structure.solve(A, g_bar, transposed=True, symmetric=condition.symmetric)
    to_outer[w_standin] = w.astype(F.type.dtype)
    connected = [g for p, g in zip(condition.params, param_grads, strict=True) if p not in cut]
    outer_connected = iter(graph_replace(connected, to_outer, strict=False))
    outer_grads = [
        DisconnectedType()() if p in cut else next(outer_connected) for p in condition.params
    ]
    return [
        g if p in cut else g.astype(q.type.dtype) if _is_continuous(q) else None
        for g, p, q in zip(outer_grads, condition.params, outer_params, strict=True)
    ]


def differentiated_elsewhere(condition: OptimalityCondition) -> list[bool]:
    """Per parameter of `condition`: whether F reaches it only through Op inputs that the Op
    lists in its `differentiated_elsewhere` attribute (positions; `covariance_solve` lists its
    Cholesky factor, whose gradient flows through K). Such a parameter gets no gradient from
    the implicit rule. Any other parameter F does not depend on (a constant d² added to an
    objective) gets exact zeros, as `pt.grad` of a graph that takes it gives."""
    params = list(condition.params)
    F = condition.flat_residual()
    marked = [
        node.inputs[i]
        for node in apply_ancestors([F])
        for i in getattr(node.op, "differentiated_elsewhere", ())
    ]
    routed = set(ancestors(marked, blockers=params))
    pattern = io_connection_pattern(params, [F])
    return [not row[0] and p in routed for p, row in zip(params, pattern, strict=True)]


def _is_disconnected(g) -> bool:
    return g is None or isinstance(g.type, DisconnectedType)


def _is_continuous(var: Variable) -> bool:
    return var.type.dtype.startswith("float")
