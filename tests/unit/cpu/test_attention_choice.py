"""The kernel plan: `--dtype auto` from the CPU's flags, the fp32 attention path, and what a step reads."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from skipsearch.cpu import attention_choice, choices, decode_attention, inventory
from skipsearch.cpu.attention_choice import AttentionChoice, choose_attention
from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
    NATIVE_ATTENTION,
)
from skipsearch.cpu.inventory import step_bytes
from skipsearch.cpu.native import NativeLibrary
from skipsearch.kv.plan_kv import PlanKVCache
from skipsearch.models import attention
from skipsearch.models.attention import grouped_queries
from skipsearch.models.kernels import apply_attention, new_cache
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model, with_plan_attention


# -- the attention path ---------------------------------------------------------------------------
def test_fp32_attention_matches_upcast_attention_and_keeps_fp32_kv() -> None:
    """bf16 weights with fp32 attention: the cache holds the bf16 projections upcast (exactly), and a
    cached step-by-step decode equals the whole-sequence pass up to bf16 rounding of the rest."""
    model = tiny_model("llama", layers=3).to(torch.bfloat16)
    apply_attention(model, attention_choice.AttentionChoice("bfloat16", FP32_ATTENTION))
    runner = LayerwiseRunner(model)
    cache = runner.new_cache()
    assert isinstance(cache, PlanKVCache) and cache.kv_dtype == torch.float32
    ids = torch.tensor([[5, 17, 3, 42, 8, 23]])
    whole = runner.forward(ids)[0].float()
    steps = torch.cat(
        [runner.forward(ids[:, i : i + 1], cache=cache)[0] for i in range(ids.shape[1])]
    ).float()
    assert cache.layers[0].keys.dtype == torch.float32
    assert torch.equal(cache.layers[0].keys, cache.layers[0].keys.to(torch.bfloat16).float())  # exact upcast
    assert (whole - steps).abs().max() < 0.1 * whole.abs().max()
    assert torch.equal(whole.argmax(-1), steps.argmax(-1))


def test_fp32_models_on_a_cpu_get_the_fp32_path_and_cache() -> None:
    model = with_plan_attention(tiny_model("llama", layers=2))
    assert model.config._attn_implementation == FP32_ATTENTION
    cache = new_cache(model.config)
    assert isinstance(cache, PlanKVCache) and cache.kv_dtype == torch.float32


def test_the_fp32_path_attends_as_transformers_sdpa_does() -> None:
    """On a grouped-query model, a verify block (which has a mask) on the fp32 path, which does not
    repeat K/V heads, gives transformers' SDPA's logits."""
    model = tiny_model("llama", layers=2)
    ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9, 30]])
    logits = {}
    for path in (NATIVE_ATTENTION, FP32_ATTENTION):
        apply_attention(model, AttentionChoice("float32", path))
        cache = new_cache(model.config)
        with torch.no_grad():
            model(ids[:, :6], past_key_values=cache, use_cache=True)
            logits[path] = model(ids[:, 6:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(logits[FP32_ATTENTION], logits[NATIVE_ATTENTION], rtol=1e-5, atol=1e-5)


def test_fp32_models_and_accelerators_are_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_choice, "measure_attention_paths", lambda dtype: pytest.fail("measured"))
    assert choose_attention(torch.float32, "cpu").path == FP32_ATTENTION
    assert choose_attention(torch.bfloat16, "cuda").path == NATIVE_ATTENTION


def test_the_fp32_fallback_weighs_sdpa_against_the_fp32_kernel(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--dtype auto`'s float32 (a CPU without native bf16) takes the faster of fp32 SDPA and the
    decode kernel over the fp32 cache, and keeps the choice; `--dtype float32` stays on SDPA."""
    measured = []

    def timings(dtype: torch.dtype) -> dict:
        measured.append(dtype)
        return {FP32_ATTENTION: {"1": 0.23, "4": 0.36}, KERNEL_FP32_ATTENTION: {"1": 0.08, "4": 0.21}}

    monkeypatch.setattr(attention_choice, "measure_attention_paths", timings)
    monkeypatch.setattr(
        attention_choice, "load_kernel", lambda dtype=torch.bfloat16: NativeLibrary(print, "", "b1")
    )
    assert choose_attention(torch.float32, "cpu").path == FP32_ATTENTION and not measured
    chosen = choose_attention(torch.float32, "cpu", fallback=True)
    assert chosen.path == KERNEL_FP32_ATTENTION and measured == [torch.float32]
    assert "0.08, 0.21" in chosen.describe() and attention_choice.choice_path("float32").exists()
    assert choose_attention(torch.float32, "cpu", fallback=True) == chosen and len(measured) == 1


