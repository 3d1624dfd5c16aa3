"""The central composite design (CCD) in standardized coordinates, and its integration weights.

Pure numpy: importable without PyMC or PyTensor.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["CCD_F0", "ccd_design", "ccd_log_weights"]

#: CCD radius factor f₀ (Rue et al. 2009 §6.5, R-INLA's default): points on the sphere of radius
#: f₀√m, just outside the unit-variance contour.
CCD_F0 = 1.1


def ccd_design(m: int) -> np.ndarray:
    """Central composite design in z: the center, then 2m axial and 2^(m−p) fractional points.

    The two-level part is a regular resolution-V fraction (main effects and two-factor
    interactions unaliased, Box & Hunter 1961); every non-center point is on the sphere of
    radius f₀√m.
    """
    if m < 1:
        raise ValueError(f"`m` must be at least 1; got {m}.")
    radius = CCD_F0 * np.sqrt(m)
    axial = np.concatenate([np.eye(m), -np.eye(m)]) * radius
    if m == 1:
        return np.concatenate([np.zeros((1, 1)), axial])
    cube = _resolution_five_fraction(m) * CCD_F0  # ±1 entries: norm √m before scaling
    return np.concatenate([np.zeros((1, m)), axial, cube])


def ccd_log_weights(m: int) -> np.ndarray:
    """log Δ_k of :func:`ccd_design`'s points, up to a common constant.

    Δ_k multiplies the density at z_k. With the standard Gaussian density φ, the rule
    Σ Δ_k φ(z_k) g(z_k) integrates g = 1 and g = z zᵀ exactly (odd moments vanish by symmetry)
    when Δ₀ φ(0) = 1 − 1/f₀² at the center and Δ φ(r) = 1/(n f₀²) at the n points on the sphere
    of radius r = f₀√m (then Σ Δ φ(z) z zᵀ = n·r²/(n f₀² m)·I = I).
    """
    n = len(ccd_design(m)) - 1
    radius2 = CCD_F0**2 * m
    log_phi_sphere = -0.5 * radius2  # log φ(r) − log φ(0)
    return np.concatenate(
        [[np.log(1 - 1 / CCD_F0**2)], np.full(n, -np.log(n * CCD_F0**2) - log_phi_sphere)]
    )


def _resolution_five_fraction(m: int) -> np.ndarray:
    """A 2^(m−p) two-level design (±1) of resolution ≥ V with the fewest base factors found."""
    for base in range(min(m, 4), m + 1):  # a word of length ≥ 5 needs ≥ 4 base letters
        generators = _generators(base, m - base)
        if generators is not None:
            full = np.array(list(itertools.product([-1.0, 1.0], repeat=base)))
            added = [
                np.prod(full[:, [b for b in range(base) if g >> b & 1]], axis=1) for g in generators
            ]
            return np.column_stack([full, *added]) if added else full
    raise AssertionError("unreachable: the full factorial (base = m) has resolution m")


def _generators(base: int, extra: int):
    """`extra` subsets of `base` factors whose defining words all have length ≥ 5, or None."""
    candidates = [g for g in range(1, 2**base) if bin(g).count("1") >= 4]

    def word_lengths_ok(chosen):
        # every product of a nonempty subset S of generators: |XOR of masks| + |S| letters
        for r in range(1, len(chosen) + 1):
            for subset in itertools.combinations(chosen, r):
                mask = 0
                for g in subset:
                    mask ^= g
                if bin(mask).count("1") + r < 5:
                    return False
        return True

    def search(chosen, start):
        if len(chosen) == extra:
            return chosen
        for i in range(start, len(candidates)):
            trial = [*chosen, candidates[i]]
            if word_lengths_ok(trial):
                found = search(trial, i + 1)
                if found is not None:
                    return found
        return None

    return search([], 0)
