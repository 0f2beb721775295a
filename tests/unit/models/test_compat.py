"""The transformers version guard: the runner's keyword API is checked, and a mismatch is one line."""

import pytest

from skipsearch.errors import ModelLoadError
from skipsearch.models.compat import api_problems, check_installed_transformers, check_transformers


def mask_5_24(config, inputs_embeds, attention_mask, cache, position_ids=None): ...


def mask_5_17(config, inputs_embeds, attention_mask, past_key_values, position_ids=None): ...


def attention_5_24(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kw): ...


def attention_5_17(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kw): ...


class LayerWithLength:
    def __init__(self, max_cache_len: int) -> None:
        self.cumulative_length = 0


class LayerWithoutLength:
    def __init__(self, max_cache_len: int) -> None:
        self.max_cache_len = max_cache_len


def test_the_installed_transformers_passes() -> None:
    from transformers.cache_utils import StaticLayer
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaAttention

    assert api_problems(create_causal_mask, LlamaAttention.forward, StaticLayer) == []
    check_installed_transformers()  # and the guard on them does not raise


def test_the_installed_check_reads_the_installed_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the installed mask function replaced by the 5.17 one, the check on the installed package fails."""
    monkeypatch.setattr("transformers.masking_utils.create_causal_mask", mask_5_17)
    check_installed_transformers.cache_clear()  # an earlier test's pass is cached for the process
    with pytest.raises(ModelLoadError, match="create_causal_mask takes no `cache`"):
        check_installed_transformers()


def test_the_api_of_the_pin_has_no_problems() -> None:
    assert api_problems(mask_5_24, attention_5_24, LayerWithLength) == []


def test_the_5_17_api_is_refused_in_one_line_that_names_the_fix() -> None:
    with pytest.raises(ModelLoadError) as caught:
        check_transformers("5.17.0", mask_5_17, attention_5_17, LayerWithoutLength)
    message = str(caught.value)
    assert "\n" not in message
    assert "transformers 5.17.0 is not supported" in message
    assert "create_causal_mask takes no `cache`" in message
    assert "StaticLayer keeps no cumulative_length" in message
    assert "transformers==5.24.0" in message


def test_each_missing_piece_is_named() -> None:
    assert api_problems(mask_5_24, attention_5_17, LayerWithLength) == [
        "LlamaAttention.forward takes no `cache` argument"
    ]
