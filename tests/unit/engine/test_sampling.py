"""Sampling: the first sampled token follows the target, rejection sampling reproduces p, and wrong
residuals are caught."""

from types import SimpleNamespace

import pytest
import torch

from skipsearch.engine import (
    GammaPolicy,
    Sampling,
    speculative_decode,
)
from skipsearch.engine import sampling as sampling_ops
from skipsearch.engine.sampling import greedy_accept, logits_to_probs, sample_accept
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import eight_token_model, with_plan_attention

pytestmark = pytest.mark.usefixtures("one_thread")


# Upper 0.1% point of chi-square with 7 degrees of freedom (8 bins), scipy.stats.chi2.ppf(0.999, 7).
CHI2_7_999 = 24.322


# -- sampling: lossless in distribution ----------------------------------------------------------
def _chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = counts.sum() * p
    assert expected.min() >= 5, "every bin needs an expected count of at least 5"
    return float(((counts - expected) ** 2 / expected).sum())


def eight_token_setup(device: str, kv: KVPattern | None = None) -> SimpleNamespace:
    """8-token model whose draft differs a lot from the target at T = 3: layers 1-2 skipped, or
    with `kv` every layer run over a KV pattern that leaves most of a longer prompt out.

    Chosen so every p(x) >= 0.023 and total variation(p, q) is 0.34 for the skipped layers and
    0.72 for the pattern `s0w1`: rejections are frequent and the residual decides many samples.
    """
    model = with_plan_attention(eight_token_model()).to(device)
    runner = LayerwiseRunner(model)
    mask = SkipMask(3) if kv is not None else SkipMask.from_layers(3, [1, 2])
    sampling = Sampling(temperature=3.0)
    prompt = (1, 5, 3) if kv is None else (1, 5, 3, 7, 2, 6, 4, 0, 5, 1, 3)
    ids = torch.tensor([prompt], device=device)
    at = torch.arange(len(prompt), device=device)[None]
    with torch.no_grad():
        p = sampling.probs(runner.forward(ids)[0, -1]).cpu()
        drafted = runner.head(runner.run_layers(runner.embed(ids), 0, 3, at, mask, kv=kv))
        q = sampling.probs(drafted[0, -1]).cpu()
    return SimpleNamespace(
        runner=runner, mask=mask, kv=kv, sampling=sampling, prompt=prompt, p=p, q=q, device=device
    )


@pytest.fixture(scope="module")
def small_vocab() -> SimpleNamespace:
    return eight_token_setup("cpu")


def _first_tokens(setup, seeds: int) -> torch.Tensor:
    return _first_rounds(setup, seeds)[0]


def _first_rounds(setup, seeds: int) -> tuple[torch.Tensor, float]:
    """Histogram of the first sampled token over `seeds` decodes, and how often the first round
    accepted its first draft token."""
    counts = torch.zeros(len(setup.p))
    first_accepted = 0
    for seed in range(seeds):
        generator = torch.Generator(device=setup.device).manual_seed(seed)
        result = speculative_decode(
            setup.runner,
            setup.prompt,
            setup.mask,
            3,
            gamma=2,
            sampling=setup.sampling,
            generator=generator,
            kv=setup.kv,
        )
        counts[result.tokens[0]] += 1
        first_accepted += result.accepted[0] >= 1
    return counts, first_accepted / seeds


