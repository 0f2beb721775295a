"""Tier sets: the policy simulation against hand-computed trajectories, the search, the manifest,
and the tiered engine — lossless on a tiny model, eager, over static buffers, and on CUDA graphs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from skipsearch.acceptance.rounds import AcceptanceProfile
from skipsearch.cli import main
from skipsearch.cost.calibrated import predict
from skipsearch.cost.closed_forms import SelfSpeculative
from skipsearch.engine import Sampling, autoregressive_decode
from skipsearch.engine.graphs import GraphSteps, make_steps
from skipsearch.engine.ssd import EagerSteps
from skipsearch.engine.tiered import tiered_decode
from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.search.tier_sets import TierSetResult, candidate_pool, drop_unused, search_tier_sets
from skipsearch.tiers.manifest import TierManifest, is_tier_manifest
from skipsearch.tiers.policy import TierController, TierPolicy, check_policy
from skipsearch.tiers.simulation import (
    Single,
    Tier,
    TierScorer,
    Trajectories,
    closed_form,
    match_runs,
    simulate,
)
from tests.conftest import tiny_model


def profile(mask: SkipMask | str, *rows: str) -> AcceptanceProfile:
    """A profile from match strings: '1' = the draft matches the target at that position."""
    matches = tuple(tuple(c == "1" for c in row) for row in rows)
    return AcceptanceProfile(str(mask), matches, tuple((0.5,) * len(r) for r in rows), 0.0)


# -- the policy and its simulation ------------------------------------------------------------------
def test_controller_averages_draft_acceptance_over_the_window():
    controller = TierController(TierPolicy(window=2, thresholds=(0.5, 0.8)))
    assert controller.tier == 0 and controller.acceptance is None
    assert controller.update(3, 3) == 0  # one round: the window is not full yet
    assert controller.acceptance == 1.0
    assert controller.update(0, 3) == 1  # mean(1, 0) = 0.5, at the first threshold
    assert controller.update(3, 3) == 1  # the first round left the window: mean(0, 1)
    assert controller.update(3, 3) == 2  # mean(1, 1) = 1.0: the cheapest tier
    assert controller.update(1, 4) == 1  # mean(1, 0.25) = 0.625
    assert controller.update(0, 0) == 1  # a round that drafted nothing says nothing


def test_match_runs():
    assert match_runs([True, True, False, True, False, True]).tolist() == [2, 1, 0, 1, 0, 1]


def test_simulation_follows_a_hand_computed_trajectory():
    """Two tiers drafting 2 and 3 tokens, window 1, threshold 0.6, round costs 1.5 and 1.2.

    k=0  tier 0: run 3 -> accepts 2 of 2, commits 3; rate 1.0 -> tier 1
    k=3  tier 1: run 1 -> accepts 1 of 3, commits 2; rate 1/3 -> tier 0
    k=5  tier 0: run 4 -> accepts 2 of 2, commits 3; rate 1.0 -> tier 1
    k=8  tier 1: run 0 -> accepts 0 of 3, commits 1; rate 0   -> tier 0
    k=9  tier 0: run 0 -> accepts 0 of 2, commits 1; rate 0   -> tier 0
    k=10 tier 0: run 2 -> accepts 2 (= γ, not censored), commits 3; k = 13: done
    """
    rich, cheap = SkipMask.from_layers(8, [6]), SkipMask.from_layers(8, [2, 5, 6])
    trajectories = Trajectories.of([profile(rich, "111011111011"), profile(cheap, "101101110110")])
    run = simulate(trajectories, [1.5, 1.2], TierPolicy(1, (0.6,)), gammas=(2, 3))
    assert (run.rounds, run.tokens, run.tier_rounds) == (6, 13, (4, 2))
    assert run.time == pytest.approx(4 * 1.5 + 2 * 1.2)
    assert run.speedup == pytest.approx(13 / 8.4)
    assert run.tokens_per_round == pytest.approx(13 / 6) and run.time_per_round == pytest.approx(1.4)


def test_a_round_running_off_the_end_while_matching_is_censored():
    trajectories = Trajectories.of([profile("a:1|m:1", "011", "0")])
    run = simulate(trajectories, [1.0], TierPolicy(1, ()), gammas=(3,))
    assert (run.rounds, run.tokens) == (2, 2)  # "011" ends in a censored round; "0" is one round


def test_one_tier_reproduces_the_single_mask_prediction():
    rng = np.random.default_rng(3)
    mask = SkipMask.from_layers(12, [3, 7, 9])
    rows = ["".join("1" if x < 0.7 else "0" for x in rng.random(80)) for _ in range(5)]
    measured = profile(mask, *rows)
    form = SelfSpeculative.from_mask(mask)
    prediction = predict(measured, mask, gamma_max=6)
    for gamma in range(1, 7):
        run = simulate(Trajectories.of([measured]), [form.round_cost(gamma)], TierPolicy(4, ()), (gamma,))
        assert run.tokens_per_round == pytest.approx(measured.tokens_per_round(gamma))
        assert run.speedup == pytest.approx(prediction.closed_form[gamma - 1])


def test_profiles_of_different_prompt_sets_do_not_mix():
    with pytest.raises(ConfigError, match="different prompts"):
        Trajectories.of([profile("a:1|m:1", "0101"), profile("a:2|m:2", "010")])


@pytest.mark.parametrize(
    ("thresholds", "tiers"),
    [((0.8, 0.5), 3), ((0.5,), 3), ((0.0,), 2), ((1.0,), 2), ((0.5, 0.6, 0.7, 0.8), 5)],
)
def test_invalid_policies(thresholds, tiers):
    with pytest.raises(ConfigError):
        check_policy(TierPolicy(4, thresholds), tiers)


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


def test_a_tier_set_beats_its_best_single_mask_when_difficulty_varies():
    scorer = TierScorer([Tier(RICH, RICH_PROFILE), Tier(CHEAP, CHEAP_PROFILE)])
    assert [(s.mask, s.gamma) for s in scorer.singles] == [(str(RICH), 1), (str(CHEAP), 1)]
    score = scorer.score(TierPolicy(window=6, thresholds=(0.9,)), gammas=(1, 8))
    assert score.gain > 0.15
    assert score.best_single == scorer.singles[0]
    assert 0.2 < score.simulation.tier_share[1] < 0.5
    assert scorer.score(TierPolicy(6, (0.9,))).gammas == (1, 1)  # default: each mask's own best γ
    with pytest.raises(ConfigError, match="one draft length"):
        scorer.score(TierPolicy(6, (0.9,)), gammas=(1, 9))


def test_the_search_finds_the_tier_set_and_its_policy():
    noise = SkipMask.from_layers(8, [1, 3])
    profiles = {
        str(RICH): RICH_PROFILE,
        str(CHEAP): CHEAP_PROFILE,
        str(noise): profile(noise, *stretches(0.3)),
    }
    pool = candidate_pool(profiles, 8, top_n=3)
    assert [c.mask for c in pool] == [RICH, noise, CHEAP]  # richest first
    (best,) = search_tier_sets(pool, trials=200, sizes=(2,), seed=0)
    assert [c.mask for c in best.tiers] == [RICH, CHEAP]
    assert best.gain > 0.1 and best.pool_best.speedup == max(c.speedup for c in pool)
    manifest = best.manifest("tiny", {"runs": []}, "closed-form")
    assert manifest.gammas == best.score.gammas and manifest.masks == (RICH, CHEAP)
    assert manifest.predicted["gain_over_pool_best_single"] == pytest.approx(best.gain)


def test_the_search_does_not_report_a_set_below_the_best_mask_when_tiers_cannot_help():
    useless = SkipMask.prefix(8, 4)
    profiles = {str(RICH): RICH_PROFILE, str(useless): profile(useless, *stretches(0.0, seed=2))}
    (best,) = search_tier_sets(candidate_pool(profiles, 8), trials=5, sizes=(2,))
    assert best.gain > -0.01  # the study's anchor: the best mask as tier 0, a policy that stays


def test_a_tier_the_policy_never_reaches_is_dropped():
    """Window 2 over one-token drafts: the mean is 0, 0.5 or 1, never in [0.7, 0.8) (tier 1)."""
    middle = SkipMask.prefix(8, 5)
    profiles = {str(RICH): RICH_PROFILE, str(middle): RICH_PROFILE, str(CHEAP): CHEAP_PROFILE}
    pool = candidate_pool(profiles, 8)
    policy = TierPolicy(2, (0.7, 0.8))
    score = TierScorer([c.tier for c in pool]).score(policy, (1, 1, 1))
    assert score.simulation.tier_rounds[1] == 0
    pruned = drop_unused(TierSetResult(tuple(pool), policy, score, Single("x", 1, 1.0)), closed_form, 8)
    assert [c.mask for c in pruned.tiers] == [RICH, CHEAP] and pruned.policy == TierPolicy(2, (0.8,))
    assert pruned.score.speedup == pytest.approx(score.speedup)


def test_manifest_round_trips_and_lists_its_graphs(tmp_path):
    policy = TierPolicy(3, (0.75,))
    manifest = TierManifest("m", (RICH, CHEAP), policy, (1, 3), (1, 8), {"speedup": 1.3}, {"seed": 0})
    path = tmp_path / "tiers.json"
    manifest.save(path)
    assert is_tier_manifest(path) and TierManifest.load(path) == manifest
    data = json.loads(path.read_text())
    assert data["tiers"][1]["skipped_attn"] == [2, 3, 4, 5, 6, 7] and data["tiers"][1]["gamma"] == 3
    assert data["policy"]["start_tier"] == 0
    assert len(data["graphs"]["draft"]) == 2 * 2 and len(data["graphs"]["verify"]) == (2 + 4) * 2
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": str(RICH)}))
    assert not is_tier_manifest(best) and not is_tier_manifest(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="distinct"):
        TierManifest("m", (RICH, RICH), policy, (3, 3))
    with pytest.raises(ConfigError, match="one draft length"):
        TierManifest("m", (RICH, CHEAP), policy, (3,))


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


@pytest.fixture(scope="module")
def reference(runner):
    return autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens


@pytest.mark.parametrize("gammas", [GAMMAS, (1, 1, 1), (6, 6, 6)], ids=str)
def test_greedy_tier_decoding_equals_autoregressive(runner, reference, gammas):
    out = tiered_decode(runner, PROMPT, MASKS, gammas, POLICY, NEW_TOKENS)
    assert out.result.tokens == reference and out.mode == "eager"
    assert len(set(out.tiers)) > 1  # the policy did switch
    controller = TierController(POLICY)  # and it switched as the policy says
    for tier, g, n in zip(out.tiers, out.result.gammas, out.result.accepted, strict=True):
        assert tier == controller.tier and g <= gammas[tier]
        controller.update(n, g)


@pytest.mark.parametrize("bucket", [1, 2])
def test_static_buffers_decode_like_the_eager_path(runner, reference, bucket):
    """The graph code path run without capture: same tokens, same tier choices, reusable."""
    steps = GraphSteps(runner, MASKS, GAMMAS, ROOM, bucket=bucket, capture=False)
    eager = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS)
    static = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS, steps=steps)
    assert static.result.tokens == reference and static.tiers == eager.tiers
    short = (9, *PROMPT[:4])
    again = tiered_decode(runner, short, MASKS, GAMMAS, POLICY, 20, steps=steps)
    assert again.result.tokens == autoregressive_decode(runner, short, 20).tokens
    with pytest.raises(ConfigError, match="cache slots"):
        tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS + 10, steps=steps)


def test_sampled_tier_decoding_is_reproducible(runner):
    def run() -> tuple[int, ...]:
        generator = torch.Generator().manual_seed(11)
        sampling = Sampling(0.8, top_p=0.9)
        return tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, 24, sampling, generator).result.tokens

    assert run() == run() and len(run()) == 24


def test_without_cuda_the_steps_run_eagerly_and_say_so(runner, caplog):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    steps, reason = make_steps(runner, MASKS, GAMMAS, ROOM)
    assert isinstance(steps, EagerSteps) and "no CUDA device" in reason
    assert "no CUDA device" in caplog.text
    with pytest.raises(ConfigError, match=r"--require-graphs, but .* no CUDA device"):
        make_steps(runner, MASKS, GAMMAS, ROOM, require_graphs=True)
    with pytest.raises(ConfigError, match="CUDA graphs need a CUDA device"):
        GraphSteps(runner, MASKS, GAMMAS, ROOM, capture=True)


def test_tiers_for_another_depth_are_rejected(runner):
    with pytest.raises(InvalidMaskError, match="8 layers"):
        tiered_decode(runner, PROMPT, (RICH, CHEAP), (1, 2), TierPolicy(2, (0.5,)), 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_decode_losslessly():
    runner = LayerwiseRunner(tiny_model("llama").to("cuda"))
    expected = autoregressive_decode(runner, PROMPT, NEW_TOKENS).tokens
    eager = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS)
    for bucket in (1, 4):
        steps, reason = make_steps(runner, MASKS, GAMMAS, ROOM, bucket=bucket, require_graphs=True)
        assert isinstance(steps, GraphSteps) and steps.mode.startswith("cuda-graphs") and reason is None
        for _ in range(2):  # the graphs are captured once and replayed for every sequence
            graphed = tiered_decode(runner, PROMPT, MASKS, GAMMAS, POLICY, NEW_TOKENS, steps=steps)
            assert graphed.result.tokens == expected and graphed.tiers == eager.tiers


# -- decode --from tiers.json ------------------------------------------------------------------------
def test_decode_command_runs_a_tier_manifest(runner, tmp_path, monkeypatch, capsys):
    from skipsearch.models.loading import LoadedModel

    predicted = {"speedup": 1.1, "cost": "closed-form"}
    TierManifest("tiny", MASKS, POLICY, GAMMAS, predicted=predicted).save(tmp_path / "tiers.json")
    loaded = LoadedModel(runner.model, None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    monkeypatch.setattr(
        "skipsearch.acceptance.prompts.encode_prompts",
        lambda spec, tokenizer, context=None: [SimpleNamespace(ids=PROMPT)],
    )
    out = tmp_path / "decode.json"
    options = ["--from", str(tmp_path / "tiers.json"), "--new-tokens", "16", "--repeats", "1"]
    assert main(["decode", *options, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lossless"] and result["mode"] == "eager" and result["gammas"] == list(GAMMAS)
    assert set(result["summaries"]) == {"autoregressive", "ssd-tiers", "ssd-best-single"}
    assert sum(result["tier_share"]) == pytest.approx(1.0)
    assert "PASS" in capsys.readouterr().out
    assert main(["decode", *options, "--dynamic-gamma"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.integration
def test_decode_command_runs_tiers_on_smollm2(tmp_path, capsys):
    masks = (SkipMask.prefix(30, 28), SkipMask.prefix(30, 24))
    TierManifest("smollm2-135m", masks, TierPolicy(4, (0.7,)), (1, 3)).save(tmp_path / "tiers.json")
    out = tmp_path / "decode.json"
    options = ["--from", str(tmp_path / "tiers.json"), "--n-prompts", "1", "--new-tokens", "8"]
    assert main(["decode", *options, "--max-prompt-tokens", "64", "--repeats", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["lossless"]
