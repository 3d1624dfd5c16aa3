"""Why a solve ended: `SolverStatus`, the code every solver reports beside its success flag."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["SolverStatus", "status_names"]


class SolverStatus(IntEnum):
    """Why a solve ended, as the int64 `status` output of every solver Op (0: converged).

    Every backend (C/numpy, numba, JAX) reports the same code for the same failure of the same
    loop; the scipy-backed methods report ``SOLVER_FAILED`` where scipy itself gave up, with
    scipy's message in :func:`pymc_optim.solver_trace`.
    """

    #: Converged: ``success`` is True.
    CONVERGED = 0
    #: The iteration budget (``max_iter``) ran out first.
    MAX_ITER = 1
    #: The objective, the equations or the update is NaN or infinite at an iterate.
    NONFINITE = 2
    #: The line search found no step that decreases the merit function.
    LINE_SEARCH_FAILED = 3
    #: A stationary point whose Hessian is not positive definite (a saddle or a maximum).
    NOT_POSITIVE_DEFINITE = 4
    #: The Jacobian is singular: Newton's step for a root or a fixed point is not finite.
    SINGULAR = 5
    #: The problem is undefined at these parameters: a parameter check of its graph is false,
    #: its graph raised (an `Assert`, a singular matrix), or its sizes disagree at run time.
    INVALID_PARAMETERS = 6
    #: A scipy-backed method reported failure (its message is in the solve's trace).
    SOLVER_FAILED = 7

    @property
    def message(self) -> str:
        """One sentence on what the code means."""
        return _MESSAGES[self]


_MESSAGES = {
    SolverStatus.CONVERGED: "converged",
    SolverStatus.MAX_ITER: "the iteration budget ran out before convergence",
    SolverStatus.NONFINITE: "the problem is NaN or infinite at an iterate",
    SolverStatus.LINE_SEARCH_FAILED: "the line search found no decrease of the merit function",
    SolverStatus.NOT_POSITIVE_DEFINITE: (
        "a stationary point whose Hessian is not positive definite (a saddle or a maximum)"
    ),
    SolverStatus.SINGULAR: "the Jacobian is singular: the Newton step is not finite",
    SolverStatus.INVALID_PARAMETERS: (
        "the problem is undefined at these parameters (a parameter check failed, its graph "
        "raised, or its sizes disagree)"
    ),
    SolverStatus.SOLVER_FAILED: "the scipy method reported failure (see its message)",
}


def status_names(codes) -> str | np.ndarray:
    """The names (``"converged"``, ``"max_iter"``, ...) of evaluated status codes.

    Parameters
    ----------
    codes : int or array of int
        Values of ``solution_info(x_star).status``.

    Returns
    -------
    names : str, or an array of str of the shape of `codes`

    Examples
    --------
    >>> status_names(0), status_names([1, 2]).tolist()
    ('converged', ['max_iter', 'nonfinite'])
    """
    codes = np.asarray(codes)
    names = np.vectorize(lambda code: SolverStatus(int(code)).name.lower(), otypes=[object])(codes)
    return names.item() if codes.ndim == 0 else names.astype(str)
