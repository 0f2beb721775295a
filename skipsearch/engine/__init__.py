"""Self-speculative decoding with any SkipMask: the ground truth for the estimator and the cost model.

A round's vocabulary (as vLLM's rejection sampler opens with its glossary):

- γ (gamma): the draft length a round asks for — a chain's draft tokens, a token tree's depths.
  γ = 0 is one plain autoregressive step (speculation switched off, or the decode's last token).
- s1: the draft mask's first divergent layer (`steps.divergent_layer`; 0 under a KV pattern).
  Below it the draft runs exactly the full model, so its K/V there, and its residual stream at
  s1, are the full model's.
- r_reuse = s1 / L: the share of layers whose K/V the draft writes exactly, which the verify
  reuses — it runs layers `< s1` only for the tokens the draft never fed — so a round costs
  `γ r_draft + 1 - r_reuse` full steps (docs/theory.md, "The skip mask: r_draft, s1 and r_reuse").
- pending token: the last committed token. Its K/V is not yet in the cache; the next round feeds
  it (first draft step, or the verify), at position `n - 1` of `n` committed tokens. It is kept on
  the device between rounds.
- fed node: a token the draft ran through the model — the pending token and every draft token
  but the last of a chain; a tree's root and every node but its leaves. Its K/V below s1 is
  already exact; the verify runs layers `< s1` only for the tokens that were not fed.
- accepted tokens: the draft tokens the target agrees with (greedy: its argmax; sampled:
  rejection sampling, `min(1, p / q)`), `n` of them a round, a path from the root in a tree.
- committed tokens: the accepted ones plus one token of the target's own, `n + 1` a round — the
  correction at the first rejection, or the bonus token when all γ were accepted. Every output
  token is the target's, so greedy output equals autoregressive output token for token.
- shared KV cache (`shared_kv`): one cache for the draft and the verify. Invariant, between
  rounds: with `n` committed tokens every layer holds positions `0 .. n-2` (length `n - 1`);
  the pending token's K/V is written by the next round.

    from skipsearch.engine import GammaPolicy, Sampling, Summary, autoregressive_decode, speculative_decode

    runner = LayerwiseRunner(model)
    mask = SkipMask.from_layers(runner.num_layers, [4, 14])
    result = speculative_decode(runner, prompt_ids, mask, max_new_tokens=64, gamma=3)
    assert result.tokens == autoregressive_decode(runner, prompt_ids, 64).tokens
    print(Summary.of([result]).tokens_per_round)
    sampled = speculative_decode(
        runner, prompt_ids, mask, 64, gamma=GammaPolicy(initial=3), sampling=Sampling(0.8, top_p=0.95)
    )

Modules, one job each:

- `ssd`: the round loop (`run_rounds`: draft, verify, accept, rollback), the one function that
  plays every kind of round, and `speculative_decode`, a chain of one mask.
- `steps`: the loop's interface (`Round`, `RoundSteps`, `Proposal`) and a chain's side of it: its
  draft and verify passes, its proposal's accept and rollback, and `EagerSteps`.
- `tree_rounds`: token trees (static and dynamic): their drafts, verify, walks and proposal,
  `EagerTreeSteps`, and `tree_decode`.
- `graphs`: a chain's passes over a static cache, captured as CUDA graphs (`GraphSteps`).
- `graphed_tree`: a token tree's passes on the same cache and graphs (`TreeGraphSteps`).
- `graphed_decode`: the graphed autoregressive baseline and one mask's graphed rounds.
- `tiered`: a mask picked per round by a tier policy (`tiered_decode`).
- `autoregressive`: the baseline every speculative decode must reproduce.
- `sampling`: pure acceptance arithmetic (`greedy_commit`, `sample_accept`, the residual).
- `gamma`: the dynamic draft length (`GammaController`) and the draft's confidence stop.
- `shared_kv`: the shared KV cache, its rollback (`crop`, `compact`) and its invariant.
- `timing`: each round's latency breakdown by phase.
- `result`: what a decode returns (`DecodeTrace`) and the metrics pooled over decodes (`Summary`).
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
