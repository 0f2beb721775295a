"""Fidelity: whether the estimator and the cost model predict what the engine does (docs/theory.md,
"Measuring acceptance" and "Calibrated cost").

Modules:
- `replay`: the estimator's match vectors replayed under the engine's rules, on the text both
  decode, and where the two disagree.
- `phases`: a round's draft, verify and overhead, measured and predicted, in autoregressive steps.
- `stats`: relative errors of a prediction over a set of masks.

`experiments/fidelity.py` runs them on the embedded model and writes the tables and plots.
"""
