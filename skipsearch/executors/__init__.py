"""Where masks are evaluated (docs/architecture.md, "Data flow"; docs/ray.md): the search hands a
mask to an `Executor` and gets back its AcceptanceProfile, never knowing where it ran.

Modules:
- `base`: the `Executor` interface and `LocalExecutor`, which evaluates in this process.
- `ray`: `RayExecutor`: masks evaluated on long-lived Ray actors.
- `ray_cluster`: joining a Ray cluster (or starting a local one) and sizing the actors to it.
- `ray_worker`: what runs inside a Ray actor: the worker spec that builds its evaluator.
"""
