"""`bench.interleaved`: baseline runs bracketing the runs they are compared with."""

from skipsearch.bench.interleaved import bracketed_runs
from skipsearch.engine import autoregressive_decode
from skipsearch.masks import SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model


def test_bracketed_runs_time_every_mask_once_per_prompt_between_baseline_runs() -> None:
    runner = LayerwiseRunner(tiny_model("llama", layers=4))
    masks = {f"skip {k}": SkipMask.from_layers(4, [k]) for k in (1, 2, 3)}
    prompts = [(5, 17, 3), (42, 8, 23, 11)]
    runs = bracketed_runs(runner, prompts, masks, 2, 6, (), every=2)
    assert [len(ar) for ar in runs.ar] == [2, 2]  # 3 masks in blocks of 2: two baseline runs each
    assert {label: len(results) for label, results in runs.ssd.items()} == dict.fromkeys(masks, 2)
    for index, prompt in enumerate(prompts):  # lossless, and in prompt order
        expected = autoregressive_decode(runner, prompt, 6).tokens
        assert all(r.tokens == expected for r in runs.ar[index])
        assert all(results[index].tokens == expected for results in runs.ssd.values())
