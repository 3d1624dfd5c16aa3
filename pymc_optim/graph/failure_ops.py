"""The Ops through which a solve's success flag reaches a model's log density: counting failed
evaluations, in all and by reason (`CountFailures`), and warning on them (`WarnOnFailure`).

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
from pymc_optim.graph.status import SolverStatus

__all__ = [
    "FAILED_EVALUATIONS",
    "FAILED_EVALUATIONS_BY_REASON",
    "FAILURE_REASONS",
    "CountFailures",
    "WarnOnFailure",
    "count_failures",
    "failure_reason",
    "first_failure_code",
    "record_failure",
]

#: Failed evaluations seen in this process, by the label of the solve (see `CountFailures`).
FAILED_EVALUATIONS: Counter = Counter()
#: The same evaluations by ``(label, reason)``: each is counted under exactly one reason (see
#: `failure_reason`), so the reasons of a label sum to its count in `FAILED_EVALUATIONS`.
FAILED_EVALUATIONS_BY_REASON: Counter = Counter()

#: The reason of a failed evaluation whose solve reported no status (a success flag that no
#: solver Op computed, or a status of 0 beside a false flag).
UNKNOWN_REASON = "unknown"
#: Every reason a failed evaluation is counted under: the failing `SolverStatus` names, then
#: `UNKNOWN_REASON`.
FAILURE_REASONS = (
    *(status.name.lower() for status in SolverStatus if status != SolverStatus.CONVERGED),
    UNKNOWN_REASON,
)


def failure_reason(code: int) -> str:
    """The reason a failed evaluation is counted under, from the `SolverStatus` code of its
    first failed solve (`first_failure_code`): the status's name, or ``"unknown"`` for 0 (no
    failed status was reported) or a code that is not a failing `SolverStatus`."""
    try:
        status = SolverStatus(int(code))
    except ValueError:
        return UNKNOWN_REASON
    return UNKNOWN_REASON if status == SolverStatus.CONVERGED else status.name.lower()


def first_failure_code(status) -> int:
    """The first nonzero code of an evaluated `status` (any shape, flattened in C order: a
    batched solve's first failed problem), 0 when there is none."""
    codes = np.asarray(status).ravel()
    failed = np.flatnonzero(codes)
    return int(codes[failed[0]]) if failed.size else 0


def record_failure(label: str, code: int) -> None:
    """Count one failed evaluation under `label`, in all and under the reason of `code`."""
    FAILED_EVALUATIONS[label] += 1
    FAILED_EVALUATIONS_BY_REASON[label, failure_reason(code)] += 1


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


def count_failures(
    success: TensorVariable, label: str, status: TensorVariable | None = None
) -> TensorVariable:
    """`success` (a boolean scalar), tallied in :data:`FAILED_EVALUATIONS` under `label` each
    time it is evaluated to False, and in :data:`FAILED_EVALUATIONS_BY_REASON` under the reason
    given by `status` (the solves' `SolverStatus` codes, any shape; ``"unknown"`` without)."""
    inputs = [success] if status is None else [success, status]
    return CountFailures(label)(*inputs)


class CountFailures(Op):
    """Pass a boolean `success` through; count the evaluations at which it is False.

    The count lives in the evaluating process (:data:`FAILED_EVALUATIONS`, and by reason in
    :data:`FAILED_EVALUATIONS_BY_REASON`), where :class:`~pymc_optim.CountingNUTS` reads it.
    An optional second input, the int64 `status` codes of the solves behind `success` (any
    shape), names the reason: that of the first nonzero code (`first_failure_code`), so each
    failed evaluation has exactly one reason. No rewrite removes the Op (it is not elementwise
    and has no registered rewrite), so the count is of the compiled log density's evaluations.
    """

    __props__ = ("label",)
    # the output is the input's buffer: declared, so that no inplace Op overwrites it (which
    # changed the solver's own `success` output: a compiled function returned success=False for
    # a solve its log density had accepted)
    view_map = {0: [0]}

    def __init__(self, label: str):
        self.label = label

    def make_node(self, success, status=None):
        success = pt.as_tensor_variable(success)
        if success.type.ndim != 0 or success.type.dtype != "bool":
            raise TypeError(f"`success` must be a boolean scalar; got {success.type}.")
        if status is None:
            return Apply(self, [success], [success.type()])
        status = pt.as_tensor_variable(status)
        if status.type.dtype != "int64":
            raise TypeError(
                f"`status` must hold int64 `SolverStatus` codes (a solver Op's last output); "
                f"got {status.type}."
            )
        return Apply(self, [success, status], [success.type()])

    def perform(self, node, inputs, output_storage):
        success = inputs[0]
        if not bool(success):
            record_failure(self.label, first_failure_code(inputs[1]) if len(inputs) > 1 else 0)
        output_storage[0][0] = np.asarray(success)

    def infer_shape(self, node, shapes):
        return [()]

    def pullback(self, inputs, outputs, output_grads):
        return [disconnected_type() for _ in inputs]

    def connection_pattern(self, node):
        return [[False] for _ in node.inputs]
