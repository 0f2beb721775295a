"""Real self-speculative decoding with any SkipMask: the ground truth for estimator and cost model.

    from skipsearch.engine import GammaPolicy, Sampling, Summary, autoregressive_decode, speculative_decode

    runner = LayerwiseRunner(model)
    mask = SkipMask.from_layers(runner.num_layers, [4, 14])
    result = speculative_decode(runner, prompt_ids, mask, max_new_tokens=64, gamma=3)
    assert result.tokens == autoregressive_decode(runner, prompt_ids, 64).tokens
    print(Summary.of([result]).tokens_per_round)
    sampled = speculative_decode(
        runner, prompt_ids, mask, 64, gamma=GammaPolicy(initial=3), sampling=Sampling(0.8, top_p=0.95)
    )

Modules: `ssd` (the loop: draft, verify, accept, rollback), `steps` (the draft and verify passes
behind `RoundSteps`, and the eager ones), `autoregressive` (the baseline), `sampling` (pure
acceptance arithmetic), `gamma` (dynamic draft length), `cache` (shared KV cache and its
invariant), `timing` (per-round latency breakdown), `result` (what a decode returns).
"""

from skipsearch.engine.autoregressive import autoregressive_decode
from skipsearch.engine.gamma import GammaController, GammaPolicy
from skipsearch.engine.result import DecodeTrace, Summary
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.ssd import speculative_decode
from skipsearch.engine.timing import RoundTiming, breakdown

__all__ = [
    "GREEDY",
    "DecodeTrace",
    "GammaController",
    "GammaPolicy",
    "RoundTiming",
    "Sampling",
    "Summary",
    "autoregressive_decode",
    "breakdown",
    "speculative_decode",
]