def test_the_fp32_fallback_without_its_kernel_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_choice, "measure_attention_paths", lambda dtype: pytest.fail("measured"))
    missing = NativeLibrary(None, "this CPU lacks fma")
    monkeypatch.setattr(attention_choice, "load_kernel", lambda dtype=torch.bfloat16: missing)
    chosen = choose_attention(torch.float32, "cpu", fallback=True)
    assert chosen.path == FP32_ATTENTION and "decode kernel not used: this CPU lacks fma" in chosen.describe()


def test_fp32_candidates_are_sdpa_and_the_fp32_kernels_where_they_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads = {torch.float32: True, torch.bfloat16: False, "amx": False}
    library = {True: NativeLibrary(print, ""), False: NativeLibrary(None, "")}
    monkeypatch.setattr(attention_choice, "load_kernel", lambda dtype=torch.bfloat16: library[loads[dtype]])
    monkeypatch.setattr(attention_choice, "load_amx_kernel", lambda: library[loads["amx"]])
    assert attention_choice.candidate_paths(torch.float32) == [FP32_ATTENTION, KERNEL_FP32_ATTENTION]
    assert attention_choice.candidate_paths(torch.bfloat16) == [NATIVE_ATTENTION, FP32_ATTENTION]
    loads["amx"] = True
    assert attention_choice.candidate_paths(torch.float32) == [
        FP32_ATTENTION,
        KERNEL_FP32_ATTENTION,
        KERNEL_AMX_ATTENTION,
    ]
    assert attention_choice.candidate_paths(torch.bfloat16) == [NATIVE_ATTENTION, FP32_ATTENTION]
    loads.update({torch.float32: False, torch.bfloat16: True, "amx": False})
    assert attention_choice.candidate_paths(torch.float32) == [FP32_ATTENTION]
    assert attention_choice.candidate_paths(torch.bfloat16) == [
        NATIVE_ATTENTION,
        FP32_ATTENTION,
        KERNEL_ATTENTION,
    ]


def test_the_amx_kernel_runs_only_where_no_slower_at_one_query() -> None:
    """The autoregressive baseline runs one query: the AMX kernel, faster in sum (a verify's rows),
    must not make it slower. Figures of the project's Xeon at 2,048 keys (ms)."""
    sdpa, vector = {"1": 0.14, "4": 0.21}, {"1": 0.074, "4": 0.191}
    assert (
        attention_choice.rank_paths(
            {
                FP32_ATTENTION: sdpa,
                KERNEL_FP32_ATTENTION: vector,
                KERNEL_AMX_ATTENTION: {"1": 0.072, "4": 0.073},
            }
        )[0]
        == KERNEL_AMX_ATTENTION
    )
    slower_alone = {"1": 0.077, "4": 0.073}
    ranked = attention_choice.rank_paths(
        {FP32_ATTENTION: sdpa, KERNEL_FP32_ATTENTION: vector, KERNEL_AMX_ATTENTION: slower_alone}
    )
    assert ranked == [KERNEL_FP32_ATTENTION, FP32_ATTENTION]


