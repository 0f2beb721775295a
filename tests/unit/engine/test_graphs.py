"""Static caches for sliding-window models, and host syncs per round."""

from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from skipsearch.engine import autoregressive_decode
from skipsearch.engine.graphs import GraphSteps, sliding_window_problem
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.steps import EagerSteps
from skipsearch.engine.tiered import tiered_decode
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import SLIDING, LayerwiseRunner
from skipsearch.tiers.policy import TierPolicy
from tests.conftest import tiny_model

PROMPT = (5, 17, 3, 42, 8, 23, 11)

NEW_TOKENS = 24

GAMMAS = (2, 3)

POLICY = TierPolicy(window=2, thresholds=(0.5,))

ROOM = len(PROMPT) + NEW_TOKENS + max(GAMMAS) + 2


def tier_masks(layers: int) -> tuple[SkipMask, SkipMask]:
    return SkipMask.from_layers(layers, [layers - 2]), SkipMask(layers, [1], [1, layers - 2])


SYNCS = ("__bool__", "__int__", "__index__", "__float__", "item", "tolist")


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    """Counts the calls that read a tensor back to the host: on a GPU, each is a device sync."""
    counts: Counter = Counter()
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name):
            counts[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield counts


def reads_per_round(layers: int, host_reads: Counter) -> float:
    runner = LayerwiseRunner(tiny_model("llama", layers=layers))
    masks = tier_masks(layers)
    steps = GraphSteps(runner, masks, GAMMAS, ROOM, capture=False)
    host_reads.clear()
    decoded = tiered_decode(runner, PROMPT, masks, GAMMAS, POLICY, NEW_TOKENS, steps=steps)
    return sum(host_reads.values()) / len(decoded.tiers)


def test_a_sliding_window_model_gets_plain_static_layers_within_its_window() -> None:
    """Mistral slides in every layer; within the window that is full attention, so graphs apply."""
    runner = LayerwiseRunner(tiny_model("mistral", layers=4, sliding_window=ROOM))
    assert set(runner.layer_types) == {SLIDING}
    assert sliding_window_problem(runner, ROOM) is None
    steps = GraphSteps(runner, tier_masks(4), GAMMAS, ROOM, capture=False)
    decoded = tiered_decode(runner, PROMPT, tier_masks(4), GAMMAS, POLICY, NEW_TOKENS, steps=steps)
    assert decoded.result.tokens == autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens


def test_a_cache_longer_than_the_window_is_refused_with_the_limit() -> None:
    runner = LayerwiseRunner(tiny_model("mistral", layers=4, sliding_window=16))
    with pytest.raises(ConfigError, match="needs 40 positions but sliding-window layers attend to 16"):
        GraphSteps(runner, tier_masks(4), GAMMAS, 40, capture=False)


def test_host_syncs_per_round_are_few_and_do_not_grow_with_depth(host_reads: Counter) -> None:
    """Accept (2 reads), the committed tokens (1) and the length check (1); crops read nothing.

    (Plus one check after the prefill, spread over the rounds.) A per-layer read would add ~8
    reads per round from 4 to 12 layers.
    """
    shallow, deep = reads_per_round(4, host_reads), reads_per_round(12, host_reads)
    assert abs(deep - shallow) < 0.5
    assert max(shallow, deep) <= 5


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(0.9, top_k=20)])
def test_static_steps_draft_from_a_draft_vocabulary_as_the_eager_steps_do(sampling: Sampling) -> None:
    """Both paths run one draft step (`steps.draft_forward`, `steps.propose`), draft heads included:
    same tokens and same rounds, and greedy stays the target's output."""
    runner = LayerwiseRunner(tiny_model("llama", layers=4))
    masks = tier_masks(4)
    heads = [DraftHead.gather(runner, range(0, 60)), None]

    def decode(steps) -> tuple[tuple[int, ...], tuple[int, ...]]:
        generator = torch.Generator().manual_seed(7)
        out = tiered_decode(
            runner, PROMPT, masks, GAMMAS, POLICY, NEW_TOKENS, sampling, generator, steps=steps
        )
        return out.result.tokens, out.tiers

    static = decode(GraphSteps(runner, masks, GAMMAS, ROOM, capture=False, heads=heads))
    assert static == decode(EagerSteps(runner, masks, heads))
    if sampling.greedy:
        assert static[0] == autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
