"""Measuring acceptance (DESIGN §4): prompts, the reference cache, the estimator, worker set-up,
and the pure AcceptanceProfile with its round simulation."""
