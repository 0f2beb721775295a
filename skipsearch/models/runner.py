"""Layer-wise execution of a decoder with a SkipMask, built from transformers' own modules.

The runner calls each decoder layer's own sub-modules (input norm, self-attention, post-attention
norm, MLP) so that attention and MLP can be skipped independently — a skipped sub-layer lets the
residual stream pass through — and so that execution can start at any layer from given hidden
states. No model math is re-implemented: with an empty mask the logits equal `model(...)`.

A sub-layer the mask runs at lower precision (`SkipMask.attn_bits`, `mlp_bits`) runs the layer's own
module with its projections swapped for their int8 or int4 copies (`models.draft_weights`), through
the modules' path; a sub-layer at full precision keeps the fused path where the plan has one
(`fused_at`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from skipsearch.cpu.fused_layers import fused_layer
from skipsearch.errors import ConfigError
from skipsearch.kv.patterns import KV_PATTERN_KEYWORD, OWN_MASK_KEYWORD
from skipsearch.kv.pillars import PILLAR_KEYWORD, PillarChoice, PillarKeys
from skipsearch.kv.tree_keys import TreeKeys
from skipsearch.masks import FULL_BITS, KVPattern, SkipMask
from skipsearch.models.attention import supports_kv_patterns
from skipsearch.models.compat import check_architecture, check_installed_transformers
from skipsearch.models.draft_weights import ATTN, MLP, DraftWeights, draft_weights_of
from skipsearch.models.kernels import new_cache

SLIDING = "sliding_attention"


def layer_types(config: Any) -> list[str]:
    """Attention type of every layer: Qwen2 lists them; Mistral slides everywhere when windowed."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    windowed = getattr(config, "sliding_window", None) is not None and config.model_type == "mistral"
    return [SLIDING if windowed else "full_attention"] * config.num_hidden_layers


