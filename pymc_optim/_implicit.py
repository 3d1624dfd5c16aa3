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
from typing import Literal

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, grad, jacobian
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace
from pytensor.tensor.variable import TensorVariable

__all__ = ["LINEAR_STRUCTURES", "OptimalityCondition", "implicit_pullback"]

LinearStructure = Literal["dense", "diagonal"]
LINEAR_STRUCTURES = ("dense", "diagonal")


@dataclass(frozen=True)
class OptimalityCondition:
    """F(x, θ) = 0 at the solution, written on a solver Op's inner variables.

    Attributes
    ----------
    xs : the inner control variables (x may be several tensors; F concatenates their sizes).
    params : the inner parameter variables θ.
    residual : the pieces of F, each any shape; their flattened concatenation is F.
    symmetric : whether A = ∂F/∂x is symmetric (true for gradients of an objective).
    structure : "dense" (general A) or "diagonal" (F_i depends on x only through x_i).
    """

    xs: Sequence[TensorVariable]
    params: Sequence[TensorVariable]
    residual: Sequence[TensorVariable]
    symmetric: bool
    structure: LinearStructure = "dense"

    def flat_residual(self) -> TensorVariable:
        return _concat_flat(self.residual)

    def jacobian_matrix(self) -> TensorVariable:
        """A = ∂F/∂x as an (n, n) matrix on the inner variables (dense structure)."""
        F = self.flat_residual()
        blocks = jacobian(F, list(self.xs), vectorize=True, disconnected_inputs="ignore")
        return pt.concatenate(
            [b.reshape((F.shape[0], x.size)) for b, x in zip(blocks, self.xs, strict=True)], axis=1
        )

    def jacobian_diagonal(self) -> TensorVariable:
        """diag(A) as a vector, valid when A is diagonal: then Aᵀ1 = diag(A), one reverse pass."""
        F = self.flat_residual()
        cols = grad(F.sum(), list(self.xs), disconnected_inputs="ignore")
        return _concat_flat(cols)


def implicit_pullback(
    condition: OptimalityCondition,
    x_stars: Sequence[Variable],
    outer_params: Sequence[Variable],
    output_grads: Sequence[Variable],
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

    Returns
    -------
    param_grads : list of Variable
        θ̄ for every outer parameter (zeros for parameters F does not depend on; ``None`` for
        parameters that are not continuous, e.g. integer or boolean ones).
    """
    g_bar = _concat_flat(
        [
            x.zeros_like(dtype=x.type.dtype) if isinstance(g.type, DisconnectedType) else g
            for x, g in zip(x_stars, output_grads, strict=True)
        ]
    )
    F = condition.flat_residual()
    w_standin = F.type("w")
    continuous = [p for p in condition.params if _is_continuous(p)]
    continuous_grads = grad(
        -(w_standin * F).sum(),
        continuous,
        disconnected_inputs="ignore",
    )
    by_param = dict(zip(continuous, continuous_grads, strict=True))
    param_grads = [by_param.get(p, pt.constant(0.0)) for p in condition.params]

    to_outer = dict(zip(condition.xs, x_stars, strict=True))
    to_outer.update(zip(condition.params, outer_params, strict=True))
    if condition.structure == "diagonal":
        diag = graph_replace(condition.jacobian_diagonal(), to_outer, strict=False)
        w = g_bar / diag
    else:
        A = graph_replace(condition.jacobian_matrix(), to_outer, strict=False)
        assume_a = "sym" if condition.symmetric else "gen"
        w = pt.linalg.solve(A if condition.symmetric else A.T, g_bar, assume_a=assume_a)
    to_outer[w_standin] = w.astype(F.type.dtype)
    outer_grads = graph_replace(param_grads, to_outer, strict=False)
    return [
        g.astype(p.type.dtype) if _is_continuous(p) else None
        for g, p in zip(outer_grads, outer_params, strict=True)
    ]


def _concat_flat(pieces: Sequence[Variable]) -> TensorVariable:
    pieces = [pt.as_tensor_variable(p).ravel() for p in pieces]
    return pieces[0] if len(pieces) == 1 else pt.concatenate(pieces)


def _is_continuous(var: Variable) -> bool:
    return var.type.dtype.startswith("float")
