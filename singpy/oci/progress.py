"""Progress of a pull (Steps): rich bars on a terminal, one line per step elsewhere, nothing with -q."""

from __future__ import annotations

from collections.abc import Callable

from singpy import console
from singpy.image import tools

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any


class Steps:
    """Progress of a pull: rich bars on a terminal, one line per step elsewhere, nothing with -q.

    A line is shown once: a pull that falls back from the merged stream to
    the tree path (singpy.oci.pull) goes over the same layers again with the
    same Steps, and says nothing it already said.
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self.bar: Any = None
        self.layers: Any = None  # the bar's task counting the layers applied
        self.shown: set[str] = set()

    def __enter__(self) -> Steps:
        if tools.show_progress():
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn

            sizes, counts = DownloadColumn(), MofNCompleteColumn()

            class Amount(TextColumn):  # bytes for a download, "2/5" for the layers
                def render(self, task: Any) -> Any:
                    return (counts if task.fields.get("counted") else sizes).render(task)

            # markup=False: a description may quote a registry's names, never read as rich markup
            self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), Amount(""),
                                console=Console(stderr=True), transient=True)
            with tools.SignalsHeld():  # rich starts its refresh thread
                self.bar.start()
        console.info(self.title)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _first(self, line: str) -> bool:
        """Whether `line` is new (and from now on, not)."""
        if line in self.shown:
            return False
        self.shown.add(line)
        return True

    def step(self, message: str) -> None:
        if not self._first(message):
            return
        if self.bar is not None:
            # the prefix console.info gives the same line without a terminal
            self.bar.console.print(f"INFO:    {console.escape(message)}", highlight=False, markup=False)
        else:
            console.info(message)

    def extracting(self, number: int, total: int, digest: str) -> None:
        """Layer `number` of `total` is being applied: a bar on a terminal, a line elsewhere."""
        if self.bar is None:
            if self._first(line := f"Extracting layer {number}/{total} ({digest[:19]})"):
                console.info(line)
            return
        if self.layers is None:
            self.layers = self.bar.add_task("Extracting layers", total=total, counted=True)
        self.bar.update(self.layers, completed=number - 1, description=f"Extracting layer {number}/{total}")

    def transfer(self, description: str, total: int | None) -> Callable[[int], None] | None:
        """A callback for each chunk's byte count (several threads call theirs at once)."""
        if self.bar is None:
            if self._first(line := description + (f" ({console.human_size(total)})" if total is not None else "")):
                console.info(line)
            return None
        task = self.bar.add_task(console.escape(description), total=total)
        return lambda count: self.bar.update(task, advance=count)
