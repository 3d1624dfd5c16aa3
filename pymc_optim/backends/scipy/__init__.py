"""scipy.optimize as a numerical backend: the scipy-backed Ops and their callbacks."""
