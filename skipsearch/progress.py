"""Progress display for the slow parts (generation, reference forward, trials): rich bars on stderr."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

console = Console(stderr=True)
# What a command runs on (its kernel plan): stdout, with the command's results, so that stderr holds
# nothing but progress and a one-line error.
status = Console(highlight=False, soft_wrap=True)


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Progress]:
    """A transient bar with one task; call `bar.advance(bar.task_ids[0])` per step."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        bar.add_task(description, total=total, status="")
        yield bar
