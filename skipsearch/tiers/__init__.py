"""Tier sets (docs/theory.md, "Tier sets and CUDA graphs"): the runtime policy, its simulation over
calibration trajectories and the manifest. The tier-set *search* lives with the other searches, in
`search/tier_sets.py`."""
