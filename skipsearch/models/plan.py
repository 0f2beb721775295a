"""The record of the kernel plan a loaded model runs on (`KernelPlan`): one short line every
command prints, and the whole record, with the measurement behind each choice, that `skipsearch
plan` prints and the JSON outputs and `run.yaml` keep. Pure: `models.backend` makes it at load
(docs/cpu-backend.md).
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_LIMIT = 160  # characters of the one-line plan every command prints
DETAILS_HINT = "(skipsearch plan)"


@dataclass(frozen=True)
class PlanPart:
    """One choice of the plan: what it decides (`dtype`, `attention`, `products`, ...) and the
    whole record of it, with the measurement behind it."""

    what: str
    details: str


@dataclass(frozen=True)
class KernelPlan:
    """What a loaded model runs on: the few words of the one-line plan, and its choices in the
    order they were made."""

    words: tuple[str, ...] = ()
    parts: tuple[PlanPart, ...] = ()
    busy: float = 0.0  # cores other processes kept busy when the plan was made

    @property
    def line(self) -> str:
        """The plan in one line of at most `LINE_LIMIT` characters, e.g. `kernel plan: bf16
        weights, fp32 activations, vector products, decode-attention kernel, 2 threads (skipsearch
        plan)`: what every command prints."""
        line = f"kernel plan: {', '.join(self.words)} {DETAILS_HINT}"
        if len(line) <= LINE_LIMIT:
            return line
        return line[: LINE_LIMIT - len(DETAILS_HINT) - 2].rstrip(", ") + f"… {DETAILS_HINT}"

    @property
    def details(self) -> str:
        """Every choice with the measurement behind it, in one string: the record JSON outputs and
        `run.yaml` keep (`kernel_plan`)."""
        return "; ".join(part.details for part in self.parts)

    def table(self) -> str:
        """One row a choice, for `skipsearch plan`."""
        width = max((len(part.what) for part in self.parts), default=0)
        return "\n".join(f"{part.what:<{width}}  {part.details}" for part in self.parts)

    def __str__(self) -> str:
        return self.line

    def to_record(self) -> dict[str, str]:
        """The plan as JSON outputs store it: the short line and the whole record."""
        return {"kernel_plan_line": self.line, "kernel_plan": self.details}
