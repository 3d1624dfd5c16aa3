"""One progress bar for the package's long loops (latent draws, INLA evaluations, a Hessian
pattern probe): rich's, as PyMC's samplers show, or nothing."""

from __future__ import annotations

__all__ = ["Progress"]


class Progress:
    """A rich progress bar over `total` steps, or nothing when not `enabled`.

    `add(n)` grows the total (INLA adds points as its integration goes); `advance` may be called
    from several threads (rich's progress takes a lock).
    """

    def __init__(self, enabled: bool, description: str, total: int = 0):
        self.enabled, self.description, self.total = enabled, description, total
        self.bar = self.task = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress()
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=self.total)
        return self

    def add(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, total=self.bar.tasks[0].total + n)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc) -> bool:
        if self.bar is not None:
            self.bar.stop()
        return False
