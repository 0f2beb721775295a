"""What a self-speculative draft skips, reads and proposes (docs/drafts.md, docs/theory.md).

A SkipMask says how the draft runs each attention and MLP sub-layer: at the model's own precision,
at int8 or int4, or skipped; a Draft adds a draft vocabulary and a KV pattern. Pure arithmetic: no
torch. The names below are the package's front door (`from skipsearch.masks import SkipMask`), as
they were when it was one module.

Modules:
- `skip_mask`: `SkipMask`, its string form, `s1` / `r_reuse` / `r_draft`, and the precisions
  (`FULL_BITS`, `LOW_BITS`, `BYTES_SHARE`, what each reads).
- `sublayer_weights`: `SublayerWeights`, each part of a forward's measured cost, for `r_draft` by time.
- `kv_pattern`: `KVPattern`, the keys a draft step attends to (sink, window, pillars).
- `draft`: `Draft`, a mask plus a draft vocabulary and a KV pattern, and its string form.
"""

from skipsearch.masks.draft import FULL_VOCAB, Draft, parse_draft_vocab, split_draft, vocab_label
from skipsearch.masks.kv_pattern import FULL_KV, KVPattern, kv_label
from skipsearch.masks.skip_mask import BYTES_SHARE, FULL_BITS, LOW_BITS, SkipMask, parse_layer_list, readable
from skipsearch.masks.sublayer_weights import SublayerWeights

__all__ = [
    "BYTES_SHARE",
    "FULL_BITS",
    "FULL_KV",
    "FULL_VOCAB",
    "LOW_BITS",
    "Draft",
    "KVPattern",
    "SkipMask",
    "SublayerWeights",
    "kv_label",
    "parse_draft_vocab",
    "parse_layer_list",
    "readable",
    "split_draft",
    "vocab_label",
]
