"""Tier sets (docs/theory.md, "Tier sets and CUDA graphs"): a few masks captured once, and a
runtime policy that picks one per round from recent acceptance. The tier-set *search* lives with
the other searches, in `search.tier_sets`; the engine that decodes with tiers is `engine.tiered`.

Modules:
- `policy`: the tier policy: which tier drafts the next round.
- `simulation`: a tier set scored by simulating its policy over the calibration trajectories.
- `manifest`: the tier manifest (`tiers.json`): the masks, draft lengths and policy an engine captures.
"""
