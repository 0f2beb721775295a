"""Prepacked weights (`cpu.packed`): the same bits as `F.linear`, from a weight reordered once."""

from __future__ import annotations

import copy

import pytest
import torch

from skipsearch.cpu.inventory import step_bytes
from skipsearch.cpu.packed import PackedLinear, can_pack, linear_product, pack_linears
from skipsearch.engine import speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

needs_bf16 = pytest.mark.skipif(
    not can_pack(torch.bfloat16, "cpu"), reason="this CPU's oneDNN has no bf16 product to pack for"
)


def bf16_pair(family: str, **overrides) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(plain, packed) copies of one bf16 tiny model."""
    plain = tiny_model(family, **overrides).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) > 0
    return plain, packed


@needs_bf16
@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2's q/k/v carry biases
def test_a_packed_model_gives_the_plain_models_logits_bit_for_bit(family: str) -> None:
    plain, packed = bf16_pair(family)
    ids = torch.randint(3, 61, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(packed(ids).logits, plain(ids).logits)
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())


@needs_bf16
def test_a_packed_products_rows_do_not_depend_on_how_many_rows_it_has() -> None:
    """What keeps a verify of γ+1 positions equal to γ+1 one-position steps."""
    generator = torch.Generator().manual_seed(0)
    product = linear_product(torch.randn(96, 64, generator=generator).bfloat16())
    rows = torch.randn(1, 5, 64, generator=generator).bfloat16()
    assert isinstance(product, PackedLinear)
    together = product(rows)
    one_by_one = torch.cat([product(rows[:, i : i + 1]) for i in range(5)], dim=1)
    assert torch.equal(together, one_by_one)


@needs_bf16
@pytest.mark.parametrize("tied", [True, False])
def test_packing_keeps_a_plain_weight_only_where_it_is_shared(tied: bool) -> None:
    plain, packed = bf16_pair("llama", tie_word_embeddings=tied)
    head = packed.lm_head
    assert isinstance(head, PackedLinear)
    assert (head.plain is packed.model.embed_tokens.weight) == tied and (head.plain is None) != tied
    assert packed.model.layers[0].mlp.down_proj.plain is None
    torch.testing.assert_close(
        packed.model.layers[0].self_attn.k_proj.weight,
        plain.model.layers[0].self_attn.k_proj.weight,
        rtol=0,
        atol=0,
    )
    assert step_bytes(packed) == step_bytes(plain)  # the packed copy is what a step reads instead


def test_only_bf16_on_a_cpu_is_packed() -> None:
    model = tiny_model()
    assert not can_pack(torch.float32, "cpu") and not can_pack(torch.bfloat16, "meta")
    assert pack_linears(model) == 0
    assert type(linear_product(torch.randn(8, 4))) is torch.nn.Linear


def test_force_packs_fp32_weights_for_an_experiment_and_the_products_agree() -> None:
    plain, model = tiny_model(), tiny_model()
    hidden = torch.randn(1, 3, model.config.hidden_size)
    assert pack_linears(model, force=True) > 0
    assert isinstance(model.model.layers[0].mlp.down_proj, PackedLinear)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_embeds=hidden).logits, plain(inputs_embeds=hidden).logits)


@needs_bf16
def test_speculative_decoding_runs_the_same_on_a_packed_model() -> None:
    plain, packed = bf16_pair("llama", layers=6)
    prompt, mask = (5, 9, 14, 3, 22, 40), SkipMask.from_layers(6, [2, 4])
    runs = [speculative_decode(LayerwiseRunner(m), prompt, mask, 16, gamma=3) for m in (plain, packed)]
    assert runs[0].tokens == runs[1].tokens


@needs_bf16
def test_a_draft_head_of_a_packed_model_is_packed_and_gives_the_heads_logits_at_its_ids() -> None:
    _, packed = bf16_pair("llama")
    runner, ids = LayerwiseRunner(packed), [5, 0, 33, 60, 12]
    hidden = torch.randn(1, 2, packed.config.hidden_size).bfloat16()
    head = DraftHead.gather(runner, ids)
    assert isinstance(head.product, PackedLinear)
    assert torch.equal(head(hidden), runner.head(hidden)[..., ids])