def _accept_many(p: torch.Tensor, q: torch.Tensor, draws: int) -> tuple[torch.Tensor, float]:
    """Histogram of the first output token over `draws` one-token rounds, and the acceptance rate."""
    generator = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, draws, replacement=True, generator=generator).tolist()
    counts = torch.zeros(len(p))
    accepted_total = 0
    for token in drafts:
        accepted, extra = sample_accept(torch.tensor([token]), q[None], torch.stack([p, p]), generator)
        counts[token if accepted else extra] += 1
        accepted_total += accepted
    return counts, accepted_total / draws


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.mark.parametrize("kv", [None, KVPattern(0, 1)], ids=["skipped layers", "KV pattern"])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_sampled_first_token_follows_the_target(device: str, kv: KVPattern | None) -> None:
    """Speculative sampling through the engine on `device`: the first token is distributed as the
    target's p (chi-square, 8 bins), and the first draft token is accepted with probability
    sum(min(p, q)) = 1 - TV(p, q) (within 4 standard deviations of a binomial over the draws)."""
    setup = eight_token_setup(device, kv)
    assert float((setup.p - setup.q).abs().sum()) / 2 > 0.3  # the draft is far from the target
    draws = 600
    counts, accept_rate = _first_rounds(setup, draws)
    assert _chi_square(counts, setup.p) < CHI2_7_999
    expected = float(torch.minimum(setup.p, setup.q).sum())
    assert abs(accept_rate - expected) < 4 * (expected * (1 - expected) / draws) ** 0.5


def test_residual_without_the_clamp_is_rejected(small_vocab, monkeypatch):
    """|p - q| counts the negative part of p - q as mass: the chi-square test must notice."""
    monkeypatch.setattr(sampling_ops, "residual", lambda p, q: (p - q).abs())
    assert _chi_square(_first_tokens(small_vocab, 300), small_vocab.p) > CHI2_7_999


def test_rejection_sampling_reproduces_p_and_accepts_sum_min_p_q(small_vocab):
    counts, acceptance = _accept_many(small_vocab.p, small_vocab.q, 4000)
    assert _chi_square(counts, small_vocab.p) < CHI2_7_999
    # P(accept) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p, q); 0.03 is 4 standard errors.
    assert acceptance == pytest.approx(float(torch.minimum(small_vocab.p, small_vocab.q).sum()), abs=0.03)


@pytest.mark.parametrize("bug", [lambda p, q: (p - q).abs(), lambda p, q: p], ids=["|p-q|", "p"])
def test_rejection_sampling_with_a_wrong_residual_is_rejected(small_vocab, monkeypatch, bug):
    monkeypatch.setattr(sampling_ops, "residual", bug)
    counts, _ = _accept_many(small_vocab.p, small_vocab.q, 4000)
    assert _chi_square(counts, small_vocab.p) > CHI2_7_999


# -- pure functions -------------------------------------------------------------------------------
def _one_draft(p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator) -> tuple[int, int]:
    """`sample_accept` over a round of one draft token `token ~ q` against the target `p` (1-D)."""
    return sample_accept(torch.tensor([token]), q[None], torch.stack([p, p]), generator)


def test_residual_all_zero_falls_back_to_p():
    p = torch.tensor([0.0, 0.25, 0.75])
    generator = torch.Generator().manual_seed(0)
    # p == q: a token both give mass is always accepted...
    assert all(_one_draft(p, p.clone(), 2, generator)[0] == 1 for _ in range(50))
    # ...one neither gives mass is rejected (u·0 >= 0), and the all-zero residual falls back to p.
    draws = [_one_draft(p, p.clone(), 0, generator) for _ in range(200)]
    assert all(accepted == 0 and token in (1, 2) for accepted, token in draws)
    # A forced rejection (u >= p/q never fails here) resamples from the residual, never from zeros.
    draws = [_one_draft(p, torch.tensor([1.0, 0.0, 0.0]), 0, generator) for _ in range(200)]
    assert all(accepted == 0 and token in (1, 2) for accepted, token in draws)


def test_rejection_of_a_token_the_target_never_picks():
    p, q = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    generator = torch.Generator().manual_seed(0)
    assert all(_one_draft(p, q, 0, generator) == (0, 1) for _ in range(50))


def test_all_accepted_takes_a_bonus_token_from_the_last_target_distribution():
    q = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    p = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    assert sample_accept(torch.tensor([1, 1]), q, p, torch.Generator().manual_seed(0)) == (2, 0)


@pytest.mark.parametrize(
    ("draft", "accepted", "extra"), [([2, 1, 0], 3, 2), ([2, 0, 0], 1, 1), ([0, 1, 0], 0, 2), ([], 0, 2)]
)
def test_greedy_accept(draft, accepted, extra):
    logits = torch.nn.functional.one_hot(torch.tensor([2, 1, 0, 2]), 3).float()
    assert greedy_accept(torch.tensor(draft, dtype=torch.long), logits[: len(draft) + 1]) == (accepted, extra)


