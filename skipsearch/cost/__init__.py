"""Cost model (docs/theory.md, "Speedup" and "Calibrated cost"): closed forms, the latency profile
type, the calibrated form, scaling to another depth, a profile's summary, and the memory model.
Pure arithmetic: the profiler that measures a device is in `skipsearch.bench`."""
