"""The cost model (docs/theory.md, "Speedup" and "Calibrated cost"): what a round costs in
autoregressive steps, and so the speedup a draft's AcceptanceProfile buys. Pure arithmetic, no
torch: the profiler that measures a device is `bench.latency_profiler`.

Modules:
- `closed_forms`: the closed forms: speedup from acceptance and the draft's share of a step.
- `latency`: `LatencyProfile`: the device's measured times of each part of a pass, by context and positions.
- `latency_schema`: what a LatencyProfile must hold (its checks) and its lower-precision tables.
- `calibrated`: the calibrated form (a round priced from a LatencyProfile) and the one-mask `predict`.
- `tree_cost`: what a token-tree round costs, and what it gains.
- `depth`: a LatencyProfile measured on a depth-cut model scaled back to the real depth.
- `profile_summary`: what a measured LatencyProfile says about the closed forms' assumptions.
- `memory`: serving memory: the batch-size gain of holding one set of weights.
- `verdict`: the rule that says whether a draft pays off (`PAYS_OFF`), judged on its predicted speedup.

Terms: the *closed form* prices a draft by its share of sub-layers; the *calibrated form* by the
measured times of a `LatencyProfile` (made by `skipsearch profile`); a round's cost is
`(γ draft steps + verify + overhead) / one step`, and the speedup `E(γ) / round cost`.
"""
