"""The SSD engine is lossless: greedy output equals autoregressive, sampled output follows p."""

import json
from types import SimpleNamespace

import pytest
import torch

from skipsearch.cli import main
from skipsearch.engine import (
    GammaController,
    GammaPolicy,
    Sampling,
    Summary,
    autoregressive_decode,
    breakdown,
    speculative_decode,
    ssd,
)
from skipsearch.engine import cache as cache_ops
from skipsearch.engine import sampling as sampling_ops
from skipsearch.engine.sampling import accept_or_resample, greedy_accept, logits_to_probs, sample_accept
from skipsearch.engine.timing import RoundTiming
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import eight_token_model, tiny_model

# Upper 0.1% point of chi-square with 7 degrees of freedom (8 bins), scipy.stats.chi2.ppf(0.999, 7).
CHI2_7_999 = 24.322
NEW_TOKENS = 40
PROMPT = (5, 17, 3, 42, 8, 11, 29, 60, 1, 33, 7, 21)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run op by op: extra threads only add contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runner():
    return LayerwiseRunner(tiny_model("llama"))


@pytest.fixture(scope="module")
def reference(runner):
    return autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens


MASKS = {
    "contiguous exit 3": SkipMask.prefix(6, 3),
    "sparse single": SkipMask.from_layers(6, [2]),
    "sparse multi": SkipMask.from_layers(6, [1, 4]),
    "first layer": SkipMask.from_layers(6, [0, 3]),
    "attn only": SkipMask(6, attn=[2, 5]),
    "mlp only": SkipMask(6, mlp=[1, 4]),
    "mlp before skipped attn": SkipMask(6, attn=[3], mlp=[2]),
    "last mlp": SkipMask(6, mlp=[5]),
    "empty": SkipMask(6),
}
GAMMAS = {
    "1": 1,
    "3": 3,
    "6": 6,
    "dynamic": GammaPolicy(initial=2, gamma_max=5, min_samples=4, raise_above=0.6, lower_below=0.5),
}


@pytest.mark.parametrize("gamma", GAMMAS.values(), ids=GAMMAS.keys())
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_greedy_ssd_equals_autoregressive(runner, reference, mask, gamma):
    result = speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=gamma)
    assert result.tokens == reference
    assert sum(n + 1 for n in result.accepted) == NEW_TOKENS


def test_greedy_autoregressive_equals_transformers_generate(runner, reference):
    expected = runner.model.generate(
        torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
    )
    assert tuple(expected[0, len(PROMPT) :].tolist()) == reference


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("mistral", {"sliding_window": 8}), ("qwen2", {})],
    ids=["mistral-window-8", "qwen2"],
)
@pytest.mark.parametrize("mask", [SkipMask.from_layers(4, [1, 2]), SkipMask(4, attn=[0], mlp=[3])], ids=str)
def test_greedy_is_lossless_for_other_families(family, overrides, mask):
    """Mistral's window of 8 is crossed many times: rollback must restore the recorded past."""
    runner = LayerwiseRunner(tiny_model(family, layers=4, **overrides))
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    assert speculative_decode(runner, PROMPT, mask, NEW_TOKENS, gamma=4).tokens == expected


def test_switched_off_speculation_decodes_plainly(runner, reference):
    """Thresholds of 1 switch off at the first rejection; the rest are γ = 0 rounds."""
    policy = GammaPolicy(initial=3, min_samples=1, raise_above=1.0, lower_below=1.0, off_below=1.0)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=policy)
    assert result.tokens == reference
    assert result.gammas[0] == 3 and result.gammas[-1] == 0


def test_stops_after_end_of_sequence(runner, reference):
    eos = reference[10]
    cut = reference[: reference.index(eos) + 1]
    assert autoregressive_decode(runner, PROMPT, NEW_TOKENS, eos_ids={eos}).tokens == cut
    assert speculative_decode(runner, PROMPT, MASKS["sparse single"], NEW_TOKENS, eos_ids={eos}).tokens == cut


def test_cache_length_is_checked_after_every_round(runner, monkeypatch):
    checked: list[int] = []

    def spy(cache, expected):
        checked.append(expected)
        cache_ops.check_lengths(cache, expected)

    monkeypatch.setattr(ssd, "check_lengths", spy)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    assert len(checked) == len(result.accepted) + 1
    assert checked[-1] == len(PROMPT) + NEW_TOKENS - 1


def _rollback_off_by_one(monkeypatch):
    """Make the rollback (the crop of all layers) keep one rejected position too many."""

    def crop(cache, length, layers=None):
        cache_ops.crop(cache, length + (layers is None), layers)

    monkeypatch.setattr(ssd, "crop", crop)


def test_rollback_off_by_one_trips_the_invariant(runner, monkeypatch):
    _rollback_off_by_one(monkeypatch)
    with pytest.raises(AssertionError, match="KV cache out of step"):
        speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)


