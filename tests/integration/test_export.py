"""An exported HF draft on the real embedded model decodes like plain greedy."""

from __future__ import annotations

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
