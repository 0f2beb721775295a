"""`bench.decode_report`: a decode check's records read back from their JSON equal to what was
written, under the keys `skipsearch decode --json` has always written."""

import json

from skipsearch.bench.decode_report import (
    DecodeConditions,
    DecodeReport,
    DecoderSummary,
    EstimatorCheck,
    GraphedComparison,
    TiersReport,
)
from skipsearch.engine.result import Summary
from skipsearch.engine.sampling import Sampling
from skipsearch.engine.timing import Bucket, PhaseStats
from skipsearch.tree_shapes import TreeShape

AR = Summary(tokens=40, seconds=2.0, rounds=0, acceptance=None, tokens_per_round=None, mean_gamma=None)
SSD = Summary(tokens=40, seconds=1.0, rounds=16, acceptance=0.7, tokens_per_round=2.5, mean_gamma=3.0)
CONDITIONS = DecodeConditions(Sampling(0.7, 20, 0.9), 2, 3, 20, ("only 1 repeat(s)",))
BUCKET = Bucket("short", 10, 30, 5, (PhaseStats("draft", 0.001, 0.002, 0.4),), 0.003, 0.004)
CHECK = {"identical": True, "passed": True, "near_ties": 0, "real_divergences": 0, "divergences": [None]}


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def test_a_decoder_summary_keeps_the_speedup_under_its_baseline_key() -> None:
    summary = DecoderSummary.of(SSD, AR)
    written = summary.to_json("hf")
    assert list(written) == [
        "tokens", "seconds", "tokens_per_second", "speedup_vs_hf", "rounds", "acceptance", "tokens_per_round",
        "mean_gamma",
    ]  # fmt: skip
    assert written == SSD.to_dict(AR, "hf")  # what the engine's summary wrote before
    assert summary.speedup == 2.0 and DecoderSummary.from_json(written, "hf") == summary


def test_a_draft_report_reads_back_equal_and_knows_its_speedup() -> None:
    summaries = {"autoregressive": AR, "hf-generate": AR, "ssd": SSD}
    report = DecodeReport(
        model="m",
        mask="a:1|m:1",
        draft_vocab=16384,
        kv="full",
        exit_layer=None,
        gamma=3,
        tree=TreeShape.parse("2x1"),
        dynamic_gamma=False,
        draft_stop=0.0,
        random_weights=True,
        kernel_plan_line="kernel plan: eager",
        kernel_plan="eager",
        conditions=CONDITIONS,
        summaries={name: DecoderSummary.of(s, AR) for name, s in summaries.items()},
        estimators=(EstimatorCheck("rounds", 0.7, 0.69, 2.4, None, 2.5, -0.04),),
        lossless=True,
        lossless_check=CHECK,
        hf_matches_autoregressive=None,
        breakdown=(BUCKET,),
        graphs=None,
        runs={"ssd": [{"tokens": [1, 2]}]},
    )
    written = _through_json(report.to_json())
    assert written["tree"] == "2x1" and written["sampling"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.9}
    assert written["breakdown"][0]["phases"][0]["share"] == 0.4 and written["kernel_plan"] == "eager"
    assert DecodeReport.from_json(written) == report
    assert report.speedup == 2.0 and report.candidate.tokens_per_round == 2.5
    graphed = GraphedComparison("static", 1.5, 1.2, True)
    with_graphs = DecodeReport.from_json({**written, "graphs": graphed.to_json(), "tree": "chain"})
    assert with_graphs.graphs == graphed and with_graphs.tree is None  # `chain` in a file: no tree


def test_a_tier_report_reads_back_equal() -> None:
    report = TiersReport(
        model="m",
        manifest="tiers.json",
        tiers=("a:1", "a:1,2"),
        window=8,
        thresholds=(0.5,),
        gammas=(3, 4),
        best_single={"mask": "a:1", "gamma": 3},
        mode="eager",
        eager_reason="no GPU",
        conditions=CONDITIONS,
        baseline="autoregressive",
        summaries={"autoregressive": DecoderSummary.of(AR, AR), "ssd-tiers": DecoderSummary.of(SSD, AR)},
        tier_share=(0.25, 0.75),
        predicted={"speedup": 1.2},
        lossless=False,
        lossless_check=CHECK,
        breakdown=(),
        runs={},
        tier_runs=[[0, 1, 1]],
    )
    written = _through_json(report.to_json())
    assert written["policy"] == {"window": 8, "thresholds": [0.5]}
    assert "speedup_vs_autoregressive" in written["summaries"]["ssd-tiers"]
    assert TiersReport.from_json(written) == report
