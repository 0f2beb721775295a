"""matplotlib's pyplot for the run directory's plots: the Agg backend (no display), and its font
cache beside skipsearch's cache rather than under HOME (`store.matplotlib_beside_cache`), set
before matplotlib is first imported, for a command and for an API call alike."""

from __future__ import annotations

from skipsearch.store import matplotlib_beside_cache

matplotlib_beside_cache()
import matplotlib  # noqa: E402  (matplotlib reads MPLCONFIGDIR when it is imported)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]
