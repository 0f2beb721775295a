"""Tier steps with static shapes, captured as CUDA graphs: one per tier draft step and per verify.

A CUDA graph replays a fixed sequence of kernels on fixed addresses, so a dynamic skip pattern
cannot be one graph; a fixed mask can, and a small set of fixed masks is a small set of graphs
captured up front, the tier picked on the CPU each round (docs/theory.md, "Tier sets and CUDA
graphs"). What has to be static, and how it is made so here:

- shapes: a draft step is always one position; a verify pass over `g + 1` positions gets its own
  graph for every `g` in `0..γ_t` of tier `t` (the last round of a sequence drafts fewer tokens);
- addresses: inputs (token ids, positions, the attention mask, the draft's exact states) live in
  preallocated buffers that are filled before a replay; outputs are the captured tensors, copied
  out before the next replay;
- KV: a `StaticKV` (`engine.shared_kv`), initialised up front, whose per-layer lengths are one device
  vector, so writing K/V at the current length and cropping (clamping it) happen on the device
  and the captured kernels follow them; sliding-window layers (Mistral) get plain static layers,
  which is exact while the cache is no longer than the window;
- the causal mask: `position >= key index`, computed from the positions buffer before a replay,
  for every key slot of the static cache (stale slots beyond the length are never attended).

Batch-size buckets: every buffer has `bucket` rows and a sequence fills all of them with the same
tokens (the engine decodes one sequence; a batched server would capture each bucket it serves).
On a CPU, or with `capture=False`, the very same step functions run eagerly, and say so. After
capture every graph is replayed once against its eager step, so a graph that recorded the wrong
work (a keyword an older transformers swallows, say) fails there instead of decoding wrongly.

Token trees take the same cache, pool and capture (`engine.graphed_tree.TreeGraphSteps`, built on
a `GraphSteps` by `record`): a fixed node budget — the shape's draft rows per depth and its verify
rows — over static buffers, the tree mask filled on the device before a round's replays; eager
on a CPU as these steps are (not yet measured on a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from skipsearch.engine.sampling import Sampling
from skipsearch.engine.shared_kv import StaticKV
from skipsearch.engine.steps import (
    ChainProposal,
    EagerSteps,
    Round,
    RoundSteps,
    divergent_layer,
    draft_forward,
    propose,
    verify_forward,
)
from skipsearch.errors import ConfigError
from skipsearch.kv.patterns import StaticKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import SLIDING, LayerwiseRunner

log = logging.getLogger(__name__)

WARMUP = 3  # eager runs on a side stream before capture: cuBLAS handles, allocator, autotuning
REPLAY_TOLERANCE = 1e-2  # relative: a replay runs the eager kernels, so it agrees to rounding
Outputs = tuple[torch.Tensor, ...]


class GraphReplayError(RuntimeError):
    """A captured graph's replay disagrees with its eager step: a bug, not a device limit."""


