"""Progress display for the slow parts (generation, reference forward, trials): rich bars on stderr."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def trial_progress(
    description: str, show: bool = True
) -> tuple[Callable[[object], Callable[[int, int, float | None], None] | None], Callable[[], None]]:
    """A bar showing trials, the best score so far and the ETA, opened once the model is loaded
    (nothing with `show` False); returns (`on_start(config)`, which opens it and gives the
    per-trial callback, and `close`)."""
    bar_context = None

    def on_start(config: object) -> Callable[[int, int, float | None], None] | None:
        nonlocal bar_context
        if not show:
            return None
        bar_context = progress_bar(description, config.budget)  # type: ignore[attr-defined]
        bar = bar_context.__enter__()

        def on_trial(scored: int, total: int, best: float | None) -> None:
            task = bar.task_ids[0]
            bar.update(task, completed=scored, total=total, status=f"best {best:.3f}" if best else "")

        return on_trial

    def close() -> None:
        if bar_context is not None:
            bar_context.__exit__(None, None, None)

    return on_start, close
