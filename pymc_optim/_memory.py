"""How much memory this process may still allocate, for refusing a size that will not fit."""

from __future__ import annotations

from pathlib import Path

__all__ = ["available_memory"]


def available_memory() -> int | None:
    """Bytes this process can allocate before the machine (or its cgroup) runs out, or None
    where neither Linux's ``/proc/meminfo`` nor a cgroup v2 limit can be read.

    The smaller of the kernel's ``MemAvailable`` estimate (free memory plus reclaimable caches)
    and a cgroup v2 limit's headroom (``memory.max − memory.current``: containers and CI
    runners set one, and the kernel kills a process that passes it without a word).
    """
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