def test_rollback_off_by_one_changes_the_output(runner, reference, monkeypatch):
    """Without the check, the stale position is attended to and the output drifts."""
    _rollback_off_by_one(monkeypatch)
    monkeypatch.setattr(ssd, "check_lengths", lambda cache, expected: None)
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    assert result.tokens != reference


def test_round_records(runner):
    result = speculative_decode(runner, PROMPT, MASKS["sparse multi"], NEW_TOKENS, gamma=3)
    summary = Summary.of([result])
    assert len(result.timings) == summary.rounds == len(result.gammas)
    assert result.timings[0].context == len(PROMPT)
    assert [t.context for t in result.timings] == sorted(t.context for t in result.timings)
    assert 0 < summary.acceptance <= 1
    assert summary.tokens_per_round == pytest.approx(NEW_TOKENS / summary.rounds)
    assert json.loads(json.dumps(result.to_dict()))["tokens"] == list(result.tokens)


# -- sampling: lossless in distribution ----------------------------------------------------------
def _chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = counts.sum() * p
    assert expected.min() >= 5, "every bin needs an expected count of at least 5"
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture(scope="module")
def small_vocab():
    """8-token model whose draft (layers 1-2 skipped) differs a lot from the target at T = 3.

    Chosen so every p(x) >= 0.029 and total variation(p, q) = 0.34: rejections are frequent and
    the residual decides a third of the samples.
    """
    model = eight_token_model()
    runner = LayerwiseRunner(model)
    mask = SkipMask.from_layers(3, [1, 2])
    sampling = Sampling(temperature=3.0)
    prompt = (1, 5, 3)
    ids = torch.tensor([prompt])
    p = sampling.probs(runner.forward(ids)[0, -1])
    q = sampling.probs(runner.forward(ids, mask=mask)[0, -1])
    return SimpleNamespace(runner=runner, mask=mask, sampling=sampling, prompt=prompt, p=p, q=q)


def _first_tokens(setup, seeds: int) -> torch.Tensor:
    counts = torch.zeros(len(setup.p))
    for seed in range(seeds):
        generator = torch.Generator().manual_seed(seed)
        result = speculative_decode(
            setup.runner, setup.prompt, setup.mask, 3, gamma=2, sampling=setup.sampling, generator=generator
        )
        counts[result.tokens[0]] += 1
    return counts


def test_sampled_first_token_follows_the_target(small_vocab):
    assert _chi_square(_first_tokens(small_vocab, 600), small_vocab.p) < CHI2_7_999


def test_residual_without_the_clamp_is_rejected(small_vocab, monkeypatch):
    """|p - q| counts the negative part of p - q as mass: the chi-square test must notice."""
    monkeypatch.setattr(sampling_ops, "residual", lambda p, q: (p - q).abs())
    assert _chi_square(_first_tokens(small_vocab, 300), small_vocab.p) > CHI2_7_999


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
def test_residual_all_zero_falls_back_to_p():
    p = torch.tensor([0.0, 0.25, 0.75])
    generator = torch.Generator().manual_seed(0)
    # p == q: the draft token is always accepted...
    assert all(accept_or_resample(p, p.clone(), 2, generator) == (True, 2) for _ in range(50))
    # ...and a forced rejection (u >= p/q never fails here) resamples from p, never from zeros.
    draws = [accept_or_resample(p, torch.tensor([1.0, 0.0, 0.0]), 0, generator) for _ in range(200)]
    assert all(not accepted and token in (1, 2) for accepted, token in draws)


def test_rejection_of_a_token_the_target_never_picks():
    p, q = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    generator = torch.Generator().manual_seed(0)
    assert all(accept_or_resample(p, q, 0, generator) == (False, 1) for _ in range(50))


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


# -- γ controller ---------------------------------------------------------------------------------
def test_controller_raises_and_lowers_additively_within_bounds():
    controller = GammaController(GammaPolicy(initial=3, window=8, min_samples=4, off_below=None))
    assert controller.update(3, 3) == 3  # 3 judged: fewer than min_samples
    assert [controller.update(3, 3) for _ in range(7)] == [4, 5, 6, 7, 8, 8, 8]
    # Each fully rejected round adds one rejection: 7/8, 6/8 (between thresholds), 5/8 < 0.7 ...
    assert [controller.update(0, 8) for _ in range(9)] == [8, 8, 7, 6, 5, 4, 3, 2, 2]
    assert controller.acceptance == pytest.approx(0.0)


def test_controller_window_slides():
    controller = GammaController(GammaPolicy(initial=4, window=4, min_samples=4, off_below=None))
    controller.update(0, 4)  # window [F]
    controller.update(3, 3)  # [F, T, T, T]: 0.75, between the thresholds
    assert controller.gamma == 4 and controller.acceptance == pytest.approx(0.75)
    controller.update(1, 4)  # T, F pushed in, the two oldest out: [T, T, T, F]
    assert controller.acceptance == pytest.approx(0.75)


