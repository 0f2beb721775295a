"""Cost model (docs/theory.md, "Speedup" and "Calibrated cost"): closed forms, the latency profile
type, the calibrated form, the memory model, and the profiler that measures a device."""
