"""`models.gguf_draft`: a draft cut from a tiny llama GGUF reads back with the layers, names and types
meant; sub-layer drafts are refused; a failed write leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from skipsearch.errors import ConfigError, SkipsearchError
from skipsearch.masks import SkipMask
from skipsearch.models import gguf_draft
from skipsearch.models.gguf_draft import read_draft_gguf, whole_layer_refusal, write_draft_gguf
from tests.conftest import tiny_gguf

Q = gguf.GGMLQuantizationType
LAYERS = 8


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", layers=LAYERS)


def tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def values(tensor: gguf.ReaderTensor) -> np.ndarray:
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_a_dropped_layer_leaves_contiguous_blocks_at_the_type_asked(source, tmp_path, kind):
    mask = SkipMask.from_layers(LAYERS, [3])
    out = write_draft_gguf(source, mask, 4, kind, tmp_path / "draft.gguf")
    reader = gguf.GGUFReader(out)
    assert reader.fields["llama.block_count"].contents() == LAYERS - 1
    assert reader.fields[gguf_draft.KEY_LAYERS].contents() == [0, 1, 2, 4, 5, 6, 7]
    written, original = tensors(out), tensors(source)
    blocks = {int(name.split(".")[1]) for name in written if name.startswith("blk.")}
    assert blocks == set(range(LAYERS - 1))
    assert len(written) == len(original) - len([n for n in original if n.startswith("blk.3.")])
    for name, tensor in written.items():
        if name.startswith("blk."):
            assert tensor.tensor_type == (Q.F32 if len(tensor.shape) == 1 else Q[kind.upper()]), name
    # token embeddings byte for byte; the tokenizer's metadata; block 3 is the source's layer 4
    assert written["token_embd.weight"].tensor_type == Q.Q8_0
    assert np.array_equal(written["token_embd.weight"].data, original["token_embd.weight"].data)
    assert reader.fields["tokenizer.ggml.tokens"].contents() == [f"t{i}" for i in range(40)]
    moved, kept = values(written["blk.3.ffn_up.weight"]), values(original["blk.4.ffn_up.weight"])
    other = values(original["blk.3.ffn_up.weight"])
    tolerance = 0.05 if kind == "q8_0" else 0.5
    assert np.abs(moved - kept).mean() < tolerance < np.abs(moved - other).mean()
    assert np.array_equal(values(written["blk.3.attn_q.bias"]), values(original["blk.4.attn_q.bias"]))
    assert read_draft_gguf(out, LAYERS) == (mask, 4)
    assert reader.fields["general.file_type"].contents() == int(
        gguf.LlamaFileType.MOSTLY_Q8_0 if kind == "q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0
    )


def test_by_default_each_sub_layer_is_at_the_drafts_precision(source, tmp_path):
    mask = SkipMask.parse("a:7|m:7|w8:0-1|w4a:2|w4m:3", LAYERS)
    out = write_draft_gguf(source, mask, 3, "auto", tmp_path / "draft.gguf")
    written, original = tensors(out), tensors(source)
    assert [written[f"blk.{i}.attn_q.weight"].tensor_type for i in range(LAYERS - 1)] == [
        Q.Q8_0, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_1, Q.Q4_1, Q.Q4_1,
    ]  # fmt: skip
    mlp = [written[f"blk.{i}.ffn_down.weight"].tensor_type for i in range(4)]
    assert mlp == [Q.Q8_0, Q.Q8_0, Q.Q4_1, Q.Q4_0]
    # the model's own precision: the source's bytes unchanged
    assert np.array_equal(written["blk.5.ffn_up.weight"].data, original["blk.5.ffn_up.weight"].data)
    assert "blk.7.attn_q.weight" not in written
    assert read_draft_gguf(out, LAYERS) == (mask, 3)


def test_a_sub_layer_skipped_alone_is_refused_naming_it():
    assert whole_layer_refusal(SkipMask.from_layers(LAYERS, [2, 5])) is None
    why = whole_layer_refusal(SkipMask.parse("a:2,4|m:4,6", LAYERS))
    assert why is not None and "\n" not in why
    assert "the attention of layer 2, the MLP of layer 6 alone" in why and "--format skipsearch" in why


def test_a_file_that_reads_back_wrong_is_an_error_and_leaves_nothing(source, tmp_path, monkeypatch):
    real = gguf_draft._add_tensor

    def wrong_type(writer, item):  # one matrix written at another type than planned
        if item.name == "blk.2.ffn_up.weight":
            item = gguf_draft.PlannedTensor(item.name, item.source, Q.Q8_0)
        real(writer, item)

    monkeypatch.setattr(gguf_draft, "_add_tensor", wrong_type)
    with pytest.raises(SkipsearchError, match=r"reads back wrong.*blk\.2\.ffn_up\.weight"):
        write_draft_gguf(source, SkipMask.from_layers(LAYERS, [6]), 3, "q4_0", tmp_path / "draft.gguf")
    assert list(tmp_path.iterdir()) == []


def test_a_mask_for_another_depth_is_refused_before_writing(source, tmp_path):
    with pytest.raises(SkipsearchError, match="for 12 layers but the model has 8"):
        write_draft_gguf(source, SkipMask.from_layers(12, [3]), 3, "q8_0", tmp_path / "draft.gguf")
    assert list(tmp_path.iterdir()) == []


def test_reading_back_checks_the_tensors_against_the_recorded_mask(source, tmp_path, monkeypatch):
    out = write_draft_gguf(source, SkipMask.from_layers(LAYERS, [3]), 4, "q4_0", tmp_path / "draft.gguf")
    with pytest.raises(ConfigError, match="disagree with mask"):
        read_draft_gguf(out, LAYERS + 2)  # its blocks name other layers of a deeper model
    monkeypatch.setattr(gguf_draft, "weight_type", lambda *args: Q.Q8_0)
    with pytest.raises(ConfigError, match=r"blk\.0\.\w+\.weight is Q4_0, not Q8_0"):
        read_draft_gguf(out, LAYERS)
    (tmp_path / "not.gguf").write_bytes(b"GGUF" + bytes(8))
    with pytest.raises(ConfigError, match=r"cannot read .* as a GGUF"):
        read_draft_gguf(tmp_path / "not.gguf", LAYERS)


def test_the_source_is_the_gguf_the_run_loaded_and_a_hugging_face_model_has_none(source):
    with pytest.raises(ConfigError, match=r"not a \.gguf file .*convert_hf_to_gguf\.py"):
        gguf_draft.source_gguf("org/model", "hub:org/model")
    assert gguf_draft.source_gguf("org/model", str(source)) == source
    assert gguf_draft.source_gguf(str(source), None) == source
