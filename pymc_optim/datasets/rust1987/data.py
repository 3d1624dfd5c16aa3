"""Rust (1987) bus data: the raw files to (state, decision, increment), and the mileage process."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files

import numpy as np

__all__ = [
    "GROUP_FILES",
    "MAX_MILEAGE",
    "Rust1987Data",
    "load_rust1987",
    "transition_log_likelihood",
    "transition_matrix",
    "transition_probabilities",
]

#: Rust's bus groups 1-8: file name and rows per bus (11 header rows + monthly odometer readings).
GROUP_FILES = {
    1: ("g870.asc", 36),
    2: ("rt50.asc", 60),
    3: ("t8h203.asc", 81),
    4: ("a530875.asc", 128),
    5: ("a530874.asc", 137),
    6: ("a452374.asc", 137),
    7: ("a530872.asc", 137),
    8: ("a452372.asc", 137),
}
#: The mileage range that Rust splits into n bins (n = 90 gives 5,000-mile bins).
MAX_MILEAGE = 450_000.0
#: Header rows of each bus column; the odometer readings at the 1st and 2nd replacement (0: none).
_HEADER_ROWS = 11
_REPLACEMENT_ODOMETER_ROWS = (5, 8)


@dataclass(frozen=True)
class Rust1987Data:
    """Bus-month observations, one entry per month (each bus's first month dropped).

    Attributes
    ----------
    state : ndarray of int
        0-based mileage bin s ∈ {0, …, n − 1} in the month (bin s holds mileages in
        (450,000·s/n, 450,000·(s+1)/n], with 0 in bin 0).
    decision : ndarray of int
        1 when the engine is replaced before the next month, else 0.
    increment : ndarray of int
        Bins travelled since the previous month; after a replacement, counted from mileage 0.
    bus : ndarray of int
        Rust's bus id.
    group : ndarray of int
        Rust's bus group (1-8).
    n : int
        Number of mileage states.
    """

    state: np.ndarray
    decision: np.ndarray
    increment: np.ndarray
    bus: np.ndarray
    group: np.ndarray
    n: int

    def __len__(self) -> int:
        return len(self.state)


def load_rust1987(groups: int | Iterable[int] = 4, n: int = 90) -> Rust1987Data:
    """Rust's bus data as (state, decision, increment) arrays, processed as in the paper.

    Parameters
    ----------
    groups : int or iterable of int, default 4
        Rust's bus groups (1-8; Table IX uses group 4, the 1975 GMC A5308 buses).
    n : int, default 90
        Number of mileage states: the bin width is 450,000/n miles (5,000 for n = 90). Mileages
        beyond 450,000 are put in the top state.

    Returns
    -------
    data : Rust1987Data
        One entry per bus-month, buses in file order, months in time order.

    Raises
    ------
    ValueError
        If a group is not one of 1-8 or `n` is not a positive integer.

    Notes
    -----
    The odometer is measured from the last engine replacement. The replacement between months t
    and t + 1 is the first month whose reading reaches the replacement odometer of the bus
    header; then decision_t = 1. The bin of a mileage m is ceil(n·m/450,000) counted from 1, i.e.
    s = ceil(n·m/450,000) − 1 from 0. The increment into month t is s_t − s_{t−1}, or
    ceil(n·m_t/450,000) (bins from mileage 0) after a replacement. Each bus's first month has no
    increment and is dropped.

    Examples
    --------
    >>> from pymc_optim.datasets import load_rust1987
    >>> data = load_rust1987(4, n=90)
    >>> len(data), int(data.decision.sum())
    (4292, 33)
    """
    groups = [groups] if isinstance(groups, int | np.integer) else list(groups)
    unknown = [g for g in groups if g not in GROUP_FILES]
    if unknown or not groups:
        raise ValueError(f"`groups` must be Rust's bus groups 1-8; got {groups}.")
    if len(set(groups)) != len(groups):
        raise ValueError(
            f"`groups` lists a group more than once ({groups}): its buses would count twice in "
            "the likelihood. Name each group once."
        )
    if int(n) != n or n < 1:
        raise ValueError(f"`n` must be a positive integer number of mileage states; got {n}.")
    n = int(n)
    columns = {k: [] for k in ("state", "decision", "increment", "bus", "group")}
    for group in groups:
        for header, odometer in _read_buses(group):
            state, decision, increment = _process_bus(header, odometer, n)
            columns["state"].append(state[1:])
            columns["decision"].append(decision[1:])
            columns["increment"].append(increment[1:])
            columns["bus"].append(np.full(len(state) - 1, int(header[0])))
            columns["group"].append(np.full(len(state) - 1, group))
    return Rust1987Data(**{k: np.concatenate(v).astype(int) for k, v in columns.items()}, n=n)


def _read_buses(group: int):
    """(header, odometer readings) of every bus in a group's file (stacked column by column)."""
    name, rows = GROUP_FILES[group]
    path = files("pymc_optim.datasets.rust1987").joinpath("data", name)
    with path.open() as f:
        values = np.loadtxt(f)
    buses = values.reshape((rows, -1), order="F").T
    return [(bus[:_HEADER_ROWS], bus[_HEADER_ROWS:]) for bus in buses]


def _process_bus(header, odometer, n: int):
    """Bins, decisions and increments of one bus, month by month (month 0's increment unused)."""
    mileage = odometer.astype(float).copy()
    decision = np.zeros(len(odometer), dtype=int)
    replaced = np.zeros(len(odometer), dtype=bool)  # replaced between month t − 1 and t
    for row in _REPLACEMENT_ODOMETER_ROWS:
        at = header[row]
        if at <= 0 or not np.any(odometer >= at):
            continue
        t = int(np.argmax(odometer >= at))
        if t > 0:
            decision[t - 1] = 1
            replaced[t] = True
        mileage[t:] = odometer[t:] - at
    bins = np.ceil(n * mileage / MAX_MILEAGE).astype(int)  # 1-based bin of the mileage
    increment = np.zeros(len(odometer), dtype=int)
    increment[1:] = np.where(replaced[1:], bins[1:], np.diff(bins))
    return np.clip(bins - 1, 0, n - 1), decision, increment


# --- first stage: the mileage process -----------------------------------------------------------


def transition_probabilities(increment: np.ndarray) -> np.ndarray:
    """Maximum-likelihood multinomial probabilities θ₃ of increments 0, 1, …, max(increment).

    The first stage of Rust's estimation: the increments' relative frequencies (for group 4 at
    n = 90: 0.3919, 0.5953, 0.0128).
    """
    increment = np.asarray(increment)
    if increment.size == 0 or increment.min() < 0:
        raise ValueError("`increment` must be a non-empty array of non-negative integers.")
    counts = np.bincount(increment)
    return counts / counts.sum()


def transition_log_likelihood(increment: np.ndarray, probabilities: np.ndarray) -> float:
    """Log-likelihood of the increments under multinomial `probabilities`."""
    return float(np.sum(np.log(np.asarray(probabilities)[np.asarray(increment)])))


def transition_matrix(probabilities: np.ndarray, n: int) -> np.ndarray:
    """(n, n) matrix P[s, s'] of moving from bin s to s' when the engine is kept.

    Increments of j bins have probability ``probabilities[j]``; moves past the top state stay
    in it (Rust's truncation), so every row sums to 1.
    """
    probabilities = np.asarray(probabilities, dtype=float)
    P = np.zeros((n, n))
    rows = np.arange(n)
    for j, p_j in enumerate(probabilities):
        np.add.at(P, (rows, np.minimum(rows + j, n - 1)), p_j)
    return P
