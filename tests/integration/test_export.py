"""An exported HF draft on the real embedded model decodes like plain greedy."""

from __future__ import annotations

import pytest

from skipsearch.engine import autoregressive_decode
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.run.export_formats import write_hf
from tests.unit.run.conftest import assisted_greedy, hf_source


def test_hf_export_decodes_like_plain_greedy_on_smollm2(tmp_path, monkeypatch):
    from skipsearch.acceptance.prompts import PromptSpec, encode_prompts
    from skipsearch.models.loading import load_model

    loaded = load_model("smollm2-135m")
    source = hf_source(loaded.num_layers)
    write_hf(source, source.best, tmp_path / "generation_config.json")
    prompt = encode_prompts(PromptSpec(n_prompts=1, max_prompt_tokens=64, new_tokens=16), loaded.tokenizer)[0]
    expected = autoregressive_decode(LayerwiseRunner(loaded.model), prompt.ids, 16).tokens
    assert tuple(assisted_greedy(loaded.model, prompt.ids, 16, tmp_path, monkeypatch)) == expected


@pytest.mark.slow  # gguf's reader parses the 49,152-token vocabulary's arrays each of its four reads
def test_a_draft_gguf_of_smollm2_keeps_its_tokenizer_and_drops_the_layers(tmp_path):
    """The embedded GGUF (Q4_1, tied head) cut to 26 of its 30 layers at Q8_0, read back."""
    import gguf

    from skipsearch.masks import SkipMask
    from skipsearch.models.gguf_draft import read_draft_gguf, source_gguf, write_draft_gguf

    model = source_gguf("smollm2-135m", None)
    mask = SkipMask.from_layers(30, [20, 21, 22, 23])
    out = write_draft_gguf(model, mask, 3, "q8_0", tmp_path / "draft.gguf")
    assert read_draft_gguf(out, 30) == (mask, 3)
    draft, source = gguf.GGUFReader(out), gguf.GGUFReader(model)
    assert draft.fields["llama.block_count"].contents() == 26
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"):
        assert draft.fields[key].contents() == source.fields[key].contents()
    names = {t.name for t in draft.tensors}
    assert "blk.25.ffn_down.weight" in names and "blk.26.attn_q.weight" not in names