def test_the_attention_choice_is_measured_once_and_cached(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def measured(dtype: torch.dtype) -> dict:
        calls.append(dtype)
        return {NATIVE_ATTENTION: {"1": 0.9, "4": 0.3}, FP32_ATTENTION: {"1": 0.1, "4": 0.2}}

    monkeypatch.setattr(attention_choice, "measure_attention_paths", measured)
    first = choose_attention(torch.bfloat16, "cpu")
    again = choose_attention(torch.bfloat16, "cpu")
    assert first == again and first.path == FP32_ATTENTION and len(calls) == 1
    stored = json.loads(attention_choice.choice_path("bfloat16").read_text())
    assert stored["path"] == FP32_ATTENTION and stored["timings"][NATIVE_ATTENTION]["1"] == 0.9
    assert "0.90, 0.30" in first.describe() and "0.10, 0.20" in first.describe()


@pytest.mark.parametrize(
    ("timings", "chosen"),
    [
        ({NATIVE_ATTENTION: {"1": 0.1, "4": 0.2}, FP32_ATTENTION: {"1": 0.3, "4": 0.4}}, NATIVE_ATTENTION),
        (
            {
                NATIVE_ATTENTION: {"1": 0.9, "4": 0.9},
                FP32_ATTENTION: {"1": 0.3, "4": 0.4},
                KERNEL_ATTENTION: {"1": 0.1, "4": 0.3},
            },
            KERNEL_ATTENTION,
        ),
    ],
)
def test_the_fastest_path_is_kept(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch, timings: dict, chosen: str
) -> None:
    monkeypatch.setattr(attention_choice, "measure_attention_paths", lambda d: timings)
    assert choose_attention(torch.bfloat16, "cpu").path == chosen
    assert attention_choice.choice_path("bfloat16").exists()


def test_an_inconclusive_measurement_is_not_cached(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load every path waits on the scheduler and measures alike: no decision is stored."""
    monkeypatch.setattr(
        attention_choice,
        "measure_attention_paths",
        lambda d: {NATIVE_ATTENTION: {"1": 8.0, "4": 8.0}, FP32_ATTENTION: {"1": 8.0, "4": 7.9}},
    )
    assert choose_attention(torch.bfloat16, "cpu").path == FP32_ATTENTION
    assert not attention_choice.choice_path("bfloat16").exists()


def test_a_choice_stored_in_an_older_form_is_measured_again(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = attention_choice.choice_path("bfloat16")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"dtype": "bfloat16", "path": FP32_ATTENTION, "native_ms": {}, "fp32_ms": {}}))
    monkeypatch.setattr(
        attention_choice,
        "measure_attention_paths",
        lambda d: {NATIVE_ATTENTION: {"1": 0.1}, FP32_ATTENTION: {"1": 0.9}},
    )
    assert choose_attention(torch.bfloat16, "cpu").path == NATIVE_ATTENTION


@pytest.mark.skipif(attention_choice.load_kernel().function is None, reason="decode kernel unavailable")
def test_a_choice_measured_on_another_build_of_the_kernel_is_measured_again(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited kernel may be faster or slower than the one the stored choice timed."""
    timings = {NATIVE_ATTENTION: {"1": 0.9}, FP32_ATTENTION: {"1": 0.1}}
    monkeypatch.setattr(attention_choice, "measure_attention_paths", lambda d: timings)
    first = choose_attention(torch.bfloat16, "cpu")
    assert first.kernel_build == attention_choice.load_kernel().build
    stored = json.loads(attention_choice.choice_path("bfloat16").read_text())
    attention_choice.choice_path("bfloat16").write_text(
        json.dumps({**stored, "kernel_build": "an older one"})
    )
    timings = {NATIVE_ATTENTION: {"1": 0.1}, FP32_ATTENTION: {"1": 0.9}}
    assert choose_attention(torch.bfloat16, "cpu").path == NATIVE_ATTENTION


def test_the_real_measurement_times_every_path_at_each_query_count() -> None:
    timings = attention_choice.measure_attention_paths(torch.bfloat16)
    expected = {NATIVE_ATTENTION, FP32_ATTENTION}
    if attention_choice.load_kernel().function is not None:
        expected.add(KERNEL_ATTENTION)
    assert set(timings) == expected
    assert all(
        set(by_queries) == {str(q) for q in attention_choice.PROBE_QUERIES} for by_queries in timings.values()
    )
    assert all(ms > 0 for by_queries in timings.values() for ms in by_queries.values())


# -- the bytes a step reads -----------------------------------------------------------------------
def test_step_bytes_count_a_tied_embedding_once_and_an_untied_one_not_at_all() -> None:
    tied = tiny_model("llama", layers=2, tie_word_embeddings=True)
    untied = tiny_model("llama", layers=2, tie_word_embeddings=False)
    embedding = 61 * 32 * 4
    all_untied = sum(p.numel() * 4 for p in untied.parameters())
    assert step_bytes(untied)[0] == all_untied - embedding
    assert step_bytes(tied)[0] == all_untied - embedding  # the head is the embedding, read once
    # K/V per position: 2 (K and V) x 2 layers x 2 KV heads x head dim 8 x 4 bytes
    assert step_bytes(untied)[1] == 2 * 2 * 2 * 8 * 4


def test_fp32_attention_doubles_the_kv_bytes_of_a_bf16_model() -> None:
    model = tiny_model("llama", layers=2).to(torch.bfloat16)
    native = step_bytes(model)[1]
    apply_attention(model, attention_choice.AttentionChoice("bfloat16", FP32_ATTENTION))
    assert step_bytes(model)[1] == 2 * native


def test_the_amx_kernel_keeps_a_float32_models_kv_in_bf16() -> None:
    """It rounds the keys and values to bf16 as it multiplies them: its cache holds them so, in half
    the bytes, and the memory floor counts those bytes."""
    model = tiny_model("llama", layers=2)
    apply_attention(model, attention_choice.AttentionChoice("float32", KERNEL_FP32_ATTENTION))
    float32_bytes = step_bytes(model)[1]
    assert new_cache(model.config).kv_dtype is torch.float32
    apply_attention(model, attention_choice.AttentionChoice("float32", KERNEL_AMX_ATTENTION))
    assert new_cache(model.config).kv_dtype is torch.bfloat16 and step_bytes(model)[1] == float32_bytes // 2
    assert inventory.plan_kernels(model)["kv_cache"] == "bfloat16"  # a profile records it


def test_a_profile_of_another_cache_dtype_warns(caplog: pytest.LogCaptureFixture) -> None:
    """The same attention path over a float32 cache streams twice the K/V: another plan's costs."""
    from tests.unit.cost.conftest import _latency

    model = tiny_model("llama", layers=2)
    apply_attention(model, attention_choice.AttentionChoice("float32", KERNEL_FP32_ATTENTION))
    running = inventory.plan_kernels(model)
    assert running["kv_cache"] == "float32"
    profile = _latency()
    older = replace(profile, meta={**profile.meta, **running, "kv_cache": "bfloat16"})
    assert older.warn_other_plan(running, "p.json") and "kv_cache bfloat16" in caplog.text
    assert not replace(profile, meta={**profile.meta, **running}).warn_other_plan(running, "p.json")
    unrecorded = {key: value for key, value in running.items() if key != "kv_cache"}
    assert not replace(profile, meta={**profile.meta, **unrecorded}).warn_other_plan(running, "p.json")


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_the_fp32_path_equals_transformers_sdpa_on_an_fp32_model(family: str) -> None:
    """Same arithmetic, other call: prefill, a cached 3-position verify and a cached single step."""
    native = LayerwiseRunner(tiny_model(family, layers=3))
    upcast_model = tiny_model(family, layers=3)
    apply_attention(upcast_model, attention_choice.AttentionChoice("float32", FP32_ATTENTION))
    upcast = LayerwiseRunner(upcast_model)
    ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9]])
    outputs = []
    for runner in (native, upcast):
        cache = runner.new_cache()
        chunks = (ids[:, :5], ids[:, 5:8], ids[:, 8:])
        outputs.append(torch.cat([runner.forward(chunk, cache=cache)[0] for chunk in chunks]))
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)