def test_controller_switches_off_below_the_threshold_and_stays_off():
    controller = GammaController(GammaPolicy(initial=2, min_samples=4))  # switches off below 0.4
    assert [controller.update(1, 2) for _ in range(2)] == [2, 2]  # 2 of 4 judged: 0.5, at gamma_min
    assert controller.update(0, 2) == 2  # 2 of 5: 0.4 is not below 0.4
    assert controller.update(0, 2) == 0  # 2 of 6
    assert controller.update(3, 3) == 0 and controller.update(0, 0) == 0


def test_fixed_policy_never_moves():
    controller = GammaController(GammaPolicy.fixed(3))
    assert {controller.update(n, 3) for n in (0, 3, 3, 0, 3) * 20} == {3}


@pytest.mark.parametrize(
    "settings",
    [
        {"gamma_min": 0, "initial": 1},
        {"initial": 9},
        {"raise_above": 0.5, "lower_below": 0.7},
        {"off_below": 0.8},
        {"min_samples": 100},
    ],
    ids=str,
)
def test_invalid_gamma_policies(settings):
    with pytest.raises(ConfigError):
        GammaPolicy(**settings)


# -- timing breakdown -----------------------------------------------------------------------------
def test_breakdown_buckets_by_context_terciles():
    records = [RoundTiming(context, 3, 1, 0.2, 0.5, 0.1, 0.1, 0.1) for context in range(100, 130)]
    buckets = breakdown(records)
    assert [(b.name, b.low, b.high, b.rounds) for b in buckets] == [
        ("short", 100, 109, 10),
        ("medium", 110, 119, 10),
        ("long", 120, 129, 10),
    ]
    shares = {s.phase: s.share for s in buckets[0].phases}
    assert shares["verify"] == pytest.approx(0.5) and sum(shares.values()) == pytest.approx(1.0)
    assert buckets[0].round_p50 == pytest.approx(1.0)


# -- CLI ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        ["--skip", "4", "--gamma", "0"],
        ["--skip", "4", "--temperature", "-1"],
        ["--skip", "4", "--top-p", "0"],
        ["--skip", "4", "--top-p", "1.5"],
        ["--skip", "4", "--repeats", "0"],
        ["--skip", "4", "--dynamic-gamma", "--gamma", "1"],
    ],
    ids=" ".join,
)
def test_decode_rejects_invalid_settings(options, capsys):
    assert main(["decode", *options]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_decode_rejects_a_mask_that_skips_everything(monkeypatch, capsys):
    monkeypatch.setattr("skipsearch.acceptance.worker.prepare", lambda config: SimpleNamespace(num_layers=6))
    assert main(["decode", "--skip", "0-5"]) == 2
    assert "skips every layer" in capsys.readouterr().err


def test_decode_reads_mask_and_gamma_from_a_run(tmp_path, capsys):
    from skipsearch.cli.decode import read_from

    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": "a:1,4|m:1,4", "gamma_best": 5, "score": 1.3}))
    assert read_from(best) == ("a:1,4|m:1,4", 5)
    no_mask = tmp_path / "no_mask.json"
    no_mask.write_text(json.dumps({"gamma": 2}))
    with pytest.raises(ConfigError, match="mask"):
        read_from(no_mask)
    assert main(["decode", "--from", str(best), "--skip", "1"]) == 2
    assert "once" in capsys.readouterr().err


# -- the real embedded model ----------------------------------------------------------------------
@pytest.mark.integration
def test_greedy_ssd_is_lossless_on_smollm2():
    """Token for token in fp32 (bf16 may part at near-ties: `engine.lossless` judges those)."""
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.models.loading import load_model

    loaded = load_model("smollm2-135m", dtype="float32")
    runner = LayerwiseRunner(loaded.model)
    spec = PromptSpec(n_prompts=2, max_prompt_tokens=96, new_tokens=32, seed=0)
    masks = [SkipMask.from_layers(30, [4, 14]), SkipMask.prefix(30, 24)]
    for prompt in encode_prompts(spec, loaded.tokenizer):
        expected = autoregressive_decode(runner, prompt.ids, spec.new_tokens).tokens
        assert len(expected) == spec.new_tokens
        for mask in masks:
            assert speculative_decode(runner, prompt.ids, mask, spec.new_tokens, gamma=3).tokens == expected


@pytest.mark.integration
def test_decode_command_on_smollm2(tmp_path, capsys):
    out = tmp_path / "decode.json"
    options = ["--skip", "24-29", "--n-prompts", "1", "--max-new-tokens", "8", "--max-prompt-tokens", "64"]
    assert main(["decode", *options, "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lossless"] and result["exit_layer"] == 24
    assert set(result["summaries"]) == {"autoregressive", "hf-generate", "ssd", "hf-early-exit"}
    assert [e["mode"] for e in result["estimators"]] == ["shared-kv", "self"]
    assert "PASS" in capsys.readouterr().out
