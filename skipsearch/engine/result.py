"""What one decode produced, and the pooled metrics over many (vLLM-style first-class metrics)."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from skipsearch.engine.timing import RoundTiming


@dataclass(frozen=True)
class DecodeTrace:
    """One prompt's decode: the new tokens, and per speculative round γ and accepted drafts.

    A plain autoregressive decode has no rounds. `seconds` is the wall time of the whole call,
    prefill included, so it compares with `model.generate`; `prefill_seconds` is the prefill's
    share of it (None where the decoder does not time it apart, as `generate`): at long contexts
    the prefill dwarfs the decode, and only a measured one can be taken out of a decode-only ratio.
    """

    prompt_length: int
    tokens: tuple[int, ...]
    seconds: float
    gammas: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    timings: tuple[RoundTiming, ...] = field(default=(), repr=False)
    prefill_seconds: float | None = None

    def to_dict(self) -> dict:
        return {
            "prompt_length": self.prompt_length,
            "tokens": list(self.tokens),
            "seconds": self.seconds,
            "gammas": list(self.gammas),
            "accepted": list(self.accepted),
            "timings": [t.to_dict() for t in self.timings],
            "prefill_seconds": self.prefill_seconds,
        }


@dataclass(frozen=True)
class Summary:
    """Pooled over decodes: throughput, acceptance α and tokens per round.

    α counts judged draft tokens: a round that accepts `n` of `γ` judged `n + 1` tokens when
    `n < γ` (those after the first rejection were never judged), `γ` otherwise — the per-token
    acceptance that the estimator measures (docs/theory.md, "Measuring acceptance"). Tokens per
    round is `mean(n + 1)` over rounds that drafted, the `E(γ)` of docs/theory.md, "Tokens per
    round".
    """

    tokens: int
    seconds: float
    rounds: int
    acceptance: float | None
    tokens_per_round: float | None
    mean_gamma: float | None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self, baseline: Summary, baseline_name: str) -> dict[str, Any]:
        """The fields, plus the throughput over `baseline`'s as `speedup_vs_<baseline_name>`."""
        return {
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            f"speedup_vs_{baseline_name}": self.tokens_per_second / baseline.tokens_per_second,
            "rounds": self.rounds,
            "acceptance": self.acceptance,
            "tokens_per_round": self.tokens_per_round,
            "mean_gamma": self.mean_gamma,
        }

    @classmethod
    def of(cls, results: Sequence[DecodeTrace]) -> Summary:
        rounds = [(g, n) for r in results for g, n in zip(r.gammas, r.accepted, strict=True) if g > 0]
        judged = sum(judged_tokens(g, n) for g, n in rounds)
        return cls(
            tokens=sum(len(r.tokens) for r in results),
            seconds=sum(r.seconds for r in results),
            rounds=len(rounds),
            acceptance=sum(n for _, n in rounds) / judged if judged else None,
            tokens_per_round=sum(n + 1 for _, n in rounds) / len(rounds) if rounds else None,
            mean_gamma=sum(g for g, _ in rounds) / len(rounds) if rounds else None,
        )


def judged_tokens(gamma: int, accepted: int) -> int:
    """Draft tokens a round judged: `n + 1` when it rejected one (`n < γ`), all `γ` otherwise — those
    after the first rejection were never judged. The count behind every acceptance α of a decode."""
    return accepted + (accepted < gamma)


def new_tokens(sequence: Sequence[int], prompt_length: int, eos_ids: Collection[int]) -> tuple[int, ...]:
    """The tokens after the prompt, cut just after the first end-of-sequence token."""
    generated = tuple(sequence[prompt_length:])
    end = next((i + 1 for i, token in enumerate(generated) if token in eos_ids), len(generated))
    return generated[:end]


@dataclass
class Rounds:
    """The rounds of one decode as they are played (a chain's, `engine.ssd`, or a tree's,
    `engine.tree_rounds`): when it began and when its prefill ended, and each round's draft length (a
    tree's depth), accepted drafts and, when timed, its phase breakdown."""

    began: float = field(default_factory=time.perf_counter)
    prefilled: float = 0.0
    gammas: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    timings: list[RoundTiming] = field(default_factory=list)

    def prefill_done(self) -> None:
        self.prefilled = time.perf_counter()

    def add(self, gamma: int, accepted: int, timing: RoundTiming | None) -> None:
        self.gammas.append(gamma)
        self.accepted.append(accepted)
        if timing is not None:
            self.timings.append(timing)

    def result(self, sequence: Sequence[int], prompt_length: int, eos_ids: Collection[int]) -> DecodeTrace:
        """The decode's `DecodeTrace`: `sequence` is the prompt and every committed token."""
        return DecodeTrace(
            prompt_length=prompt_length,
            tokens=new_tokens(sequence, prompt_length, eos_ids),
            seconds=time.perf_counter() - self.began,
            gammas=tuple(self.gammas),
            accepted=tuple(self.accepted),
            timings=tuple(self.timings),
            prefill_seconds=self.prefilled - self.began,
        )
