"""Tier sets (DESIGN §3): the runtime policy, its simulation over calibration trajectories and the
manifest. The tier-set *search* lives with the other searches, in `search/tier_sets.py`."""
