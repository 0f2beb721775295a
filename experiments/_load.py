"""The load average around a timing experiment, as its report states it.

A timing on two shared cores means nothing without the load it ran under, so every experiment that
times writes the 1-, 5- and 15-minute load averages from before and after. Standard library only:
`busy_core.py`'s parent process measures its children without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence


def load_line(before: Sequence[float], after: Sequence[float]) -> str:
    """`Load average (1, 5, 15 min) before: a, b, c; after: d, e, f` (no closing punctuation)."""
    return (
        "Load average (1, 5, 15 min) before: "
        + ", ".join(f"{x:.2f}" for x in before)
        + "; after: "
        + ", ".join(f"{x:.2f}" for x in after)
    )
