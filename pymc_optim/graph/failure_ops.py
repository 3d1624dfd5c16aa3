"""The Ops through which a solve's success flag reaches a model's log density: counting failed
evaluations (`CountFailures`) and warning on them (`WarnOnFailure`).

They sit below the model layer because every backend compiles them (the JAX and numba
implementations live in `pymc_optim.backends`); the policies that use them are in
`pymc_optim.model.failure`.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.variable import TensorVariable

from pymc_optim._warnings import PymcOptimWarning

__all__ = ["FAILED_EVALUATIONS", "CountFailures", "WarnOnFailure", "count_failures"]

#: Failed evaluations seen in this process, by the label of the solve (see `CountFailures`).
FAILED_EVALUATIONS: Counter = Counter()


class WarnOnFailure(Op):
    """Pass `value` through; warn (PymcOptimWarning) when `success` is false."""

    #: read by `solution_info` and `lagrange_multipliers`, which look through it to the solve
    passes_value_through = True

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

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def pullback(self, inputs, outputs, output_grads):
        return [output_grads[0], disconnected_type()]

    def connection_pattern(self, node):
        return [[True], [False]]


def count_failures(success: TensorVariable, label: str) -> TensorVariable:
    """`success` (a boolean scalar), tallied in :data:`FAILED_EVALUATIONS` under `label` each
    time it is evaluated to False."""
    return CountFailures(label)(success)


class CountFailures(Op):
    """Pass a boolean `success` through; count the evaluations at which it is False.

    The count lives in the evaluating process (:data:`FAILED_EVALUATIONS`), where
    :class:`~pymc_optim.CountingNUTS` reads it. No rewrite removes the Op (it is not
    elementwise and has no registered rewrite), so the count is of the compiled log density's
    evaluations.
    """

    __props__ = ("label",)
    # the output is the input's buffer: declared, so that no inplace Op overwrites it (which
    # changed the solver's own `success` output: a compiled function returned success=False for
    # a solve its log density had accepted)
    view_map = {0: [0]}

    def __init__(self, label: str):
        self.label = label

    def make_node(self, success):
        success = pt.as_tensor_variable(success)
        if success.type.ndim != 0 or success.type.dtype != "bool":
            raise TypeError(f"`success` must be a boolean scalar; got {success.type}.")
        return Apply(self, [success], [success.type()])

    def perform(self, node, inputs, output_storage):
        (success,) = inputs
        if not bool(success):
            FAILED_EVALUATIONS[self.label] += 1
        output_storage[0][0] = np.asarray(success)

    def infer_shape(self, node, shapes):
        return [()]

    def pullback(self, inputs, outputs, output_grads):
        return [disconnected_type()]

    def connection_pattern(self, node):
        return [[False]]
