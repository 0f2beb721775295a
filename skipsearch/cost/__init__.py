"""Cost model (DESIGN §5): closed forms, the latency profile type, the calibrated form, the memory
model, and the profiler that measures a device."""
