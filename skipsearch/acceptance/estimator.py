"""Teacher-forced acceptance estimator (docs/theory.md, "Measuring acceptance").

A mask is evaluated in one batched teacher-forced forward that starts at its first skipped
layer (`s1`, or `s1 - 1` when the first skip is an MLP) from the ReferenceCache's states — the
layers before it are identical to the full model, so a mask whose first skip is late costs little.

Prompts of different lengths share one right-padded batch: with a causal mask a real position
never attends to padding that follows it, so no padding mask is needed and results are exact.

`rounds` mode is `shared-kv` with the engine's rounds: a draft position sees its own K/V from the
start of its round on, and where rounds start depends on what was accepted. So the rounds are
found by iteration — pass 0 is `shared-kv` (every position alone), each later pass uses the rounds
the previous pass's matches imply (`round_starts`) — until the rounds no longer change. At that
fixed point every round's drafts saw what the engine's draft sees, so greedy matches are the
engine's at `round_gamma`. Each pass fixes at least one more position from the left, so it ends;
on real masks it takes 2-4 passes. With `round_stop`, a round also ends after a position where the
draft's confidence (`greedy_confidence`) is below it, as the engine's draft stops (docs/theory.md,
"The confidence stop"); every profile records those confidences.

A KV pattern (docs/theory.md, "KV patterns") narrows what each draft position attends to: the
estimator ANDs the pattern's band (keys before `sink`, or within `window` of the query) into the
attention mask of every mode, and starts at layer 0, since every layer's attention changes. The
masked SDPA reads every key, but the draft sees exactly the keys the engine's slices give it.
Pillars (`kv.pillars`) follow the engine's rounds: each layer's attention runs once over the
reference's states at every prediction position to choose them as a verify would, and a draft
position's mask adds, per layer and head, those chosen at the first position of the round before
its own (`previous_round_starts`; in `shared-kv`, where every position is a round, the position
before; the cache and masks are `acceptance.shared_kv`'s). `self` mode has no rounds and refuses
them.

A sub-layer at lower precision (`SkipMask.attn_bits`, `mlp_bits`) runs where the engine's draft runs
it, on the same int8 / int4 copies (`LayerwiseRunner`, `models.draft_weights`): it counts as skipped
for where evaluation starts (`first_skipped_layer`), and its attention's own K/V join the round's as
a skipped layer's would not.

A draft vocabulary (docs/theory.md, "The draft vocabulary") changes only the head: the draft
proposes the argmax over the subset, and samples from `q` renormalised over it. Both follow exactly
from the draft's full logits, so one forward measures the mask at every vocabulary size
(`evaluate(.., vocabs)`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from skipsearch.acceptance.measure_config import ESTIMATOR_MODES, MODES_WITH_KV, refuse_pillars_in_self_mode
from skipsearch.acceptance.profile import (
    AcceptanceProfile,
    previous_round_starts,
    round_starts,
    tree_round_starts,
)
from skipsearch.acceptance.reference import FORWARD_BATCH, ReferenceCache
from skipsearch.acceptance.shared_kv import PillarMasks, SharedKV, choose_pillars
from skipsearch.acceptance.statistics import (
    greedy_confidence,
    sampling_acceptance,
    subset_acceptance,
    target_rank,
    top_probs,
)
from skipsearch.errors import ConfigError
from skipsearch.kv.pillars import PillarChoice
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.device import device_sync
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import MAX_TOP, RANK_CAP, Tree, as_tree

log = logging.getLogger(__name__)


VocabIds = Callable[[int], Sequence[int]]
"""The `k` ids of a draft vocabulary of size `k` (the top of the run's frequency ranking)."""


class Estimator:
    """Evaluates skip masks (at any draft-vocabulary sizes) against one ReferenceCache."""

    def __init__(
        self,
        runner: LayerwiseRunner,
        reference: ReferenceCache,
        mode: str = "self",
        vocab_ids: VocabIds | None = None,
        round_gamma: int = 3,
        round_vocab: int | None = None,
        round_stop: float = 0.0,
        round_tree: Tree | None = None,
    ) -> None:
        if mode not in ESTIMATOR_MODES:
            raise ConfigError(f"unknown estimator mode {mode!r}: use one of {', '.join(ESTIMATOR_MODES)}")
        if mode in MODES_WITH_KV and reference.keys is None:
            raise ConfigError(f"the reference cache holds no K/V, which {mode} mode needs: build it with K/V")
        self.runner = runner
        self.reference = reference
        self.mode = mode
        self.vocab_ids = vocab_ids
        self.round_gamma = round_gamma
        self.round_vocab = round_vocab  # `rounds` mode: the draft vocabulary whose argmax drafts
        self.round_stop = round_stop  # `rounds` mode: the confidence below which a round stops
        self.round_tree = as_tree(round_tree)  # `rounds` mode: the token tree whose rounds are simulated
        self.passes: list[int] = []  # `rounds` mode: forward passes each evaluation took
        self._subsets: dict[int, torch.Tensor] = {}
        self._pillars: dict[tuple[KVPattern, int], PillarChoice] = {}
        self.rows, self.cols = reference.prediction_index()
        with torch.no_grad():  # kept for the estimator's life: no autograd graph may hang off them
            self.target_logits = runner.head(reference.hidden[-1][self.rows, self.cols])
        # A greedy draft is judged against the token the full model decodes, the continuation itself
        # (decoded one position at a time, as the engine's baseline and verify reproduce it), not the
        # argmax of the teacher-forced logits: in bf16 those tie or flip at near-ties, and one such
        # flip at a 4-token round's first draft cost an 8k pillar draft's estimate a whole round.
        self.target_tokens = reference.input_ids[self.rows, self.cols + 1]

    def draft_logits(self, mask: SkipMask, kv: KVPattern | None = None) -> torch.Tensor:
        """Logits of the draft at every prediction position, from its first skipped layer on
        (layer 0 under a KV pattern)."""
        if self.mode == "rounds":
            return self._round_logits(mask, kv)
        if self.mode == "self":
            refuse_pillars_in_self_mode(self.mode, (kv,))
            start = _first_changed_layer(mask, kv)
            rows = [self._self_rows(mask, start, r, kv) for r in self._row_chunks()]
            return self.runner.head(torch.cat(rows))
        return self._shared_kv_logits(mask, None, kv)

    def _shared_kv_logits(
        self, mask: SkipMask, rounds: tuple[torch.Tensor, torch.Tensor] | None, kv: KVPattern | None = None
    ) -> torch.Tensor:
        """`shared-kv` logits; `rounds`: each query's round start and the previous round's start,
        `[prompts, queries]` offsets (None: every query a round of its own)."""
        start = _first_changed_layer(mask, kv)
        finals = [
            self._shared_kv_rows(
                mask, start, rows, None if rounds is None else (rounds[0][rows], rounds[1][rows]), kv
            )
            for rows in self._row_chunks()
        ]
        return self.runner.head(torch.cat(finals))

    def _round_logits(self, mask: SkipMask, kv: KVPattern | None = None) -> torch.Tensor:
        """`shared-kv` passes until the rounds their greedy matches imply stop changing (see above)."""
        rounds = None
        for passes in range(1, self.target_tokens.numel() + 2):
            logits = self._shared_kv_logits(mask, rounds, kv)
            if self.round_tree is not None:
                found = self._tree_rounds(logits, self.round_tree)
                if rounds is not None and all(map(torch.equal, found, rounds)):
                    self.passes.append(passes)
                    return logits
                rounds = found
                continue
            matches = self._drafted(logits) == self.target_tokens
            confident = None
            if self.round_stop:
                subset = logits if self.round_vocab is None else logits[:, self.subset(self.round_vocab)]
                confident = greedy_confidence(subset) >= self.round_stop
            found = (
                self._per_query(matches, round_starts, confident),
                self._per_query(matches, previous_round_starts, confident),
            )
            if rounds is not None and all(map(torch.equal, found, rounds)):
                self.passes.append(passes)
                return logits
            rounds = found
        raise RuntimeError(f"round-aware estimation of {mask} found no fixed point: a bug")

    def _tree_rounds(self, logits: torch.Tensor, shape: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's round start under the greedy rounds of `shape` (`tree_round_starts`), and
        no previous round's (a tree's draft takes no pillars)."""
        ids = None if self.round_vocab is None else self.subset(self.round_vocab)
        ranks = target_rank(logits, self.target_tokens, RANK_CAP, ids)
        sizes = self.reference.row_sizes()
        probs = _split(top_probs(logits, MAX_TOP, ids).tolist(), sizes)
        rows = iter(range(len(sizes)))

        def starts_of(values: list[int], _gamma: int, _sure: list[bool] | None) -> list[int]:
            return tree_round_starts(values, shape, probs[next(rows)])

        starts = self._per_query(ranks, starts_of)
        return starts, torch.full_like(starts, -1)

    def _drafted(self, logits: torch.Tensor) -> torch.Tensor:
        """The token a greedy draft proposes: the argmax over `round_vocab` (all ids when None),
        so the rounds simulated are those of a draft with that vocabulary."""
        if self.round_vocab is None:
            return logits.argmax(-1)
        subset = self.subset(self.round_vocab)
        return subset[logits[:, subset].argmax(-1)]

    def _per_query(
        self,
        matches: torch.Tensor,
        rule: Callable[[list[bool], int, list[bool] | None], list[int]],
        confident: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`[prompts, queries]` offsets from a round rule (`round_starts`, `previous_round_starts`)
        at `round_gamma`, with the positions where the draft is sure enough to go on (`confident`,
        None: no stop); padding queries get themselves."""
        sizes = self.reference.row_sizes()
        found = torch.arange(max(sizes)).repeat(len(sizes), 1)
        sure = [None] * len(sizes) if confident is None else _split(confident.tolist(), sizes)
        for row, values in enumerate(_split(matches.tolist(), sizes)):
            found[row, : len(values)] = torch.tensor(rule(values, self.round_gamma, sure[row]))
        return found.to(self.runner.device)

    def _row_chunks(self) -> list[slice]:
        count = self.reference.input_ids.shape[0]
        return [slice(begin, min(begin + FORWARD_BATCH, count)) for begin in range(0, count, FORWARD_BATCH)]

    def _self_rows(
        self, mask: SkipMask, start: int, rows: slice, kv: KVPattern | None = None
    ) -> torch.Tensor:
        """`self` mode: the draft runs every position of the rows, attending to its own K/V."""
        ref = self.reference
        width = int(ref.lengths[rows].max())
        positions = torch.arange(width, device=self.runner.device)
        position_ids = positions[None]
        hidden = ref.hidden[start, rows, :width]
        band = None
        if kv is not None:  # causal, and within the pattern
            band = (positions[None] <= positions[:, None]) & kv.sees(positions[None], positions[:, None])
            band = band[None, None]
        hidden = self.runner.run_layers(
            hidden, start, self.runner.num_layers, position_ids, mask, attention_mask=band
        )
        prompt, length = ref.prompt_lengths[rows].tolist(), ref.lengths[rows].tolist()
        return torch.cat(
            [hidden[i, p - 1 : n - 1] for i, (p, n) in enumerate(zip(prompt, length, strict=True))]
        )

    def _shared_kv_rows(
        self,
        mask: SkipMask,
        start: int,
        rows: slice,
        rounds: tuple[torch.Tensor, torch.Tensor] | None,
        kv: KVPattern | None = None,
    ) -> torch.Tensor:
        """`shared-kv` mode: only prediction positions run; each attends to the full model's K/V
        before its round and to its own K/V from the round's start to itself (`rounds`: the round
        starts and the previous rounds' starts, offsets among the queries; None: every query alone)
        — so the prompt costs nothing. A pattern with pillars adds those the previous round's first
        query chose."""
        ref = self.reference
        device = self.runner.device
        prompt, length = ref.prompt_lengths[rows], ref.lengths[rows]
        counts = length - prompt
        width, queries = int(length.max()), int(counts.max())
        offsets = torch.arange(queries, device=device)[None]
        valid = offsets < counts[:, None]
        position_ids = torch.minimum(prompt[:, None] - 1 + offsets, length[:, None] - 2)
        hidden = ref.hidden[start, rows].gather(
            1, position_ids[..., None].expand(-1, -1, ref.hidden.shape[-1])
        )
        alone = offsets.expand(len(counts), -1)
        starts, sources = (alone, alone - 1) if rounds is None else (r[:, :queries] for r in rounds)
        round_start = prompt[:, None] - 1 + starts
        earlier = torch.arange(width, device=device)[None, None] < round_start[..., None]
        own = (offsets[:, None, :] >= starts[..., None]) & (offsets[:, None, :] <= offsets[:, :, None])
        if kv is not None:  # absolute key positions against each query's
            query = position_ids[..., None]
            earlier &= kv.sees(torch.arange(width, device=device)[None, None], query)
            own &= kv.sees((prompt[:, None] - 1 + offsets)[:, None, :], query)
        cache = SharedKV(ref.keys[:, rows, :, :width], ref.values[:, rows, :, :width])
        attention_mask: torch.Tensor | PillarMasks = torch.cat([earlier, own], dim=2)[:, None]
        if kv is not None and kv.pillars:
            chosen = self._chosen_pillars(kv, rows, position_ids, cache)
            attention_mask = PillarMasks(earlier, own, chosen, sources, self.runner.config)
        hidden = self.runner.run_layers(
            hidden, start, self.runner.num_layers, position_ids, mask, cache, attention_mask
        )
        return hidden[valid]

    def _chosen_pillars(
        self, kv: KVPattern, rows: slice, position_ids: torch.Tensor, cache: SharedKV
    ) -> PillarChoice:
        """The pillars the full model chooses at every prediction position of `rows`
        (`shared_kv.choose_pillars`), computed once per pattern and batch of rows."""
        key = (kv, rows.start)
        if key not in self._pillars:
            self._pillars[key] = choose_pillars(self.runner, self.reference, kv, rows, position_ids, cache)
        return self._pillars[key]

    @torch.no_grad()
    def evaluate(
        self,
        mask: SkipMask,
        temperature: float = 1.0,
        vocabs: Sequence[int] = (),
        kv: KVPattern | None = None,
        patterns: Sequence[KVPattern] = (),
    ) -> AcceptanceProfile:
        """The draft's AcceptanceProfile with the full vocabulary, and in `by_vocab` one per size in `vocabs`;
        `kv`, the draft's KV pattern (None: every key); in `by_kv` the same under each of
        `patterns`, one draft forward each (the vocabularies come from the same logits)."""
        mask.check_fits(self.runner.num_layers)
        self.runner.prepare(mask)  # a lower-precision draft's weights, refused if they do not fit
        by_kv = tuple(self.evaluate(mask, temperature, vocabs, pattern) for pattern in patterns)
        logits = self.draft_logits(mask, kv)
        target, tokens = self.target_logits, self.target_tokens
        matches = logits.argmax(-1) == tokens
        full = self._profile(
            mask,
            matches,
            sampling_acceptance(target, tokens, logits, temperature),
            greedy_confidence(logits),
            target_rank(logits, tokens, RANK_CAP),
            top_probs(logits, MAX_TOP),
            temperature,
        )
        variants = tuple(
            self._profile(
                mask,
                *subset_acceptance(target, tokens, logits, self.subset(k), temperature),
                greedy_confidence(logits[..., self.subset(k)]),
                target_rank(logits, tokens, RANK_CAP, self.subset(k)),
                top_probs(logits, MAX_TOP, self.subset(k)),
                temperature,
                k,
            )
            for k in sorted(set(vocabs), reverse=True)
        )
        if kv is not None:
            full, variants = replace(full, kv=kv), tuple(replace(v, kv=kv) for v in variants)
        return replace(full, by_vocab=variants, by_kv=by_kv)

    def subset(self, size: int) -> torch.Tensor:
        """The ids of the draft vocabulary of `size`, on the model's device (built once per size)."""
        if self.vocab_ids is None:
            raise ConfigError(
                "a draft vocabulary needs a frequency ranking, and this estimator was built without one: "
                "measure through `skipsearch.acceptance.worker.prepare`, which builds it"
            )
        if size not in self._subsets:
            self._subsets[size] = torch.as_tensor(list(self.vocab_ids(size)), device=self.runner.device)
        return self._subsets[size]

    def _profile(
        self,
        mask: SkipMask,
        matches: torch.Tensor,
        accept: torch.Tensor,
        confidence: torch.Tensor,
        ranks: torch.Tensor,
        tops: torch.Tensor,
        temperature: float,
        draft_vocab: int | None = None,
    ) -> AcceptanceProfile:
        sizes = self.reference.row_sizes()
        return AcceptanceProfile(
            mask=str(mask),
            greedy_match=tuple(tuple(r) for r in _split(matches.tolist(), sizes)),
            sampling_accept=tuple(tuple(r) for r in _split(accept.tolist(), sizes)),
            temperature=temperature,
            draft_vocab=draft_vocab,
            greedy_confidence=tuple(tuple(r) for r in _split(confidence.tolist(), sizes)),
            target_rank=tuple(tuple(r) for r in _split(ranks.tolist(), sizes)),
            top_probs=tuple(tuple(map(tuple, r)) for r in _split(tops.tolist(), sizes)),
        )

    def time_full_forward(self) -> float:
        """Seconds for one full-model forward over the same batch (embedding to head).

        One untimed pass first (allocator, kernels' first launch); on CUDA the device is synchronised
        around the timed pass, which otherwise returns once its kernels are queued.
        """
        sync = device_sync(self.runner.device)
        self._full_forward()
        sync()
        began = time.perf_counter()
        self._full_forward()
        sync()
        return time.perf_counter() - began

    @torch.no_grad()
    def _full_forward(self) -> None:
        ref = self.reference
        width = ref.input_ids.shape[1]
        position_ids = torch.arange(width, device=self.runner.device)[None]
        for begin in range(0, ref.input_ids.shape[0], FORWARD_BATCH):
            ids = ref.input_ids[begin : begin + FORWARD_BATCH]
            self.runner.run_layers(self.runner.embed(ids), 0, self.runner.num_layers, position_ids)
        self.runner.head(ref.hidden[-1][self.rows, self.cols])


def _first_changed_layer(mask: SkipMask, kv: KVPattern | None) -> int:
    """Where the draft's computation first differs from the full model's: its first skipped
    sub-layer's layer, or layer 0 under a KV pattern (every layer's attention reads fewer keys)."""
    return 0 if kv is not None else mask.first_skipped_layer


def _split(values: list, sizes: Sequence[int]) -> list[list]:
    out, begin = [], 0
    for size in sizes:
        out.append(values[begin : begin + size])
        begin += size
    return out