@pytest.mark.parametrize("path", [FP32_ATTENTION, NATIVE_ATTENTION])
def test_the_plan_attends_over_a_static_cache_as_over_a_dynamic_one(path: str) -> None:
    """transformers skips a static cache's prefill mask (SDPA's `is_causal` aligns top-left, and the
    empty slots come after every query): the plan's attention must read that as SDPA does, or
    `generate` with a static cache attends the empty slots (it did: garbage tokens on a CPU)."""
    from transformers import StaticCache

    model = tiny_model("llama", layers=2)
    apply_attention(model, attention_choice.AttentionChoice("float32", path))
    ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11]])
    with torch.no_grad():
        dynamic = [model(ids).logits[0, -1], model(torch.cat([ids, ids[:, :1]], 1)).logits[0, -1]]
        cache = StaticCache(config=model.config, max_cache_len=20)
        static = [model(ids, cache=cache).logits[0, -1], model(ids[:, :1], cache=cache).logits[0, -1]]
    for expected, got in zip(dynamic, static, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    decode_attention.load_kernel(torch.float32).function is None, reason="fp32 decode kernel unavailable"
)
def test_the_decode_kernel_leaves_mistrals_sliding_window_to_sdpa() -> None:
    """Mistral passes its window in the attention call, not on the module: past the window, cached
    verify blocks on the kernel plan still attend as transformers' windowed SDPA does (each row of a
    block sees its own window of the cache's states, which the causal kernel would not respect)."""
    native = LayerwiseRunner(tiny_model("mistral", layers=2, sliding_window=6))
    planned_model = tiny_model("mistral", layers=2, sliding_window=6)
    apply_attention(planned_model, attention_choice.AttentionChoice("float32", KERNEL_FP32_ATTENTION))
    planned = LayerwiseRunner(planned_model)
    ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12, 7, 19, 4]])
    outputs = []
    for runner in (native, planned):
        cache = runner.new_cache()
        runner.forward(ids[:, :5], cache=cache)
        outputs.append(torch.cat([runner.forward(ids[:, i : i + 3], cache=cache)[0] for i in (5, 8, 11)]))
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)


