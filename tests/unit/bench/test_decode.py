"""`bench.decode`: one draft's decode check with its graphed twins, which run eagerly over the same
static buffers off a GPU (the CLI refuses `--graphs` there; the check itself runs anywhere)."""

import json

import pytest

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.bench.decode import DecodeSettings, check_tree, decode_draft
from skipsearch.bench.decode_report import DecodeReport
from skipsearch.engine import GammaPolicy
from skipsearch.engine.sampling import GREEDY
from skipsearch.errors import ConfigError
from skipsearch.masks import Draft, KVPattern, SkipMask
from skipsearch.models.loading import LoadedModel
from skipsearch.models.random_weights import RandomWeights
from skipsearch.tree_shapes import TreeShape
from tests.conftest import tiny_model, with_plan_attention

NEW_TOKENS = 12


@pytest.mark.parametrize("kv", [None, KVPattern(2, 6)], ids=["every key", "sink and window"])
def test_a_graphed_check_compares_graphed_ssd_with_the_graphed_baseline(monkeypatch, kv) -> None:
    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    config = MeasureConfig("tiny", PromptSpec(n_prompts=2, max_prompt_tokens=9, new_tokens=NEW_TOKENS))
    settings = DecodeSettings(GREEDY, NEW_TOKENS, repeats=1, seed=0, breakdown=False)
    draft = Draft(SkipMask(4, [1], [1, 2]), None, kv)
    result = decode_draft(config, lambda layers: draft, GammaPolicy.fixed(3), settings, RandomWeights(), True)
    graphs = result.graphs
    assert graphs.mode == "static-eager" and graphs.graphed_autoregressive_matches
    assert graphs.ssd_vs_graphed_autoregressive > 0 and graphs.graphed_vs_eager_autoregressive > 0
    assert {"autoregressive", "autoregressive-graphs", "ssd", "ssd-graphs"} <= set(result.summaries)
    assert result.lossless and result.lossless_check["real_divergences"] == 0
    assert result.breakdown == ()  # the rounds ran untimed: no syncs for a phase clock
    assert result.speedup == pytest.approx(graphs.ssd_vs_graphed_autoregressive)  # graphed SSD is the one
    assert DecodeReport.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_without_graphs_the_check_has_no_graphed_decoders(monkeypatch) -> None:
    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    config = MeasureConfig("tiny", PromptSpec(n_prompts=1, max_prompt_tokens=9, new_tokens=NEW_TOKENS))
    settings = DecodeSettings(GREEDY, NEW_TOKENS, repeats=1, seed=0)
    draft = Draft(SkipMask(4, [1], [1, 2]), None, None)
    result = decode_draft(config, lambda layers: draft, GammaPolicy.fixed(3), settings, RandomWeights())
    assert result.graphs is None and not {"autoregressive-graphs", "ssd-graphs"} & set(result.summaries)
    assert result.breakdown  # timed by default: the phase breakdown is there
    written = json.loads(json.dumps(result.to_json()))
    assert DecodeReport.from_json(written) == result  # the report's one JSON form reads back equal
    assert (
        list(written["summaries"]["ssd"])[3] == "speedup_vs_hf" and "sampling" in written
    )  # the keys of old
    ssd, ar = (result.summaries[name].tokens_per_second for name in ("ssd", "autoregressive"))
    assert result.speedup == pytest.approx(ssd / ar)


def test_a_tree_check_runs_the_tree_beside_the_same_draft_as_a_chain(monkeypatch) -> None:
    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    config = MeasureConfig("tiny", PromptSpec(n_prompts=2, max_prompt_tokens=9, new_tokens=NEW_TOKENS))
    settings = DecodeSettings(GREEDY, NEW_TOKENS, repeats=1, seed=0)
    draft = Draft(SkipMask(4, [1], [1, 2]), None, None)
    tree = TreeShape.parse("2x2x1")
    result = decode_draft(
        config, lambda layers: draft, GammaPolicy.fixed(3), settings, RandomWeights(), tree=tree
    )
    assert set(result.summaries) == {"autoregressive", "hf-generate", "ssd", "ssd-chain"}
    assert result.tree == tree and result.lossless and result.to_json()["tree"] == "2x2x1"
    runs = result.runs
    assert [r["tokens"] for r in runs["ssd"]] == [r["tokens"] for r in runs["autoregressive"]]
    assert max(g for r in runs["ssd"] for g in r["gammas"]) == tree.depth


def test_a_tree_refuses_what_its_rounds_do_not_run() -> None:
    check_tree(TreeShape.parse("2x1"), KVPattern(4, 16), GammaPolicy.fixed(2), False)  # a sink and a window
    with pytest.raises(ConfigError, match="not pillars"):
        check_tree(TreeShape.parse("2x1"), KVPattern(4, 16, 8), GammaPolicy.fixed(2), False)
    with pytest.raises(ConfigError, match="window of 2"):
        check_tree(TreeShape.parse("2x1"), KVPattern(4, 2), GammaPolicy.fixed(2), False)
    with pytest.raises(ConfigError, match="whole shape"):
        check_tree(TreeShape.parse("2x1"), None, GammaPolicy.fixed(2, 0.5), False)
    check_tree(TreeShape.parse("2x1"), None, GammaPolicy.fixed(2), True)  # graphed trees run
    with pytest.raises(ConfigError, match="CUDA graphs draft over every key"):
        check_tree(TreeShape.parse("2x1"), KVPattern(4, 16), GammaPolicy.fixed(2), True)


def test_a_graphed_tree_check_runs_the_graphed_tree_beside_the_graphed_chain(monkeypatch) -> None:
    """`--graphs --tree`: the graphed SSD drafts trees (depth 2 a round at most), the graphed chain
    drafts gamma 3 beside it, both over the graphed steps run eagerly off a GPU; the graphed tree is
    the SSD checked lossless."""
    loaded = LoadedModel(with_plan_attention(tiny_model("llama", layers=4)), None, "tiny", "memory")
    monkeypatch.setattr("skipsearch.models.loading.load_model", lambda *args: loaded)
    config = MeasureConfig("tiny", PromptSpec(n_prompts=2, max_prompt_tokens=9, new_tokens=NEW_TOKENS))
    settings = DecodeSettings(GREEDY, NEW_TOKENS, repeats=1, seed=0, breakdown=False)
    draft = Draft(SkipMask(4, [1], [1, 2]), None, None)
    tree = TreeShape.parse("2x1")
    result = decode_draft(
        config, lambda layers: draft, GammaPolicy.fixed(3), settings, RandomWeights(), True, tree
    )
    assert result.graphs.mode == "static-eager" and result.lossless
    runs = result.runs
    assert {"ssd-graphs", "ssd-chain-graphs", "autoregressive-graphs"} <= set(runs)
    assert [r["tokens"] for r in runs["ssd-graphs"]] == [r["tokens"] for r in runs["autoregressive"]]
    assert [r["gammas"] for r in runs["ssd-graphs"]] == [r["gammas"] for r in runs["ssd"]]
    assert max(g for r in runs["ssd-graphs"] for g in r["gammas"]) == tree.depth
    assert max(g for r in runs["ssd-chain-graphs"] for g in r["gammas"]) == 3
