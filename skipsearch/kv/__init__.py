"""The KV cache and what a draft's attention reads of it (docs/theory.md, "KV patterns").

Modules:
- `plan_kv`: `PlanKVCache`, the kernel plan's cache: K/V appended in place, in the dtype its attention reads.
- `patterns`: attention over a draft's KV pattern: the sink and the window, read where they lie.
- `pillars`: keys beyond the sink and window, chosen from the full model's own attention.
- `tree_keys`: which keys each row of a token tree's pass sees.

Terms: a *KV pattern* (`masks.KVPattern`, e.g. `s4w256k64`) makes a draft read only a *sink* (the
first keys), a *window* (the last keys) and `k` *pillars*; the engine's shared KV cache between
draft and verify is `engine.shared_kv`.
"""
