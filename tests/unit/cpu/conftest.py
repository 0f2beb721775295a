"""The kernel plan's own tests build and measure in a bare cache: what a machine's first run does."""

from pathlib import Path

import pytest


@pytest.fixture
def cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The skipsearch cache inside the test's folder, empty (no `shared_kernels`): a choice is
    measured and kept, or a kernel built, by the test itself."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