def capture(
    run: Callable[[], Any], restore: Callable[[], Any], pool: Any
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`run` captured as a CUDA graph into `pool`, and the outputs it writes at every replay.

    Warm-up runs come first, on a side stream (cuBLAS handles, the allocator, autotuning). Each
    writes K/V and advances the cache lengths, so `restore` puts the lengths back after each, and
    after the capture, which runs nothing but records the advance the graph makes at every replay.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            run()
            restore()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    restore()
    return graph, outputs


def sliding_window_problem(runner: LayerwiseRunner, max_len: int) -> str | None:
    """Why sliding-window layers cannot share plain static layers here, or None when they can.

    Within the window sliding attention is full attention, so a cache that never outgrows the
    window needs no sliding layer (Mistral's window is 4,096 positions).
    """
    if SLIDING not in runner.layer_types:
        return None
    window = int(runner.config.sliding_window)
    if max_len <= window:
        return None
    return (
        f"the static cache needs {max_len} positions but sliding-window layers attend to {window}: "
        f"decode at most {window} positions (prompt + new tokens + gamma + 1) for CUDA graphs"
    )


class GraphSteps:
    """Draft and verify passes of every tier over static buffers, replayed from CUDA graphs.

    `max_len` bounds prompt + output + one round's drafts (the static cache's size). Construction
    captures `K` draft graphs and `Σ_t (γ_t + 1)` verify graphs, all in one memory pool. `heads[t]`
    is tier `t`'s draft head, multiplied inside its draft graph (None: the full LM head).
    """

    def __init__(
        self,
        runner: LayerwiseRunner,
        masks: Sequence[SkipMask],
        gammas: Sequence[int],
        max_len: int,
        bucket: int = 1,
        capture: bool | None = None,
        heads: Sequence[DraftHead | None] | None = None,
        kvs: Sequence[KVPattern | None] | None = None,
    ) -> None:
        problem = sliding_window_problem(runner, max_len)
        if problem:
            raise ConfigError(problem)
        self.runner, self.masks, self.max_len = runner, tuple(masks), max_len
        self.heads = tuple(heads) if heads is not None else (None,) * len(self.masks)
        self.kvs = tuple(kvs) if kvs is not None else (None,) * len(self.masks)
        if any(kv is not None and kv.pillars for kv in self.kvs):
            raise ConfigError(
                "a KV pattern with pillars is not captured as CUDA graphs (each verify chooses the next "
                "round's pillars): drop its k, or decode it eagerly"
            )
        self.s1 = tuple(divergent_layer(mask, kv) for mask, kv in zip(self.masks, self.kvs, strict=True))
        for mask in self.masks:
            runner.prepare(mask)  # before any capture: the copies' addresses must not move after it
        gamma = max(gammas)
        self.capture = runner.device.type == "cuda" if capture is None else capture
        if self.capture and runner.device.type != "cuda":
            raise ConfigError(f"CUDA graphs need a CUDA device, the model is on {runner.device}")
        self.mode = f"cuda-graphs (bucket {bucket})" if self.capture else "static-eager"
        config, device = runner.config, runner.device
        self.cache = StaticKV(config, max_len, bucket, self.dtype, device)
        self.slots = torch.arange(max_len, device=device)
        long = {"dtype": torch.long, "device": device}
        self.token = torch.zeros(bucket, 1, **long)
        self.position = torch.zeros(1, 1, **long)
        self.step_mask = torch.zeros(1, 1, 1, max_len, dtype=torch.bool, device=device)
        self.positions = torch.zeros(1, gamma + 1, **long)
        self.block_mask = torch.zeros(1, 1, gamma + 1, max_len, dtype=torch.bool, device=device)
        self.exact = torch.zeros(bucket, max(gamma, 1), config.hidden_size, dtype=self.dtype, device=device)
        self._at(self.position, self.step_mask[0, 0], 0)  # inputs a capture-time run can attend with
        self._at(self.positions, self.block_mask[0, 0], 0)
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        tiers = range(len(self.masks))
        with torch.no_grad():  # a captured graph must not record autograd state
            self.drafts = [self.record(self._draft_step(t)) for t in tiers]
            self.verifies = {
                (t, g): self.record(self._verify_step(t, g)) for t in tiers for g in range(gammas[t] + 1)
            }
        if self.capture:
            log.info("captured %d draft and %d verify CUDA graphs", len(self.drafts), len(self.verifies))

    @property
    def dtype(self) -> torch.dtype:
        """The model's hidden-state dtype, which the exact-state buffer must share."""
        return self.runner.decoder.embed_tokens.weight.dtype

    # -- the captured passes ------------------------------------------------------------------
    def _draft_step(self, tier: int) -> Callable[[], Outputs]:
        """One draft position of `tier` (`steps.draft_forward`): (its exact state at `s1`, logits);
        under a KV pattern its attention reads the sink and the window gathered from the device-held
        position into buffers of fixed size (`kv.patterns.StaticKeys`)."""
        runner, mask, head, pattern = self.runner, self.masks[tier], self.heads[tier], self.kvs[tier]
        kv = None if pattern is None else StaticKeys(pattern, self.position)

        def step() -> Outputs:
            hidden, logits = draft_forward(
                runner, mask, self.token, self.position, self.cache, head, self.step_mask, kv
            )
            return hidden, logits[:, -1]

        return step

    def _verify_step(self, tier: int, gamma: int) -> Callable[[], Outputs]:
        """The full model over `gamma + 1` positions, reusing the draft's exact prefix
        (`steps.verify_forward`; under a KV pattern there is none but the embedding)."""
        runner, mask, pattern = self.runner, self.masks[tier], self.kvs[tier]
        positions, block_mask = self.positions[:, : gamma + 1], self.block_mask[:, :, : gamma + 1]

        def step() -> Outputs:
            exact = self.exact[:, :gamma]
            return (
                verify_forward(runner, mask, exact, self.token, positions, self.cache, block_mask, pattern),
            )

        return step

    def record(self, step: Callable[[], Outputs]) -> Callable[[], Outputs]:
        """`step` itself when eager; else a replay of its captured graph.

        Warm-up runs write K/V and advance the cache lengths; the lengths are restored after each,
        and what they wrote lies beyond the length, where nothing attends before it is rewritten.
        """
        if not self.capture:
            return step
        lengths = self.cache.lengths.clone()
        graph, outputs = capture(step, lambda: self.cache.lengths.copy_(lengths), self.pool)

        def replay() -> Outputs:
            graph.replay()
            return outputs

        self._check_replay(step, replay, lengths)
        return replay

    def _check_replay(
        self, step: Callable[[], Outputs], replay: Callable[[], Outputs], lengths: torch.Tensor
    ) -> None:
        """Raise GraphReplayError unless one replay gives what the eager step gives."""
        eager = [out.clone() for out in step()]
        self.cache.lengths.copy_(lengths)
        replayed = replay()
        self.cache.lengths.copy_(lengths)
        for expected, got in zip(eager, replayed, strict=True):
            scale = float(expected.float().abs().max()) or 1.0
            error = float((expected.float() - got.float()).abs().max())
            if not error <= REPLAY_TOLERANCE * scale:  # `not <=` also catches NaN
                raise GraphReplayError(
                    f"a CUDA graph's replay differs from its eager step by {error:.3g} (scale {scale:.3g}): "
                    "the capture recorded other work than the step; run with capture=False to compare"
                )

    # -- filling the inputs -------------------------------------------------------------------
    def _at(self, positions: torch.Tensor, mask: torch.Tensor, start: int) -> None:
        positions.copy_(torch.arange(start, start + positions.shape[1], device=positions.device)[None])
        mask.copy_(self.slots <= positions[0, :, None])

    def check_room(self, end: int) -> None:
        """Refuse a sequence of `end` positions that the static cache cannot hold."""
        if end > self.max_len:
            raise ConfigError(
                f"sequence needs {end} cache slots but the static cache holds {self.max_len}: "
                "build GraphSteps with a larger max_len (prompt + new tokens + gamma + 1)"
            )

    # -- one full step, advanced on the device (`engine.graphed_decode`) ---------------------
    def point_full_step(self, token: int, position: int) -> None:
        """Set the γ = 0 verify's inputs — one position — to `token` at `position`."""
        self.token.fill_(token)
        self._at(self.positions[:, :1], self.block_mask[0, 0, :1], position)

    def full_step(self) -> torch.Tensor:
        """The full model over the pointed position (the γ = 0 verify of mask 0, which is the whole
        model whatever the mask): logits `[1, V]`, the captured tensor, valid until the next replay."""
        (logits,) = self.verifies[(0, 0)]()
        return logits

    def advance_full_step(self, token: torch.Tensor) -> None:
        """Feed `token` (a device scalar) at the next position, without reading anything back: the
        position and its mask row move on the device, where the captured kernels read them."""
        self.token.copy_(token.expand_as(self.token))
        self.positions[:, :1] += 1
        self.block_mask[0, 0, :1].copy_(self.slots <= self.positions[0, :1, None])

    # -- RoundSteps ----------------------------------------------------------------------------
    def prefill(self, prompt: Sequence[int]) -> StaticKV:
        """Reset the cache in place (the graphs hold its addresses) and run the prompt eagerly."""
        self.check_room(len(prompt) + 1)
        self.cache.reset()
        if len(prompt) > 1:
            runner = self.runner
            count = len(prompt) - 1
            ids = torch.tensor([list(prompt[:-1])], device=runner.device).expand(self.token.shape[0], -1)
            positions = torch.arange(count, device=runner.device)[None]
            mask = (self.slots <= positions[0, :, None])[None, None]
            runner.run_layers(
                runner.embed(ids), 0, runner.num_layers, positions, cache=self.cache, attention_mask=mask
            )
        return self.cache

    def draft(self, at: Round, sampling: Sampling, generator: torch.Generator | None) -> ChainProposal:
        """γ replays of the tier's draft graph; tokens are chosen outside the graph."""
        start, gamma = at.start, at.gamma
        self.check_room(start + gamma + 1)
        device = self.runner.device
        tokens = torch.empty(gamma, dtype=torch.long, device=device)
        probs = None if sampling.greedy else torch.empty(gamma, self.runner.config.vocab_size, device=device)
        exact: list[torch.Tensor] = []
        self.token.copy_(at.pending.expand_as(self.token))
        for step in range(gamma):
            self._at(self.position, self.step_mask[0, 0], start + step)
            hidden, logits = self.drafts[at.tier]()
            exact.append(hidden[:1].clone())
            tokens[step], q = propose(logits[0], sampling, generator, self.heads[at.tier])
            if probs is not None:
                probs[step] = q
            self.token.copy_(tokens[step].expand_as(self.token))
        return ChainProposal(tokens, probs, exact)

    def verify(self, at: Round, proposal: ChainProposal) -> torch.Tensor:
        """One replay of the tier's verify graph for this draft length: logits `[γ + 1, V]`."""
        gamma = len(proposal.tokens)
        last = proposal.tokens[-1:].view(1, 1) if gamma else at.pending
        self.token.copy_(last.expand_as(self.token))
        if gamma:
            self.exact[:, :gamma].copy_(torch.cat(proposal.exact, dim=1).expand(self.exact.shape[0], -1, -1))
        self._at(self.positions[:, : gamma + 1], self.block_mask[0, 0, : gamma + 1], at.start)
        (logits,) = self.verifies[(at.tier, gamma)]()
        return logits.clone()


def make_steps(
    runner: LayerwiseRunner,
    masks: Sequence[SkipMask],
    gammas: Sequence[int],
    max_len: int,
    bucket: int = 1,
    require_graphs: bool = False,
    heads: Sequence[DraftHead | None] | None = None,
) -> tuple[RoundSteps, str | None]:
    """CUDA graphs where they can run, else eager steps and the reason why not.

    Only a reason known before capture (no CUDA device, a cache longer than a sliding window)
    falls back to eager; with `require_graphs` it is an error instead. Anything that fails during
    capture — out of memory, a CUDA error, a replay that disagrees with eager — propagates: an
    eager fallback would hide it and time the wrong engine.
    """
    reason = (
        "no CUDA device: CUDA graphs are captured only on a GPU"
        if runner.device.type != "cuda"
        else sliding_window_problem(runner, max_len)
    )
    if reason is None:
        return GraphSteps(runner, masks, gammas, max_len, bucket, heads=heads), None
    if require_graphs:
        raise ConfigError(f"--require-graphs, but the tier steps cannot be CUDA graphs: {reason}")
    log.warning("tier steps run eagerly, without CUDA graphs: %s", reason)
    return EagerSteps(runner, masks, heads), reason
