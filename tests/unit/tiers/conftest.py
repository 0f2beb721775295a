"""Tier sets on hand-made acceptance profiles, and the tiny model, prompt and masks that tier decoding runs
on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tiers.policy import TierPolicy
from tests.conftest import tiny_model


def profile(mask: SkipMask | str, *rows: str) -> AcceptanceProfile:
    """A profile from match strings: '1' = the draft matches the target at that position."""
    matches = tuple(tuple(c == "1" for c in row) for row in rows)
    return AcceptanceProfile(str(mask), matches, tuple((0.5,) * len(r) for r in rows), 0.0)


# -- scoring and searching ---------------------------------------------------------------------------
def stretches(hard_acceptance: float, prompts: int = 2, seed: int = 0) -> list[str]:
    """40 positions every draft matches, then 20 where it matches with `hard_acceptance`, x6."""
    rng = np.random.default_rng(seed)
    hard = ["".join("1" if x < hard_acceptance else "0" for x in rng.random(20)) for _ in range(prompts)]
    return [("1" * 40 + h) * 6 for h in hard]


# The rich tier (last layer skipped) is accepted mostly even on hard stretches; the cheap one
# (six layers skipped) only on easy ones, where it can draft long.
RICH, CHEAP = SkipMask.prefix(8, 7), SkipMask.prefix(8, 2)


RICH_PROFILE, CHEAP_PROFILE = profile(RICH, *stretches(0.75)), profile(CHEAP, *stretches(0.0))


# -- the engine --------------------------------------------------------------------------------------
PROMPT = (5, 17, 3, 42, 8, 11, 29, 60, 1, 33, 7, 21)

NEW_TOKENS = 40

MASKS = (SkipMask(6, attn=[3], mlp=[2]), SkipMask.from_layers(6, [1, 4]), SkipMask.prefix(6, 2))

GAMMAS = (3, 2, 4)

POLICY = TierPolicy(2, (0.3, 0.6))

ROOM = len(PROMPT) + NEW_TOKENS + max(GAMMAS) + 1


@pytest.fixture(scope="module")
def runner():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LayerwiseRunner(tiny_model("llama"))
    torch.set_num_threads(threads)
