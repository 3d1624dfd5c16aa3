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
    "as_expression",
    "build_inner_problem",
    "cast_initial_guess",
    "check_block_size",
    "check_initial_guess",
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

    def __reduce__(self):
        # The outer parameters are the user's graph (for PyMC models, variables holding
        # unpicklable repr partials); they are only needed to apply the Op, when the graph is
        # built. A pickled Op (compile_logp(), pm.sample with cores > 1) keeps the inner graph.
        return (InnerProblem, (self.inner_xs, self.inner_params, self.inner_outputs, []))

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


def as_expression(value, argument: str) -> TensorVariable:
    """`value` (the objective, equations, an update, a constraint's `fun`) as a tensor variable:
    a symbolic expression of `x`, not None or a Python function."""
    if value is None:
        raise TypeError(
            f"`{argument}` must be a PyTensor expression of `x` and the parameters; got None. "
            "Build it from `x`, e.g. `((x - a) ** 2).sum()`."
        )
    if callable(value) and not isinstance(value, Variable):
        name = getattr(value, "__name__", type(value).__name__)
        raise TypeError(
            f"`{argument}` must be a symbolic PyTensor expression of `x`, not a Python function; "
            f"got `{name}`. Call it on the symbolic variable instead, e.g. pass `{name}(x)`."
        )
    try:
        return pt.as_tensor_variable(value)
    except (TypeError, ValueError, NotImplementedError) as err:
        raise TypeError(
            f"`{argument}` must be a PyTensor expression of `x` and the parameters; got "
            f"{type(value).__name__} {value!r}, which is not a tensor ({err})."
        ) from None


def check_block_size(structure, xs: Sequence[TensorVariable]) -> None:
    """A block-diagonal structure's `block_size` must divide x's total size (checked where
    that size is known statically; otherwise the solve reports failure at run time). A
    structure still to be detected (``"auto"``) has no block size to check."""
    if getattr(structure, "kind", None) != "block_diagonal":
        return
    shapes = [x.type.shape for x in xs]
    if any(None in shape for shape in shapes):
        return
    size = sum(int(np.prod(shape, dtype=int)) for shape in shapes)
    if size % structure.block_size:
        raise ValueError(
            f"`block_size` must divide the size of `x` (blocks of consecutive elements); got "
            f"block_size={structure.block_size} for `x` of size {size}. Choose a divisor of "
            f"{size}, or `structure='dense'`."
        )


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
        x0i = check_initial_guess(x0i, xi)
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


def check_initial_guess(x0, x: TensorVariable) -> TensorVariable:
    """`x0` as a tensor of `x`'s dtype: real, at most `x`'s dimensions, and of `x`'s static
    shape where both are known (a mismatch is refused here, not left to a run-time assertion)."""
    x0 = pt.as_tensor_variable(x0)
    if x0.type.dtype.startswith("complex"):
        raise TypeError(
            f"`x0` for `{x}` must be real, like `x` ({x.type.dtype}); got dtype "
            f"{x0.type.dtype}. Pass the real part (`np.real(x0)`), or split a complex unknown "
            "into its real and imaginary parts."
        )
    if x0.ndim > x.ndim:
        raise ValueError(
            f"`x0` for `{x}` must have at most {x.ndim} dimensions like `x`; "
            f"got {x0.ndim} dimensions."
        )
    if x0.ndim == x.ndim and any(
        a is not None and b is not None and a != b
        for a, b in zip(x0.type.shape, x.type.shape, strict=True)
    ):
        raise ValueError(
            f"`x0` for `{x}` must have `x`'s shape {x.type.shape}; got shape {x0.type.shape}. "
            "Pass one initial value per element of `x` (or one number to broadcast)."
        )
    if x0 is not x and x in ancestors([x0]):
        raise ValueError(
            f"`x0` for `{x}` is computed from `{x}` itself ({x0}), which has no value before "
            "the solve. Write it from the parameters or as numbers: e.g. "
            "`pt.zeros_like(a)` for a parameter `a` of `x`'s shape, or `np.zeros(n)`."
        )
    return x0.astype(x.type.dtype)


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
