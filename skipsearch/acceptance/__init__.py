"""Measuring acceptance (docs/theory.md, "Measuring acceptance"): how often a draft's token is the
one the target model would have produced, measured teacher-forced on a prompt set, without running
the speculative loop.

Modules:
- `profile`: `AcceptanceProfile` and the exact round simulation over it (pure arithmetic, no model).
- `estimator`: the teacher-forced `Estimator`: one draft forward per prompt gives an AcceptanceProfile.
- `shared_kv`: what a `shared-kv` / `rounds` draft position attends to: the reference's K/V, its own, pillars.
- `statistics`: per-position greedy match, sampled acceptance, confidence and ranks (tensor arithmetic).
- `reference`: the `ReferenceCache`: what the target does on the prompt set, computed once.
- `prompts`: prompt sets: load, select by seed, tokenize.
- `measure_config`: `MeasureConfig`, what defines one measurement (model, prompts, estimator mode).
- `worker`: everything a worker needs to evaluate masks: model, prompts, reference, estimator.
- `vocab`: the frequency ranking behind a draft vocabulary (which `k` token ids a draft head keeps).
- `importance`: sub-layer importance: what the draft loses by skipping each attention, MLP or layer.
- `stream_proxy`: the importance proxy, from the reference cache in one extra pass.

Terms: an *AcceptanceProfile* holds, per prompt and continuation position, the greedy match, the
sampled acceptance `sum_x min(p(x), q(x))`, the draft's confidence and the target's rank of the
draft token: everything the round simulation, the cost model and the search read of a draft. It
is not a `LatencyProfile` (`cost.latency`: what the device's passes cost).
"""
