"""ReferenceCache: what the target model does on the prompt set, computed once (docs/theory.md,
"Measuring acceptance").

Built once per (model, prompt set): the target's greedy continuation of every prompt and the
full model's hidden state at the input of every layer (plus every layer's K/V for `shared-kv`),
stored on disk so every mask evaluation, in this process or on a Ray worker, starts from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from skipsearch.acceptance.prompts import EncodedPrompt
from skipsearch.models.loading import eos_ids
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.progress import progress_bar
from skipsearch.store import atomic_path

log = logging.getLogger(__name__)

CACHE_FORMAT = 3  # 3: continuations decoded as the engine's baseline decodes (was a batched generate)
FORWARD_BATCH = 8


@dataclass
class ReferenceCache:
    """Full-model teacher-forcing data for one prompt set.

    `input_ids` is right-padded `[B, T]`; `hidden[l]` is the input of layer `l` (`hidden[L]`
    the final pre-norm state) `[L + 1, B, T, d]`; `keys` / `values` are the post-RoPE K/V of
    every layer `[L, B, H_kv, T, D]` (only for `shared-kv`).
    """

    input_ids: torch.Tensor
    prompt_lengths: torch.Tensor
    lengths: torch.Tensor
    hidden: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def num_layers(self) -> int:
        return self.hidden.shape[0] - 1

    def prediction_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, position) of every position whose next token is a continuation token."""
        rows, cols = [], []
        for row, (start, end) in enumerate(
            zip(self.prompt_lengths.tolist(), self.lengths.tolist(), strict=True)
        ):
            cols.append(torch.arange(start - 1, end - 1))
            rows.append(torch.full((end - start,), row))
        return torch.cat(rows), torch.cat(cols)

    def row_sizes(self) -> list[int]:
        return (self.lengths - self.prompt_lengths).tolist()

    def continuations(self) -> list[tuple[int, ...]]:
        """Each row's teacher-forced continuation: the text the estimator scores, which the engine's
        output equals up to its first near-tie flip (`validate.replay.shared_length`)."""
        return [
            tuple(ids[start:end].tolist())
            for ids, start, end in zip(
                self.input_ids, self.prompt_lengths.tolist(), self.lengths.tolist(), strict=True
            )
        ]

    def save(self, path: Path, meta: dict) -> None:
        tensors = {
            "input_ids": self.input_ids,
            "prompt_lengths": self.prompt_lengths,
            "lengths": self.lengths,
            "hidden": self.hidden,
        }
        if self.keys is not None and self.values is not None:
            tensors |= {"keys": self.keys, "values": self.values}
        with atomic_path(path) as staging:  # a save that fails part-way leaves no file of gigabytes
            save_file(
                {k: v.contiguous() for k, v in tensors.items()},
                str(staging),
                metadata={"meta": json.dumps(meta)},
            )

    @classmethod
    def load(cls, path: Path, device: torch.device, with_kv: bool = True) -> ReferenceCache:
        """Read the cache onto `device`; without `with_kv` its K/V (0.7 GiB at 7B) stay on disk."""
        wanted = (
            "input_ids",
            "prompt_lengths",
            "lengths",
            "hidden",
            *(("keys", "values") if with_kv else ()),
        )
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            tensors = {name: handle.get_tensor(name) for name in wanted if name in handle.keys()}  # noqa: SIM118
        return cls(**tensors)


@torch.no_grad()
def greedy_continuations(
    runner: LayerwiseRunner, prompts: Sequence[EncodedPrompt], new_tokens: int
) -> list[list[int]]:
    """The target's greedy continuation of each prompt (stopping after EOS), decoded one sequence
    and one position at a time on the model's kernel plan (`runner.prefill`, `runner.step`),
    exactly as the engine's autoregressive baseline decodes it. A batched, left-padded `generate`
    runs other kernels: in bf16 they flip near-ties, and the estimator would then teacher-force a
    sequence the engine never produces (4 of 6 fidelity prompts parted that way)."""
    stop = eos_ids(runner.model)
    continuations: list[list[int]] = []
    with progress_bar("reference: greedy continuations", len(prompts)) as bar:
        for prompt in prompts:
            cache, tokens, new = runner.prefill(prompt.ids), list(prompt.ids), []
            while len(new) < new_tokens and not (new and new[-1] in stop):
                new.append(int(runner.step(tokens[-1], len(tokens) - 1, cache).argmax()))
                tokens.append(new[-1])
            continuations.append(new)
            bar.advance(bar.task_ids[0])
    return continuations


@torch.no_grad()
def build_reference(
    runner: LayerwiseRunner, prompts: Sequence[EncodedPrompt], new_tokens: int, with_kv: bool
) -> ReferenceCache:
    """Greedy continuations, then one teacher-forced full forward collecting per-layer states."""
    continuations = greedy_continuations(runner, prompts, new_tokens)
    # Rows sorted by length let each forward chunk trim its padding.
    pairs = sorted(zip(prompts, continuations, strict=True), key=lambda pair: len(pair[0].ids) + len(pair[1]))
    prompts = [p for p, _ in pairs]
    sequences = [list(p.ids) + c for p, c in pairs]
    width = max(len(s) for s in sequences)
    input_ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences], device=runner.device)
    position_ids = torch.arange(width, device=runner.device)[None]
    hidden_parts, key_parts, value_parts = [], [], []
    with progress_bar("reference: full-model states", len(sequences)) as bar:
        for start in range(0, len(sequences), FORWARD_BATCH):
            chunk = input_ids[start : start + FORWARD_BATCH]
            states: list[torch.Tensor] = []
            cache = runner.new_cache() if with_kv else None
            runner.run_layers(
                runner.embed(chunk), 0, runner.num_layers, position_ids, cache=cache, collect=states
            )
            hidden_parts.append(torch.stack(states))
            if cache is not None:  # stored in the model's dtype: an fp32 cache only upcast them (exact)
                dtype = states[0].dtype
                key_parts.append(torch.stack([layer.keys.to(dtype) for layer in cache.layers]))
                value_parts.append(torch.stack([layer.values.to(dtype) for layer in cache.layers]))
            bar.advance(bar.task_ids[0], len(chunk))
    return ReferenceCache(
        input_ids=input_ids,
        prompt_lengths=torch.tensor([len(p.ids) for p in prompts], device=runner.device),
        lengths=torch.tensor([len(s) for s in sequences], device=runner.device),
        hidden=torch.cat(hidden_parts, dim=1),
        keys=torch.cat(key_parts, dim=1) if with_kv else None,
        values=torch.cat(value_parts, dim=1) if with_kv else None,
    )


def reference_key(model_source: str, dtype: str, prompt_key: str, with_kv: bool) -> str:
    text = json.dumps([CACHE_FORMAT, model_source, dtype, prompt_key, with_kv])
    return hashlib.sha256(text.encode()).hexdigest()[:24]
