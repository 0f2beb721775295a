"""The Python API (`skipsearch.api`, exported by `skipsearch`): its names, and a search on a tiny local
model run and read back through it (the README's example on the real model: tests/integration/test_api.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import skipsearch
from skipsearch.api import SearchResult
from skipsearch.errors import ConfigError
from tests.unit.conftest import SMALL

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_importing_skipsearch_loads_no_torch_and_exports_the_api() -> None:
    code = (
        "import sys, skipsearch; assert 'torch' not in sys.modules; "
        "print(sorted(n for n in skipsearch.__all__ if not n.startswith('_')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "['DecodeResult',", "'Draft',", "'KVPattern',", "'SearchResult',", "'SkipMask',", "'decode',",
        "'load_model',", "'search']",
    ]  # fmt: skip


def test_search_stays_the_function_once_the_search_package_is_imported() -> None:
    import skipsearch.search.spaces  # binds the package's name on `skipsearch`, but for _Package

    assert callable(skipsearch.search) and skipsearch.search.__module__ == "skipsearch.api"
    from skipsearch.search import spaces

    assert spaces.__name__ == "skipsearch.search.spaces"


def test_a_search_runs_and_reads_back_its_result(model_dir: str, tmp_path: Path) -> None:
    out = tmp_path / "api-run"
    prompts = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    result = skipsearch.search(
        model_dir,
        budget=3,
        strategy="random",
        out=out,
        n_prompts=int(prompts["--n-prompts"]),
        new_tokens=int(prompts["--new-tokens"]),
        max_prompt_tokens=int(prompts["--max-prompt-tokens"]),
        progress=False,
    )
    assert result.run_dir == out and len(result.trials) == 3 and result.measured_now == 3
    assert result.tree is None and result.gamma >= 1 and str(result.best.mask) == result.summary["mask"]
    again = SearchResult.load(out)  # a finished run reads back the same
    assert (again.best, again.gamma, again.predicted_speedup) == (
        result.best,
        result.gamma,
        result.predicted_speedup,
    )
    with pytest.raises(ConfigError, match="budget"):  # a typed setting a resume cannot take
        skipsearch.search(model_dir, budget=0, out=out, resume=True)


def test_a_bad_setting_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="budget"):
        skipsearch.search(budget=0, out=tmp_path / "r")
    with pytest.raises(ConfigError, match="tree"):
        skipsearch.search(trees=["2x"], out=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match=r"holds no best\.json"):
        SearchResult.load(tmp_path)


def test_each_api_name_is_its_subpackages_own() -> None:
    """No public name is a wrapper of another: `load_model` is the loader itself, and a decode's
    result is a view over the decode's typed report."""
    from dataclasses import fields

    from skipsearch.models import loading

    assert skipsearch.load_model is loading.load_model
    assert {f.name: f.type for f in fields(skipsearch.DecodeResult)} == {
        "draft": "Draft",
        "report": "DecodeReport",
    }


_MISUSE = [  # every public function x None, a wrong type, an out-of-range value: (call, error, keyword)
    (lambda: skipsearch.search(prompts=123), TypeError, "prompts=123"),
    (lambda: skipsearch.search(trees="2x1"), TypeError, "trees='2x1'"),
    (lambda: skipsearch.search(budget="thirty"), TypeError, "budget='thirty'"),
    (lambda: skipsearch.search(budget=0), ValueError, "budget 0"),
    (lambda: skipsearch.search(strategy="random", sampler="cmaes"), ValueError, "sampler='cmaes'"),
    (lambda: skipsearch.search(trees=["2x1", "2x1"]), ValueError, "trees="),
    (lambda: skipsearch.search(model=" "), ValueError, "model ' '"),
    (lambda: skipsearch.decode("m", None), TypeError, "draft=None"),
    (lambda: skipsearch.decode(None, "a:1"), TypeError, "model=None"),
    (lambda: skipsearch.decode("m", "a:1", gamma=0), ValueError, "gamma 0"),
    (lambda: skipsearch.decode("m", "a:1", n_prompts=1.5), TypeError, "n_prompts=1.5"),
    (lambda: skipsearch.load_model(None), TypeError, "name=None"),
    (lambda: skipsearch.load_model("m", dtype="int3"), ValueError, "dtype 'int3'"),
]


@pytest.mark.parametrize(("call", "error", "keyword"), _MISUSE)
def test_api_misuse_is_one_error_naming_the_keyword_before_any_work(call, error: type, keyword: str) -> None:
    from skipsearch.errors import SkipsearchError

    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, SkipsearchError)
    message = str(raised.value)
    assert message.startswith(keyword) and "--" not in message.split(":")[0]


def test_the_api_writes_nothing_under_home(tmp_path: Path) -> None:
    """A refused `SearchResult.load` imports nothing that writes, and the run's plots keep matplotlib's
    font cache beside skipsearch's cache: HOME stays empty (the audit's 'wrote into HOME' case)."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    code = (
        "import skipsearch\n"
        "try:\n    skipsearch.SearchResult.load(run_dir=None)\n"
        "except TypeError as error:\n    assert str(error).startswith('run_dir'), error\n"
        "from skipsearch.run.pyplot import plt\n"
        "plt.subplots()\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SKIPSEARCH_CACHE": str(cache)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).parents[2])
    assert list(home.iterdir()) == []
    assert (cache / "matplotlib").is_dir()
