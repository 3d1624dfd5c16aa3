"""The check every function that reads PyMC's sampling result makes of its `idata`."""

from __future__ import annotations

__all__ = ["require_group"]


def require_group(idata, group: str, function: str, *, must_be: str, fix: str) -> None:
    """TypeError unless `idata` is an ``xarray.DataTree`` with the child `group`; the message
    names `function`'s `idata`, what it `must_be`, what it got and the `fix`."""
    import xarray as xr

    if isinstance(idata, xr.DataTree) and group in idata.children:
        return
    got = (
        f"a DataTree with the groups {list(idata.children)}"
        if isinstance(idata, xr.DataTree)
        else f"a {type(idata).__name__}"
    )
    raise TypeError(f"`idata` of `{function}` must be {must_be}; got {got}. {fix}")
