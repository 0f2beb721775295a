"""Measuring acceptance (docs/theory.md, "Measuring acceptance"): prompts, the reference cache, the
estimator, worker set-up, and the pure AcceptanceProfile with its round simulation."""
