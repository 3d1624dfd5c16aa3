"""Split a user's graph into the solver's control variables, its parameters and its inner graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "InnerProblem",
    "as_control_variables",
    "build_inner_problem",
    "cast_initial_guess",
    "static_size",
]


@dataclass(frozen=True)
class InnerProblem:
    """The pieces of a user's graph once `x` has been separated from the parameters.

    Attributes
    ----------
    inner_xs : fresh variables standing for the controls inside the solver.
    inner_params : fresh variables standing for the parameters inside the solver.
    inner_outputs : the user's expressions rewritten in terms of ``inner_xs`` and ``inner_params``.
    outer_params : the outer expressions that feed ``inner_params`` (the Op's parameter inputs).
    """

    inner_xs: list[TensorVariable]
    inner_params: list[TensorVariable]
    inner_outputs: list[TensorVariable]
    outer_params: list[TensorVariable]

    def with_parameters(self, outer: Sequence[TensorVariable]) -> tuple[InnerProblem, list]:
        """Add solver parameters that are not in the user's graph (e.g. bounds).

        Returns the extended problem and the inner variables standing for `outer`.
        """
        inner = [v.type(name=v.name) for v in outer]
        extended = InnerProblem(
            self.inner_xs,
            [*self.inner_params, *inner],
            self.inner_outputs,
            [*self.outer_params, *outer],
        )
        return extended, inner


def as_control_variables(x, argument: str = "x") -> tuple[list[TensorVariable], bool]:
    """Normalize `x` to a list of root float tensor variables, and say whether it was a list."""
    is_list = isinstance(x, list | tuple)
    xs = list(x) if is_list else [x]
    if is_list and not xs:
        raise ValueError(f"`{argument}` must hold at least one variable; got an empty list.")
    for xi in xs:
        if not isinstance(xi, TensorVariable):
            raise TypeError(
                f"`{argument}` must be a PyTensor tensor variable (or a list of them); "
                f"got {type(xi).__name__}. Create it with e.g. `pt.vector('x')`."
            )
        if isinstance(xi, Constant):
            raise TypeError(
                f"`{argument}` must be a free input variable, not a constant; got {xi}. "
                "Pass a variable created with e.g. `pt.vector('x')`."
            )
        if xi.owner is not None:
            raise ValueError(
                f"`{argument}` must be an input of the objective's graph; got `{xi}`, which is "
                "computed from other variables. Pass the root variable instead."
            )
        if not xi.type.dtype.startswith("float"):
            raise TypeError(
                f"`{argument}` must have a floating-point dtype; got `{xi}` of dtype "
                f"{xi.type.dtype}. Use e.g. `pt.vector('x', dtype='float64')`."
            )
    if len(set(xs)) != len(xs):
        raise ValueError(f"`{argument}` lists the same variable twice; got {xs}.")
    return xs, is_list


def cast_initial_guess(x0, xs: Sequence[TensorVariable], is_list: bool) -> list[TensorVariable]:
    """Turn `x0` (None, numbers, arrays or expressions) into one outer variable per control."""
    if x0 is None:
        return list(xs)
    x0s = list(x0) if is_list else [x0]
    if len(x0s) != len(xs):
        raise ValueError(
            f"`x0` must give one initial guess per variable in `x`; got {len(x0s)} for {len(xs)}."
        )
    out = []
    for xi, x0i in zip(xs, x0s, strict=True):
        x0i = pt.as_tensor_variable(x0i)
        if x0i.ndim > xi.ndim:
            raise ValueError(
                f"`x0` for `{xi}` must have at most {xi.ndim} dimensions like `x`; "
                f"got {x0i.ndim} dimensions."
            )
        x0i = x0i.astype(xi.type.dtype)
        if x0i.ndim < xi.ndim:
            if None in xi.type.shape:
                raise ValueError(
                    f"`x0` for `{xi}` must have {xi.ndim} dimensions like `x` when `x`'s shape is "
                    f"not known statically; got {x0i.ndim} dimensions. Pass a full-shape array, "
                    "or give `x` a static shape (e.g. `pt.vector('x', shape=(3,))`)."
                )
            x0i = pt.broadcast_to(x0i, xi.type.shape)
        out.append(pt.specify_shape(x0i, xi.type.shape))
    return out


def build_inner_problem(
    outputs: Sequence[TensorVariable], xs: Sequence[TensorVariable], *, argument: str = "objective"
) -> InnerProblem:
    """Separate `outputs`' graph into controls `xs`, parameters and the x-dependent inner graph.

    The parameters are the largest sub-expressions that do not depend on any of `xs` (constants
    excepted). They become inputs of the solver Op, so that they are computed once per solve
    outside it, not at every inner iteration, and so that gradients flow to them through ordinary
    graph differentiation.
    """
    outputs = list(outputs)
    all_ancestors = set(ancestors(outputs))
    for xi in xs:
        if xi not in all_ancestors:
            raise ValueError(
                f"`x` must be an input of the {argument}'s graph; `{xi}` does not appear in it. "
                f"Build the {argument} from `x` (e.g. `((x - a) ** 2).sum()`)."
            )

    depends_on_x = set(xs)
    for node in io_toposort(list(xs), outputs):
        if any(inp in depends_on_x for inp in node.inputs):
            depends_on_x.update(node.outputs)
            if isinstance(node.op, RandomVariable):
                raise ValueError(
                    f"The {argument} must be deterministic, but its graph draws from the random "
                    f"variable `{node.outputs[1]}` that depends on `x`. Use its log-density "
                    "(`pm.logp(dist, value)`) instead of a random draw."
                )
    for out in outputs:
        if out not in depends_on_x:
            raise ValueError(
                f"The {argument} `{out}` does not depend on `x`; there is nothing to solve for."
            )

    frontier: list[Variable] = []
    seen = set()
    for node in io_toposort(list(xs), outputs):
        if not any(inp in depends_on_x for inp in node.inputs):
            continue
        for inp in node.inputs:
            if inp in depends_on_x or inp in seen or _is_constant_expression(inp):
                continue
            seen.add(inp)
            _reject_unregistered_random_draw(inp, argument)
            frontier.append(inp)

    inner_xs = [xi.type(name=xi.name) for xi in xs]
    inner_params = [p.type(name=p.name) for p in frontier]
    replace = dict(zip([*xs, *frontier], [*inner_xs, *inner_params], strict=True))
    inner_outputs = clone_replace(outputs, replace=replace)
    return InnerProblem(inner_xs, inner_params, list(inner_outputs), frontier)


def static_size(*variables: Variable) -> int | None:
    """The total number of elements of `variables` when their shapes are known statically, else
    None."""
    shapes = [v.type.shape for v in variables]
    if any(None in shape for shape in shapes):
        return None
    return int(sum(np.prod(shape, dtype=int) for shape in shapes))


def _is_constant_expression(var: Variable) -> bool:
    """Constants and expressions of constants only (e.g. a broadcast literal) stay inside."""
    return all(isinstance(root, Constant) for root in graph_inputs([var]))


def _reject_unregistered_random_draw(var: Variable, argument: str) -> None:
    """Parameters may be model variables, but not ad-hoc random draws (`pm.Normal.dist(...)`).

    Model variables are those of the current model context, or the wrapped variables of PyMC's
    FunctionGraph representation of a model (``ModelVar`` Ops), as model transformations use.
    """
    import pymc as pm
    from pymc.model.fgraph import ModelVar

    model = pm.Model.get_context(error_if_none=False)
    registered = set(model.basic_RVs) if model is not None else set()
    stack, seen = [var], set()
    while stack:
        anc = stack.pop()
        if anc in seen or anc in registered or anc.owner is None:
            continue
        seen.add(anc)
        if isinstance(anc.owner.op, ModelVar):
            continue
        if isinstance(anc.owner.op, RandomVariable):
            raise ValueError(
                f"The {argument} must be deterministic, but its graph contains the random draw "
                f"`{anc}`, which is not a variable of the current model. Use its log-density "
                "(`pm.logp(dist, value)`) or register it in the model."
            )
        stack.extend(anc.owner.inputs)
