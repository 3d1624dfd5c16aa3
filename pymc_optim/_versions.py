"""The PyMC, PyTensor and ArviZ lines this package is written for, checked before anything of
theirs is imported by the package (their APIs changed between majors: an older line fails deep
inside an import with an unrelated message)."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["check_versions"]

#: package -> the oldest supported (major, minor)
REQUIRED = {"pymc": (6, 4), "pytensor": (3, 3), "arviz": (1, 3)}


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _text(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def check_versions() -> None:
    """Raise ImportError naming every package whose installed version is older than required."""
    old = []
    for name, needed in REQUIRED.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # the import itself says what is missing
        if _release(installed) < needed:
            old.append(f"{name} {installed} (needs >= {_text(needed)})")
    if old:
        wanted = ", ".join(f"{name} >= {_text(needed)}" for name, needed in REQUIRED.items())
        raise ImportError(
            f"pymc_optim needs {wanted} (Python >= 3.12); installed: {', '.join(old)}. Upgrade "
            f"with `pip install -U 'pymc>={_text(REQUIRED['pymc'])}'` in a Python >= 3.12 "
            "environment. The last commit supporting pymc 5.28 / Python 3.11 is named in the "
            "changelog."
        )


check_versions()
