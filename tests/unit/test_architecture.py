"""The layering of docs/architecture.md, "Layers" is a checked contract: import-linter's contracts
in pyproject.toml.

The suite runs `lint-imports` on the tree as it is, and on copies with one deliberately wrong
import each, which must break the contract they violate. A built wheel carries the search-space
YAML files, so `--space sparse` works from an installed package.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("skipsearch/engine/ssd.py", "from skipsearch.search import spaces", "engine runs drafts"),
        ("skipsearch/masks/skip_mask.py", "import torch", "Pure arithmetic"),
        ("experiments/fidelity.py", "from skipsearch.cli import main", "Nothing imports the command line"),
        ("skipsearch/models/runner.py", "from skipsearch.acceptance import profile", "Layers"),
        ("skipsearch/cost/latency.py", "from skipsearch.bench import latency_profiler", "Layers"),
        ("skipsearch/cost/depth.py", "import torch", "Pure arithmetic"),
        ("skipsearch/engine/ssd.py", "from skipsearch.cpu import threads", "CPU backend is applied"),
        ("skipsearch/cpu/threads.py", "from skipsearch.models import runner", "Layers"),
    ],
)
def test_a_wrong_import_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contract: str
) -> None:
    for name in ("skipsearch", "experiments"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{bad_import}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    # "<contract name> KEPT|BROKEN", one per contract; the report wraps long names over lines.
    parts = re.split(r" (KEPT|BROKEN)\b", " ".join(result.stdout.split()))
    broken = [name for name, verdict in zip(parts[::2], parts[1::2], strict=False) if verdict == "BROKEN"]
    assert any(contract in name for name in broken), result.stdout


@pytest.mark.slow
def test_a_built_wheel_ships_the_search_spaces(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT / "skipsearch", source / "skipsearch", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path,
            ROOT,
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("skipsearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("skipsearch/search/builtin_spaces/"))
    assert shipped == sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml"))


# -- a front door on every package; the library speaks of the code, not of machines (issue 58) ------

PACKAGES = sorted(
    p.parent for p in (ROOT / "skipsearch").rglob("__init__.py") if "__pycache__" not in p.parts
)
# A particular CPU or GPU model, or a link to a measurement file: what a library comment must not name.
MACHINES = re.compile(r"epyc|xeon|\bzen ?\d|rapids|h100|h200|a100|results/", re.IGNORECASE)
SCANNED = {".py", ".c", ".h", ".yaml", ".md"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_docstring_names_each_of_its_modules(package: Path) -> None:
    tree = ast.parse((package / "__init__.py").read_text())
    doc = ast.get_docstring(tree)
    assert doc, f"{package / '__init__.py'} has no docstring: say the package's role and list its modules"
    modules = sorted(p.stem for p in package.glob("*.py") if p.name != "__init__.py")
    unnamed = [m for m in modules if not re.search(rf"`(?:[\w.]+\.)?{re.escape(m)}(?:\.py)?`", doc)]
    assert not unnamed, f"{package / '__init__.py'}'s docstring does not name {unnamed} (as `name`)"


@pytest.mark.parametrize(
    "part", ["(top level)", *(p.name for p in PACKAGES if p.parent == ROOT / "skipsearch")]
)
def test_the_library_names_no_machine_and_links_no_results(part: str) -> None:
    """Comments, docstrings and help texts say which CPU features a measured fact holds on (AVX2
    only, AMX), not which machine, and point to docs/, which links the measurements in results/."""
    top = ROOT / "skipsearch"
    if part == "(top level)":
        files = [f for f in top.iterdir() if f.is_file()]
    else:
        files = [f for f in (top / part).rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    offenders = [
        f"{f.relative_to(ROOT)}:{number}: {line.strip()}"
        for f in sorted(files)
        if f.suffix in SCANNED
        for number, line in enumerate(f.read_text().splitlines(), 1)
        if MACHINES.search(line)
    ]
    assert not offenders, "name CPU features, not machines, and docs/, not results/:\n" + "\n".join(offenders)
