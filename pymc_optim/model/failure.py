"""What a failed inner solve does to a model's log density: the `on_failure` policies.

Shared by every model-level helper (Laplace marginals, agents' optimality conditions), so that
one name means one behaviour across the package:

- ``"reject"``: the log-density term becomes −inf where the solve failed, so NUTS rejects the
  point (it shows up as a divergence) and ``pm.find_MAP`` steps back;
- ``"raise"``: evaluating the term raises an ``AssertionError`` naming the failure;
- ``"warn"``: a :class:`~pymc_optim.PymcOptimWarning` is emitted at each failed evaluation and
  the term is computed at the solver's last iterate. Never silent, but not rejected either:
  for exploring a model (``find_MAP``, prior checks), not for final inference.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.raise_op import Assert
from pytensor.tensor.variable import TensorVariable

from pymc_optim._warnings import PymcOptimWarning

__all__ = ["ON_FAILURE", "WarnOnFailure", "apply_failure_policy", "check_on_failure"]

ON_FAILURE = ("reject", "raise", "warn")


def check_on_failure(on_failure: str) -> str:
    """Validate the user's `on_failure` when the graph is built."""
    if on_failure not in ON_FAILURE:
        raise ValueError(
            f"`on_failure` must be one of {', '.join(map(repr, ON_FAILURE))}; got {on_failure!r}."
        )
    return on_failure


def apply_failure_policy(
    term: TensorVariable, success: TensorVariable, on_failure: str, message: str
) -> TensorVariable:
    """`term` (a log-density contribution) under the `on_failure` policy; `message` names
    the solve ("the inner solve of the Laplace marginal did not converge")."""
    check_on_failure(on_failure)
    success = pt.all(success)
    if on_failure == "reject":
        return pt.switch(success, term, -np.inf)
    if on_failure == "raise":
        return Assert(message)(term, success)
    return WarnOnFailure(message)(term, success)


class WarnOnFailure(Op):
    """Pass `value` through; warn (PymcOptimWarning) when `success` is false."""

    __props__ = ("message",)
    view_map = {0: [0]}

    def __init__(self, message: str):
        self.message = message

    def make_node(self, value, success):
        value, success = pt.as_tensor_variable(value), pt.as_tensor_variable(success)
        return Apply(self, [value, success], [value.type()])

    def perform(self, node, inputs, output_storage):
        value, success = inputs
        if not bool(success):
            warnings.warn(
                f"{self.message}; using its last iterate.", PymcOptimWarning, stacklevel=2
            )
        output_storage[0][0] = value

    def infer_shape(self, fgraph, node, shapes):
        return [shapes[0]]

    def L_op(self, inputs, outputs, output_grads):
        return [output_grads[0], disconnected_type()]

    def connection_pattern(self, node):
        return [[True], [False]]
