"""Tier sets (DESIGN §3): the runtime policy, its simulation, the manifest and the tier-set search."""
