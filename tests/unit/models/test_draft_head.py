"""Draft vocabularies (docs/theory.md, "The draft vocabulary"): the draft's head over a subset,
exact estimation, lossless decoding.

Greedy: SSD with a subset head equals autoregressive decoding token for token. Sampling: the
first sampled token follows the target even when the subset leaves out its most likely tokens,
and a residual that ignores the tokens outside the subset is caught by the same test.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine import sampling as sampling_ops
from skipsearch.engine.sampling import Sampling
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import eight_token_model, tiny_model

PROMPT = (3, 17, 42, 8, 25, 11)

NEW_TOKENS = 24

CHI2_7_999 = 24.32  # upper 0.1% point of chi-square, 7 degrees of freedom (8 bins)


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=6))


@pytest.fixture(scope="module")
def eight_tokens() -> SimpleNamespace:
    """8-token model at T = 3 whose draft head keeps the four *least* likely tokens of the target."""
    model = eight_token_model()
    runner = LayerwiseRunner(model)
    sampling = Sampling(temperature=3.0)
    prompt = (1, 5, 3)
    p = sampling.probs(runner.forward(torch.tensor([prompt]))[0, -1])
    subset = p.argsort()[:4].tolist()
    mask = SkipMask.from_layers(3, [1, 2])
    return SimpleNamespace(runner=runner, sampling=sampling, prompt=prompt, p=p, subset=subset, mask=mask)


def _first_tokens(setup: SimpleNamespace, seeds: int) -> torch.Tensor:
    head = DraftHead.gather(setup.runner, setup.subset)
    counts = torch.zeros(len(setup.p))
    for seed in range(seeds):
        result = speculative_decode(
            setup.runner,
            setup.prompt,
            setup.mask,
            3,
            gamma=2,
            sampling=setup.sampling,
            generator=torch.Generator().manual_seed(seed),
            head=head,
        )
        counts[result.tokens[0]] += 1
    return counts


def _chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = counts.sum() * p
    assert expected.min() >= 5, "every bin needs an expected count of at least 5"
    return float(((counts - expected) ** 2 / expected).sum())


# -- the head -------------------------------------------------------------------------------------
def test_draft_head_is_the_full_head_at_its_ids(runner: LayerwiseRunner) -> None:
    ids = [5, 0, 33, 60, 12]
    head = DraftHead.gather(runner, ids)
    hidden = torch.randn(2, 3, runner.config.hidden_size)
    torch.testing.assert_close(head(hidden), runner.head(hidden)[..., ids])
    assert head.product.weight.is_contiguous() and head.size == 5
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    full = head.scatter(probs)
    assert full.shape == (runner.config.vocab_size,) and float(full[ids].sum()) == pytest.approx(1.0)
    assert torch.equal(full[ids], probs) and float(full.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("ids", [[], [1, 1], [61], [-1]], ids=["empty", "twice", "past-end", "negative"])
def test_draft_head_refuses_bad_ids(runner: LayerwiseRunner, ids: list[int]) -> None:
    with pytest.raises(ConfigError):
        DraftHead.gather(runner, ids)


# -- decoding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize(
    "mask", [SkipMask.from_layers(6, [2, 3]), SkipMask(6, attn=[1], mlp=[4]), SkipMask(6)], ids=str
)
@pytest.mark.parametrize("size", [4, 20, 61])
def test_greedy_ssd_with_a_draft_vocabulary_is_lossless(
    runner: LayerwiseRunner, mask: SkipMask, gamma: int, size: int
) -> None:
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    ids = torch.randperm(runner.config.vocab_size, generator=torch.Generator().manual_seed(size))[:size]
    head = DraftHead.gather(runner, ids.tolist())
    assert speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=gamma, head=head).tokens == expected


@pytest.mark.slow
def test_sampling_with_a_subset_that_excludes_the_likely_tokens_follows_the_target(
    eight_tokens: SimpleNamespace,
) -> None:
    top = int(eight_tokens.p.argmax())
    assert top not in eight_tokens.subset and float(eight_tokens.p[eight_tokens.subset].sum()) < 0.5
    assert _chi_square(_first_tokens(eight_tokens, 600), eight_tokens.p) < CHI2_7_999


@pytest.mark.slow
def test_a_residual_that_ignores_tokens_outside_the_subset_is_caught(
    eight_tokens: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bug this guards against: after a rejection, resampling only among the draft's own tokens."""

    def among_the_drafts_tokens(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None) -> int:
        return int(sampling_ops.sample(torch.where(q > 0, p, torch.zeros_like(p)), generator))

    monkeypatch.setattr(sampling_ops, "resample", among_the_drafts_tokens)
    assert _chi_square(_first_tokens(eight_tokens, 300), eight_tokens.p) > CHI2_7_999
