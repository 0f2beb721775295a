"""What defines one acceptance measurement: the model, the prompts and the estimator mode.

Import-light on purpose (no torch): the CLI validates a configuration before it loads a model,
and a Ray worker rebuilds its measurement from this picklable record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern
from skipsearch.options import check, check_dtype

ESTIMATOR_MODES = ("shared-kv", "rounds", "self")
"""How the estimator's draft sees earlier positions (docs/theory.md, "Measuring acceptance"):
`shared-kv`, the full model's K/V (exact for a round's first draft); `rounds`, the full model's K/V
before the round and its own within it, rounds simulated at `round_gamma` (exact for the engine at
that γ, a few passes per mask); `self`, its own K/V everywhere (no engine drafts that way: the
pessimistic bound)."""
MODES_WITH_KV = ("shared-kv", "rounds")


def refuse_pillars_in_self_mode(mode: str, patterns: Sequence[KVPattern | None]) -> None:
    """Pillars follow the engine's rounds (`kv.pillars`), which `self` mode does not have: a
    one-line error naming the mode to use."""
    with_pillars = [str(kv) for kv in patterns if kv is not None and kv.pillars]
    if with_pillars and mode == "self":
        raise ConfigError(
            f"KV pattern {with_pillars[0]} has pillars, which follow the engine's rounds; self mode "
            "has none: use --mode rounds (or shared-kv)"
        )


@dataclass(frozen=True)
class MeasureConfig:
    """What defines a measurement: the model, the prompts and the estimator mode.

    `draft_vocabs` are the draft-vocabulary sizes measured besides the full vocabulary: one model
    forward per mask serves them all (docs/theory.md, "The draft vocabulary"), so a search scores
    each mask at every size. `kv_patterns` are the KV patterns measured besides every key: one
    draft forward per mask and pattern (docs/theory.md, "KV patterns"). `round_gamma` is the draft
    length whose rounds the `rounds` mode simulates (unused otherwise), `round_stop` the confidence
    below which those rounds stop early (docs/theory.md, "The confidence stop"; 0: never).
    """

    model: str = "smollm2-135m"
    prompts: PromptSpec = field(default_factory=PromptSpec)
    mode: str = "shared-kv"
    device: str = "cpu"
    dtype: str = "auto"
    draft_vocabs: tuple[int, ...] = ()
    round_gamma: int = 3
    kv_patterns: tuple[KVPattern, ...] = ()
    round_stop: float = 0.0

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.mode not in ESTIMATOR_MODES:
            raise ConfigError(
                f"unknown estimator mode {self.mode!r}: use one of {', '.join(ESTIMATOR_MODES)}"
            )
        for size in self.draft_vocabs:
            check("draft_vocab", size)
        object.__setattr__(self, "draft_vocabs", tuple(sorted(set(self.draft_vocabs), reverse=True)))
        check("round_gamma", self.round_gamma)
        check("round_stop", self.round_stop)
        if len(set(self.kv_patterns)) != len(self.kv_patterns):
            named = [str(kv) for kv in self.kv_patterns]
            raise ConfigError(f"KV patterns {named} name one twice: list each once")
        refuse_pillars_in_self_mode(self.mode, self.kv_patterns)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "draft_vocabs": list(self.draft_vocabs),
            "kv_patterns": [str(kv) for kv in self.kv_patterns],
        }

    @classmethod
    def from_dict(cls, data: dict) -> MeasureConfig:
        """Reads run.yaml files written before draft vocabularies, round-aware estimation, KV
        patterns or the rounds' stop existed."""
        return cls(
            **{
                **data,
                "prompts": PromptSpec.from_dict(data["prompts"]),
                "draft_vocabs": tuple(data.get("draft_vocabs", ())),
                "kv_patterns": tuple(KVPattern.parse(text) for text in data.get("kv_patterns", ())),
            }
        )