def test_logits_to_probs_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.2, 0.1]))
    assert torch.allclose(logits_to_probs(logits, 1.0), torch.tensor([0.5, 0.2, 0.2, 0.1]))
    flat = logits_to_probs(logits, 1e6)
    assert torch.allclose(flat, torch.full((4,), 0.25), atol=1e-4)
    assert torch.allclose(logits_to_probs(logits, 1.0, top_k=1), torch.tensor([1.0, 0, 0, 0]))
    # Nucleus 0.6: 0.5 is below it, so the next token joins; the rest are cut.
    nucleus = logits_to_probs(logits, 1.0, top_p=0.6)
    assert torch.count_nonzero(nucleus) == 2 and nucleus[0] == pytest.approx(0.5 / 0.7)
    both = logits_to_probs(torch.stack([logits, logits]), 1.0, top_k=3, top_p=0.95)
    assert torch.allclose(both[0], torch.tensor([5 / 9, 2 / 9, 2 / 9, 0.0]))
    with pytest.raises(ValueError, match="greedy takes the argmax"):
        logits_to_probs(logits, 0.0)


@pytest.mark.parametrize(
    "settings", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": 0}], ids=str
)
def test_invalid_sampling_settings(settings):
    with pytest.raises(ConfigError):
        Sampling(**settings)


def test_a_pillar_draft_samples_the_targets_second_token() -> None:
    """With pillars (which a decode's second round on drafts with, chosen by the first verify), the
    second sampled token follows the target's marginal sum_t p(t) p(. | t) (chi-square, 8 bins)."""
    setup = eight_token_setup("cpu", KVPattern(0, 1, 2))
    runner, sampling = setup.runner, setup.sampling
    with torch.no_grad():
        firsts = torch.tensor([[*setup.prompt, t] for t in range(len(setup.p))])
        second = sampling.probs(runner.forward(firsts)[:, -1]).cpu()
    marginal = setup.p @ second
    counts, pillar_rounds = torch.zeros(len(setup.p)), 0
    for seed in range(600):
        generator = torch.Generator().manual_seed(seed)
        result = speculative_decode(
            runner, setup.prompt, setup.mask, 2, gamma=1, sampling=sampling, generator=generator, kv=setup.kv
        )
        counts[result.tokens[1]] += 1
        pillar_rounds += len(result.gammas) > 1  # the second token came from a pillar draft's round
    assert pillar_rounds > 200
    assert _chi_square(counts, marginal) < CHI2_7_999


def test_a_draft_that_stops_when_unsure_samples_the_targets_second_token(small_vocab) -> None:
    """A first round stops after its first draft unless that is the draft's favourite token (q of
    0.39, the threshold halfway to the runner-up's q: the engine's draft step computes q over the
    cache, whose last bits may differ from this full pass's on another CPU's kernels), so the stop
    depends on what was sampled: the second sampled token still follows the target's marginal
    sum_t p(t) p(. | t)."""
    setup = small_vocab
    runner, sampling = setup.runner, setup.sampling
    with torch.no_grad():
        firsts = torch.tensor([[*setup.prompt, t] for t in range(len(setup.p))])
        second = sampling.probs(runner.forward(firsts)[:, -1]).cpu()
    marginal = setup.p @ second
    policy = GammaPolicy.fixed(2, stop_below=float(setup.q.topk(2).values.mean()))
    counts, stopped = torch.zeros(len(setup.p)), 0
    for seed in range(600):
        generator = torch.Generator().manual_seed(seed)
        result = speculative_decode(
            runner, setup.prompt, setup.mask, 3, gamma=policy, sampling=sampling, generator=generator
        )
        counts[result.tokens[1]] += 1
        stopped += result.gammas[0] == 1
    assert 100 < stopped < 500  # both kinds of first round are common
    assert _chi_square(counts, marginal) < CHI2_7_999