class LayerwiseRunner:
    """Runs layers `[start, end)` of a Llama-family decoder under a SkipMask, with or without a cache."""

    def __init__(self, model: Any) -> None:
        check_installed_transformers()
        check_architecture(model.config)
        self.model = model
        self.config = model.config
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.fused = [fused_layer(block) for block in self.layers]  # `cpu.fused_layers`, where loaded so
        self.num_layers = len(self.layers)
        self.layer_types = layer_types(model.config)

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    @property
    def draft_weights(self) -> DraftWeights:
        """The int8 / int4 copies of the model's projections a lower-precision draft reads, shared by
        every runner of the model (`models.draft_weights`)."""
        return draft_weights_of(self.model)

    def prepare(self, mask: SkipMask) -> None:
        """Load the lower-precision weights `mask` reads, before a decode or an evaluation, refusing
        in one line those that would not fit in memory; a mask at full precision loads nothing."""
        if mask.quantized:
            self.draft_weights.prepare(mask)

    def prepare_every_layer(self, bits: int) -> SkipMask:
        """The draft that reads every layer's weights at `bits`, its copies loaded (quantized, or read
        from their cache file; a ConfigError where they would not fit) and each sub-layer's fused path
        built, so that neither is paid for inside a timed pass or a trial."""
        mask = SkipMask.parse(f"w{bits}:0-{self.num_layers - 1}", self.num_layers)
        self.prepare(mask)
        for layer in range(self.num_layers):
            for kind in (ATTN, MLP):
                self.fused_at(layer, bits, kind)
        return mask

    def fused_at(self, layer: int, bits: int = FULL_BITS, kind: str = ATTN) -> Any:
        """The fused path of `layer`'s attention (`kind` `ATTN`) or MLP at `bits` (`cpu.fused_layers`):
        the layer's own at full precision, the draft's copies in the fused driver at 8 or 4 bits
        (`DraftWeights.fused`); None where there is none, and the modules run it."""
        if bits == FULL_BITS:
            return self.fused[layer]
        return self.draft_weights.fused(layer, kind, bits) if self.fused[layer] is not None else None

    def new_cache(self) -> Any:
        """An empty KV cache on the model's kernel plan (fp32 K/V beside fp32 attention)."""
        return new_cache(self.config)

    # -- pieces -------------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: logits over the vocabulary."""
        return self.model.lm_head(self.decoder.norm(hidden))

    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.decoder.rotary_emb(hidden, position_ids)

    def causal_mask(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, cache: Any, layer: int
    ) -> torch.Tensor | None:
        """The model's own causal (or sliding-window) mask, sized against this layer's cache."""
        build = (
            create_sliding_window_causal_mask if self.layer_types[layer] == SLIDING else create_causal_mask
        )
        return build(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=cache,
            position_ids=position_ids,
            layer_idx=layer if cache is not None else None,
        )

    def attention(
        self,
        layer: int,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Any = None,
        kv: KVPattern | PillarKeys | None = None,
        pillars: PillarChoice | None = None,
        own_mask: bool = False,
        tree: TreeKeys | None = None,
        bits: int = FULL_BITS,
    ) -> torch.Tensor:
        """Residual + self-attention sub-layer (writes this layer's K/V into `cache` if given),
        attending only to the keys of `kv` when given (`kv.patterns`); `pillars`, when
        given, records the layer's choice of pillars (`kv.pillars`). `own_mask` says that
        `attention_mask` is the caller's, not the causal one (`OWN_MASK_KEYWORD`). A short block
        runs the layer's fused path where it has one (`cpu.fused_layers`; the causal mask is
        then not read). `tree`, a token tree's pass (`kv.tree_keys`): the fused path where it takes
        the tree, else the modules over its dense mask, which holds `kv`'s sink and window. `bits`:
        the precision of its projections (`FULL_BITS`, or 8 / 4: the draft's copies)."""
        fused = self.fused_at(layer, bits)
        if tree is not None:
            if fused is not None and fused.takes(hidden, cache, pillars, tree):
                return fused.attention(hidden, position_embeddings, cache, kv, pillars, tree)
            attention_mask, kv, own_mask = tree.dense, None, True
        elif not own_mask and self._fused_attention(layer, hidden, cache, pillars, bits):
            return fused.attention(hidden, position_embeddings, cache, kv, pillars)
        block = self.layers[layer]
        attention = block.self_attn if bits == FULL_BITS else self.draft_weights.self_attn(layer, bits)
        extra: dict[str, Any] = {} if kv is None else {KV_PATTERN_KEYWORD: kv}
        if pillars is not None:
            extra[PILLAR_KEYWORD] = pillars
        if own_mask:
            extra[OWN_MASK_KEYWORD] = True
        out, _ = attention(
            hidden_states=block.input_layernorm(hidden),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            **extra,
        )
        return hidden + out

    def _fused_attention(
        self,
        layer: int,
        hidden: torch.Tensor,
        cache: Any,
        pillars: PillarChoice | None,
        bits: int = FULL_BITS,
    ) -> bool:
        """Whether this layer's attention over `hidden` at `bits` runs fused (`cpu.fused_layers`)."""
        fused = self.fused_at(layer, bits)
        return fused is not None and fused.takes(hidden, cache, pillars)

    def mlp(self, layer: int, hidden: torch.Tensor, bits: int = FULL_BITS) -> torch.Tensor:
        """Residual + MLP sub-layer (fused for a short block where the layer has a fused path), its
        projections at `bits` (`FULL_BITS`, or 8 / 4: the draft's copies)."""
        fused = self.fused_at(layer, bits, MLP)
        if fused is not None and fused.takes_rows(hidden):
            return fused.mlp(hidden)
        block = self.layers[layer]
        mlp = block.mlp if bits == FULL_BITS else self.draft_weights.mlp(layer, bits)
        return hidden + mlp(block.post_attention_layernorm(hidden))

    # -- composition --------------------------------------------------------------------------
    @torch.no_grad()
    def run_layers(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        position_ids: torch.Tensor,
        mask: SkipMask | None = None,
        cache: Any = None,
        attention_mask: torch.Tensor | Sequence[torch.Tensor] | TreeKeys | None = None,
        collect: list[torch.Tensor] | None = None,
        kv: KVPattern | PillarKeys | None = None,
        pillars: PillarChoice | None = None,
    ) -> torch.Tensor:
        """Run layers `[start, end)` from `hidden` (the input of layer `start`), their attention
        over the keys of `kv` when given (a KV-pattern draft, its round's pillars with it), each
        sub-layer skipped or at the precision `mask` gives it (None: the full model).

        `attention_mask` overrides the model's causal mask for every layer (the shared-KV
        estimator needs its own), or per layer when a sequence indexed by layer (the estimator's
        pillars differ by layer); otherwise it is built per layer from that layer's cache
        length, since a draft that skips attention leaves some layers' caches shorter.
        A `TreeKeys` is a token tree's pass (`kv.tree_keys`), its rows' ancestors for every layer.
        `collect`, when given, receives the input of every layer run and finally the output;
        `pillars`, the pillars each layer's attention chooses (`kv.pillars`).
        """
        if (kv is not None or pillars is not None) and not supports_kv_patterns(self.config):
            raise ConfigError(
                "a KV-pattern draft needs the kernel plan's attention, not "
                f"{self.config._attn_implementation!r}: load the model with load_model (or apply_attention)"
            )
        position_embeddings = self.rotary(hidden, position_ids)
        tree = attention_mask if isinstance(attention_mask, TreeKeys) else None
        if tree is not None:
            attention_mask = None
        masks: dict[tuple[str, int], torch.Tensor | None] = {}
        for layer in range(start, end):
            if collect is not None:
                collect.append(hidden)
            bits = FULL_BITS if mask is None else mask.attn_bits(layer)
            if bits:
                layer_mask = attention_mask
                if layer_mask is not None and not isinstance(layer_mask, torch.Tensor):
                    layer_mask = layer_mask[layer]
                if (
                    layer_mask is None
                    and tree is None
                    and not self._fused_attention(layer, hidden, cache, pillars, bits)
                ):
                    seen = cache.layers[layer].get_seq_length() if cache is not None else 0
                    key = (self.layer_types[layer], seen)
                    if key not in masks:
                        masks[key] = self.causal_mask(hidden, position_ids, cache, layer)
                    layer_mask = masks[key]
                hidden = self.attention(
                    layer,
                    hidden,
                    position_embeddings,
                    layer_mask,
                    cache,
                    kv,
                    pillars,
                    attention_mask is not None,
                    tree,
                    bits,
                )
            bits = FULL_BITS if mask is None else mask.mlp_bits(layer)
            if bits:
                hidden = self.mlp(layer, hidden, bits)
        if collect is not None:
            collect.append(hidden)
        return hidden

    @torch.no_grad()
    def prefill(self, prompt: Sequence[int]) -> Any:
        """A cache holding the prompt's K/V except its last token's, which the first step feeds
        (the engine's invariant, `engine.shared_kv`). Sliding-window layers record their past so
        rollback can restore states beyond the window."""
        cache = self.new_cache()
        if len(prompt) > 1:
            ids = torch.tensor([list(prompt[:-1])], device=self.device)
            positions = torch.arange(ids.shape[1], device=self.device)[None]
            self.run_layers(self.embed(ids), 0, self.num_layers, positions, cache=cache)
        cache.activate_past_recording()
        return cache

    @torch.no_grad()
    def step(self, token: int, position: int, cache: Any) -> torch.Tensor:
        """Logits `[V]` of the full model for one token at `position`, appending its K/V to `cache`:
        the one-position pass of autoregressive decoding."""
        ids = torch.tensor([[token]], device=self.device)
        positions = torch.tensor([[position]], device=self.device)
        hidden = self.run_layers(self.embed(ids), 0, self.num_layers, positions, cache=cache)
        return self.head(hidden)[0, -1]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        mask: SkipMask | None = None,
        cache: Any = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the (masked) model for `input_ids`, continuing `cache` if given."""
        if position_ids is None:
            offset = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(offset, offset + input_ids.shape[1], device=input_ids.device)[None]
        hidden = self.run_layers(self.embed(input_ids), 0, self.num_layers, position_ids, mask, cache)
        return self.head(hidden)
