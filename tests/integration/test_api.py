"""The README's Python example, run exactly as the README shows it, on the embedded model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import skipsearch
from skipsearch.errors import ConfigError
from tests.unit.engine.conftest import one_thread

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]  # a fixture of another folder's conftest.py, imported


def readme_example() -> str:
    """The README's one Python block (the example a newcomer copies)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, f"the README should hold one Python example, found {len(blocks)}"
    return blocks[0]


def test_the_readme_example_searches_and_decodes_the_embedded_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code = readme_example()
    assert len(code.strip().splitlines()) <= 15  # "a runnable example of about 10 lines"
    monkeypatch.chdir(tmp_path)  # the example writes its run where it runs
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    result, decoded = namespace["result"], namespace["decoded"]
    assert isinstance(result, skipsearch.SearchResult) and isinstance(result.best, skipsearch.Draft)
    assert result.run_dir.resolve() == (tmp_path / "runs" / "example").resolve()
    assert (result.run_dir / "best.json").is_file() and len(result.trials) >= 12
    assert result.gamma >= 1 and result.predicted_speedup > 0
    assert result.verdict.startswith("SSD ") and result.pays == (result.predicted_speedup >= 1.05)
    # the draft it found is the verdict's: its string is the summary's, vocabulary included
    assert str(result.best.mask) == result.summary["mask"]
    assert isinstance(decoded, skipsearch.DecodeResult) and decoded.lossless
    assert decoded.draft == result.best and decoded.gamma == result.gamma and decoded.speedup > 0
    printed = capsys.readouterr().out
    assert str(result.best) in printed and "lossless: True" in printed


def test_search_refuses_a_bad_setting_before_loading_anything(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="budget"):
        skipsearch.search(budget=0, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()