@pytest.mark.parametrize("queries", [1, 4])
def test_grouped_query_rows_give_grouped_attention(queries: int) -> None:
    """Stacking a K/V head's query heads as rows of one query is the same attention as SDPA's
    `enable_gqa`, mask and all, in transformers' output layout."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, queries, 8, generator=generator)
    key, value = (torch.randn(1, 2, 20, 8, generator=generator) for _ in "kv")
    mask = torch.ones(1, 1, queries, 20, dtype=torch.bool).tril(20 - queries) if queries > 1 else None
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    out = grouped_queries(query, key, value, mask, None)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-6, atol=1e-6)


def test_the_fp32_path_groups_query_rows_over_a_long_cache_only(monkeypatch: pytest.MonkeyPatch) -> None:
    grouped = []
    monkeypatch.setattr(attention, "GROUPED_KEYS", 16)
    monkeypatch.setattr(
        attention, "grouped_queries", lambda *args: grouped.append(args) or grouped_queries(*args)
    )
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    outputs = {}
    for keys in (8, 20):
        query = torch.randn(1, 6, 1, 8, generator=generator)
        key, value = (torch.randn(1, 2, keys, 8, generator=generator) for _ in "kv")
        outputs[keys] = attention.sdpa_fp32kv(module, query, key, value, None)[0]
        expected = F.scaled_dot_product_attention(query, key, value, enable_gqa=True).transpose(1, 2)
        torch.testing.assert_close(outputs[keys], expected, rtol=1e-6, atol=1e-6)
    assert len(grouped) == 1 and grouped[0][1].shape[2] == 20


def test_a_thread_count_the_user_set_has_its_own_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    default = attention_choice.choice_path("bfloat16")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert (
        attention_choice.choice_path("bfloat16") != default
        and "omp1" in attention_choice.choice_path("bfloat16").name
    )


def test_a_choice_measured_beside_busy_processes_is_not_kept(
    cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe shared the cores, so its verdict is not this machine's: used now, measured again later."""
    monkeypatch.setattr(choices, "busy_cores", lambda: 1.2)
    path = cache_in_tmp / "choice.json"
    choices.keep_choice(
        path, attention_choice.AttentionChoice("bfloat16", FP32_ATTENTION), "the attention paths"
    )
    assert not path.exists()
    monkeypatch.setattr(choices, "busy_cores", lambda: 0.1)
    choices.keep_choice(
        path, attention_choice.AttentionChoice("bfloat16", FP32_ATTENTION), "the attention paths"
    )
    assert json.loads(path.read_text())["path"] == FP32_ATTENTION
