"""The CPU backend (docs/cpu-backend.md): the kernel plan a model runs on this CPU, its choices
measured once per machine, and the C kernels that carry it. Only `models` imports this package
(`models.backend` applies the plan at load; `models.kernels` hands the rest what it needs).

Python modules, the plan's choices:
- `dtypes`: what `--dtype auto` means on this CPU, from its flags.
- `bf16_activations`: on a CPU with native bf16, bf16 activations or float32 ones on bf16 weights.
- `fp32_linear`: which product the fp32 fallback plan's linear layers run (MKL, oneDNN, the kernel).
- `products_choice`: on a CPU with AMX, the vector or the tile kernel for a model's products.
- `int_choice`: our int8/int4 kernels (fused) or torch's weight-only ones for a draft's products.
- `attention_choice`: which attention path a model runs, measured at one and four queries.
- `attention_paths`: the attention paths' names and the K/V cache dtype each reads.
- `choices`: where the measured choices are cached, and the clocks they are measured with.
- `threads`: how many threads a decode uses, fitted to the load at start-up.
- `shared_core`: a decode's products shared with busy cores when only one core is free.

Python modules, the kernels and what applies them:
- `native`: builds the C kernels on first use with the system compiler and loads them with ctypes.
- `bf16_weights`: bf16 weights in float32 arithmetic (`linear_rows.c`, `linear_rows_amx.c`).
- `packed`: weights prepacked once for oneDNN's products.
- `int_weights`: int8 (symmetric, one scale a row) and int4 (asymmetric groups of 32/64/128, bf16
  scale and zero) quantizers, and the exact float32 values they stand for.
- `int_linear`: int8/int4 weights in float32 arithmetic on `linear_rows_int.c` (a lower-precision
  draft's products); a row's output does not depend on the rows beside it.
- `int_torch`: torch's weight-only int8/int4 kernels on the same quantized weights, the baseline.
- `decode_attention`: the decode-attention kernels for a decode's short query blocks.
- `fused_driver`: the C driver of a fused decoder layer (`decoder_layer.c`) and `FusedLayer`, a layer's
  sub-layers in one C call each at bf16 weights.
- `fused_layers`: fused layers on a model (`fuse_layers`) and a draft's layers at int8/int4 on the driver.
- `rms_norm`, `rotary`, `silu`: the norm, rotary embedding and SiLU kernels, same bits as transformers.
- `replace`: swaps a model's sub-modules for the plan's own.
- `inventory`: what a loaded model runs (`plan_kernels`) and the bytes a step reads (`step_bytes`).

C sources (`*.c`), one kernel each: `linear_rows.c` (AVX2/AVX-512) and `linear_rows_amx.c` (AMX
tiles) multiply rows by bf16 weights, `linear_rows_int.c` by int8 or int4 ones; `decode_attention.c`
(bf16 cache, AVX-512 BF16), `decode_attention_fp32.c` (float32 cache, AVX2) and
`decode_attention_amx.c` (AMX tiles) attend; `rms_norm.c`, `rotary.c`, `silu.c`; `decoder_layer.c`
drives a fused sub-layer. Headers (`*.h`),
shared between kernels and hashed into each build: `avx2_lanes.h` (fixed-order lane sums),
`avx2_exp.h` and `avx512_exp.h` (e^x), `avx512_transpose.h`, `amx_tiles.h` (tile configuration),
`decode_attention_keys.h` (which keys a query sees, the chunks), `decode_attention_merge.h` (the
chunks' merge), `shared_core.h` (work shared with busy cores).

Terms: the *kernel plan* is the set of kernels a model runs on this device; the *fallback plan*
runs float32 activations over bf16 weights on skipsearch's kernels; a *choice* is a measurement
taken once per machine and cached.
"""
