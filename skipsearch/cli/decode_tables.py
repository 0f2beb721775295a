"""What `skipsearch decode` and `decode-tiers` print: speed per decoder and round time by phase."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from skipsearch.bench.decode_report import DecoderSummary
    from skipsearch.engine.timing import Bucket, PhaseStats


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number, or `n/a` where a decoder has none (autoregressive runs draft nothing)."""
    return "n/a" if value is None else format(value, spec)


def verdict(check: Mapping[str, Any]) -> str:
    """PASS or FAIL with the near-tie and real-divergence counts and the measured tolerance they were
    judged by (`bench.lossless`, as a report's `lossless_check` holds it)."""
    tolerance = check.get("tolerance")
    judged = (
        ""
        if tolerance is None
        else f"; tolerance {tolerance['epsilon']:.3g} logits measured between 1- and "
        f"{tolerance['width']}-position passes over {tolerance['positions']} positions"
    )
    if check["identical"]:
        return f"[green]PASS[/] (identical{judged})"
    real = check.get("real_divergences", 0)
    counts = f"{check['near_ties']} numerical near-tie flip(s), {real} real divergence(s)"
    if check["passed"]:
        return f"[green]PASS[/] ({counts}{judged})"
    return f"[red]FAIL[/] ({counts}{judged}; first divergences in lossless_check)"


def summary_table(
    summaries: Mapping[str, DecoderSummary], title: str, label: Callable[[str], str] = str
) -> Table:
    """One row per decoder; its speedup over the report's baseline shown as `vs <title>`."""
    table = Table()
    for column in ("decoder", "tokens", "tok/s", f"vs {title}", "accept", "tok/round", "mean γ"):
        table.add_column(column, justify="left" if column == "decoder" else "right")
    for name, s in summaries.items():
        table.add_row(
            label(name),
            str(s.tokens),
            f"{s.tokens_per_second:.1f}",
            f"{s.speedup:.2f}x",
            *(fmt(value) for value in (s.acceptance, s.tokens_per_round, s.mean_gamma)),
        )
    return table


def print_breakdown(console: Console, buckets: Sequence[Bucket]) -> None:
    """SSD round time by context tercile: P50 / P95 per phase in ms and its share of round time."""
    from skipsearch.engine.timing import PHASES

    if not buckets:
        console.print("SSD rounds were not timed phase by phase: pass --breakdown for where their time goes")
        return
    table = Table(title="SSD rounds by context length: P50 / P95 ms (share)")
    table.add_column("phase")
    for bucket in buckets:
        table.add_column(f"{bucket.name} {bucket.low}-{bucket.high}\n{bucket.rounds} rounds", justify="right")
    for index, phase in enumerate(PHASES):
        table.add_row(phase, *(_cell(b.phases[index]) for b in buckets))
    table.add_row("round", *(f"{b.round_p50 * 1e3:.1f} / {b.round_p95 * 1e3:.1f}" for b in buckets))
    console.print(table)


def _cell(stats: PhaseStats) -> str:
    return f"{stats.p50 * 1e3:.1f} / {stats.p95 * 1e3:.1f} ({stats.share:.0%})"


def print_caveats(console: Console, caveats: Sequence[str]) -> None:
    for caveat in caveats:
        console.print(f"[yellow]warning:[/] {caveat}")
