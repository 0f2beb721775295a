"""Models: the registry, loading, the layer-wise runner, and the kernel plan as the rest of
skipsearch sees it.

Modules:
- `registry`: the model aliases `--model` takes, and where each one's weights come from.
- `loading`: load a model: registry alias, Hugging Face id, local directory or `.gguf` file (converted once).
- `gguf_header`: a GGUF's header read without its weights, to refuse a cut-short file early.
- `weight_layout`: the dtype each weight is held in under the plan, from the first byte made or read.
- `memory_fit`: whether a model fits this machine's memory under its plan, refused before loading if not.
- `gguf_draft`: a draft cut from its model's GGUF (its layers, at its precision) for llama.cpp's `-md`.
- `random_weights`: weight-free models: an architecture from its config with seeded random weights.
- `compat`: the transformers API the runner calls, checked once per process.
- `runner`: `LayerwiseRunner`: a decoder run layer by layer with a SkipMask, from transformers' modules.
- `draft_head`: the draft's LM head over a draft vocabulary (`k` rows, gathered once).
- `draft_weights`: int8 / int4 copies of the projections a lower-precision draft reads, cached on disk.
- `device`: the device a command runs on, checked before any model loads there.
- `backend`: puts a loaded model on this device's kernel plan (the only importer of `skipsearch.cpu`).
- `kernels`: the kernel plan as the rest sees it: its KV cache, its record, the helpers a decode engages.
- `plan`: `KernelPlan`, the record of a model's plan and the measurements behind each choice.
- `attention`: the plan's attention functions, registered with transformers by name.

`configs/` ships the `config.json` of every registry alias, for weight-free models.
"""
