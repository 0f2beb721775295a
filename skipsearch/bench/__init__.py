"""Measurement harnesses over the engine: the decode check, the decoders and the interleaved
benchmark, the estimator's prediction beside the engine's, the lossless check, the latency profiler.

Modules:
- `decode`: one decode check: a draft or a tier set against autoregressive decoding, timed, proven lossless.
- `decode_report`: the decode check's typed report (`DecodeReport`, `TiersReport`), serialised in one place.
- `decoders`: each configuration a benchmark compares, as one callable returning a `DecodeTrace`.
- `interleaved`: every decoder on the same prompts, interleaved and paired.
- `estimate`: the estimator's prediction next to what the engine measured.
- `lossless`: greedy losslessness as real hardware allows: exact, or a numerical near-tie.
- `latency_profiler`: a `LatencyProfile` measured in one process (`skipsearch profile`).
- `processes`: the profile spread over several fresh processes, one after another.
- `passes`: the parts of a forward pass, the round's bookkeeping and the draft head, timed.
- `graphed_profile`: a LatencyProfile of CUDA-graph replays (`skipsearch profile --graphs`).
- `graphed_passes`: the passes `graphed_profile` times, each part captured as a CUDA graph.
- `clock`: wall time on a CPU, CUDA events on a GPU.

Imports nothing heavy itself: `skipsearch profile` must start without torch.
"""
