"""Measurement harnesses over the engine: the decode check, the decoders and the interleaved
benchmark, the estimator's prediction beside the engine's, the lossless check, the profiler.

Modules: `decode` (one decode check: benchmark, lossless check, report), `decoders` (each
configuration as one callable), `interleaved` (every decoder on the same prompts, paired),
`estimate` (predicted beside measured), `lossless` (exact or a numerical near-tie), `graphed` (the
round's steps timed as CUDA graphs), `latency_profiler` (a `LatencyProfile` measured in one process),
`processes` (over several), `passes` (the parts of a pass timed), `clock` (wall time or CUDA
events). Imports nothing heavy itself: `skipsearch profile` must start without torch.
"""
