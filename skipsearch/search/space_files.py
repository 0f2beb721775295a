"""Space files: reading and validating the YAML that defines a search space (docs/architecture.md,
"Search spaces").

The shipped files live in the package (`skipsearch/search/builtin_spaces/`, found through
`importlib.resources`, so an installed wheel has them); the repository's top-level
`search_spaces/` points at the same folder. Any other path works too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import FULL_VOCAB, KVPattern, parse_draft_vocab
from skipsearch.options import DEFAULT_GAMMA_MAX, GAMMA_CAP, TOKENS_CAP
from skipsearch.search.space_precision import PRECISIONS
from skipsearch.search.space_spec import LayerRef, SpaceSpec, TierSpec, space_error
from skipsearch.tiers.policy import TierPolicy, check_policy
from skipsearch.tree_shapes import Tree, parse_trees

KINDS = ("contiguous", "block", "sparse", "sublayer", "mixed", "tiers")
SPACES_DIR = Path(str(resources.files("skipsearch.search") / "builtin_spaces"))
"""The shipped space files, inside the package so that an installed wheel has them."""

# -- loading and validation --------------------------------------------------------------------
_MASK_KEYS = (
    "name",
    "kind",
    "description",
    "protected",
    "r_draft_min",
    "r_draft_max",
    "min_skipped",
    "max_skipped",
    "gamma_min",
    "gamma_max",
    "draft_vocab",
    "kv",
    "tree",
    "precision",
)
_TIER_KEYS = ("name", "kind", "description", "base", "num_tiers", "policy")
_POLICY_KEYS = ("window", "thresholds")
# An early exit always skips the last layer, so contiguous spaces protect only the first.
_DEFAULT_PROTECTED: dict[str, tuple[LayerRef, ...]] = {
    "contiguous": (0,),
    "block": (0, -1),
    "sparse": (0, -1),
    "sublayer": (0, -1),
    "mixed": (0, -1),
}
# A mixed space chooses each sub-layer's precision; the others run every kept one at full by default.
_DEFAULT_PRECISION = {"mixed": ("full", "int8", "int4")}


class _Reader:
    """Typed access to one YAML mapping; every error names the file, the key and the fix."""

    def __init__(self, data: Any, source: str, allowed: Sequence[str] | None, prefix: str = "") -> None:
        """`allowed=None` reads a mapping without checking its keys yet (to learn its kind)."""
        self.source = source
        self.prefix = prefix
        if not isinstance(data, Mapping):
            raise self.error(
                "", f"expected a mapping of keys, got {type(data).__name__}", "see search_spaces/"
            )
        unknown = [] if allowed is None else sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise self.error(unknown[0], "is not a known key", f"remove it; {_allowed(allowed)}")
        self.data = data

    def error(self, key: str, problem: str, fix: str) -> ConfigError:
        return space_error(self.source, f"{self.prefix}{key}" if key else "", problem, fix)

    def _bad(self, key: str, want: str) -> ConfigError:
        return self.error(key, f"expected {want}, got {self.data[key]!r}", f"set {key} to {want}")

    def choice(self, key: str, options: Sequence[str]) -> str:
        if key not in self.data:
            raise self.error(key, "is missing", f"set it to one of {', '.join(options)}")
        if self.data[key] not in options:
            raise self._bad(key, f"one of {', '.join(options)}")
        return self.data[key]

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def integer(self, key: str, default: int, low: int, high: int | None = None) -> int:
        value = self.data.get(key, default)
        if not _is_int(value) or value < low or (high is not None and value > high):
            raise self._bad(key, f"an integer >= {low}" if high is None else f"an integer in {low}..{high}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if not (_is_int(value) or isinstance(value, float)) or not 0 <= value <= 1:
            raise self._bad(key, "a number in [0, 1]")
        return float(value)

    def depth_ref(self, key: str, value: Any) -> LayerRef:
        """An integer, or a float in [0, 1] read as a fraction of depth."""
        if _is_int(value) or (isinstance(value, float) and 0 <= value <= 1):
            return value
        raise self.error(
            key,
            f"expected an integer or a fraction of depth in [0, 1], got {value!r}",
            "write e.g. 3, -1 or 0.5",
        )

    def count(self, key: str, default: LayerRef | None) -> LayerRef | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        ref = self.depth_ref(key, value)
        if ref < 0:
            raise self._bad(key, "a count >= 0 or a fraction of depth in [0, 1]")
        return ref

    def mapping(self, key: str, allowed: Sequence[str]) -> _Reader:
        return _Reader(self.data.get(key, {}), self.source, allowed, prefix=f"{self.prefix}{key}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _allowed(keys: Sequence[str]) -> str:
    return f"allowed keys are {', '.join(keys)}"


def parse_space(data: Any, source: str, name: str, base_dir: Path = SPACES_DIR) -> SpaceSpec | TierSpec:
    """Validate one space mapping (`source` and `name` label it); a tiers `base` is looked up
    by name or as a path relative to `base_dir`."""
    kind = _Reader(data, source, None).choice("kind", KINDS)
    if kind == "tiers":
        return _parse_tiers(_Reader(data, source, _TIER_KEYS), name, base_dir)
    return _parse_mask_space(_Reader(data, source, _MASK_KEYS), kind, name)


def _parse_mask_space(reader: _Reader, kind: str, name: str) -> SpaceSpec:
    raw_protected = reader.data.get("protected", _DEFAULT_PROTECTED[kind])
    if raw_protected is None:
        raw_protected = []
    if not isinstance(raw_protected, list | tuple):
        raise reader.error(
            "protected", f"expected a list of layers, got {raw_protected!r}", "write e.g. [0, -1]"
        )
    protected = tuple(reader.depth_ref("protected", ref) for ref in raw_protected)
    if kind != "contiguous" and not protected:
        raise reader.error(
            "protected",
            f"a {kind} space must protect at least one layer, or a mask may skip them all",
            "protect e.g. [0, -1]",
        )
    spec = SpaceSpec(
        name=reader.text("name", name),
        kind=kind,
        source=reader.source,
        description=reader.text("description", ""),
        protected=protected,
        r_draft_min=reader.number("r_draft_min", 0.0),
        r_draft_max=reader.number("r_draft_max", 1.0),
        min_skipped=reader.count("min_skipped", 1),
        max_skipped=reader.count("max_skipped", None),
        gamma_min=reader.integer("gamma_min", 1, 1, GAMMA_CAP),
        gamma_max=reader.integer("gamma_max", DEFAULT_GAMMA_MAX, 1, GAMMA_CAP),
        draft_vocab=_choices(reader, "draft_vocab", parse_draft_vocab, "[full, 16384, 8192]"),
        kv=_choices(reader, "kv", KVPattern.parse, "[full, s4w512, s4w1024]"),
        tree=_trees(reader),
        precision=_precisions(reader, kind),
    )
    for low, high in (
        ("r_draft_min", "r_draft_max"),
        ("gamma_min", "gamma_max"),
        ("min_skipped", "max_skipped"),
    ):
        low_value, high_value = getattr(spec, low), getattr(spec, high)
        if high_value is not None and type(low_value) is type(high_value) and low_value > high_value:
            raise reader.error(
                low, f"{low}={low_value} is above {high}={high_value}", f"lower {low} or raise {high}"
            )
    return spec


def _choices(reader: _Reader, key: str, parse: Callable[[Any], Any], example: str) -> tuple[Any, ...]:
    """`draft_vocab: [full, 16384, 8192]` or `kv: [full, s4w1024]`: the draft vocabularies or KV
    patterns every mask is scored with (default: full only)."""
    raw = reader.data.get(key, [FULL_VOCAB])
    if not isinstance(raw, list) or not raw:
        raise reader.error(key, f"expected a non-empty list, got {raw!r}", f"write e.g. {example}")
    try:
        choices = tuple(parse(value) for value in raw)
    except InvalidMaskError as error:
        raise reader.error(key, str(error), f"write e.g. {example}") from None
    if len(set(choices)) != len(choices):
        raise reader.error(key, f"{raw} names one twice", "list each once")
    return choices


def _precisions(reader: _Reader, kind: str) -> tuple[int, ...]:
    """`precision: [full, int8, int4]`: the bits the draft reads its kept sub-layers' weights at,
    one for all of them (a `mixed` space: one per sub-layer, where skipping is a fourth choice)."""
    raw = reader.data.get("precision", list(_DEFAULT_PRECISION.get(kind, ("full",))))
    example = f"write e.g. [{', '.join(PRECISIONS)}]"
    if not isinstance(raw, list) or not raw:
        raise reader.error("precision", f"expected a non-empty list, got {raw!r}", example)
    unknown = [name for name in raw if not isinstance(name, str) or name not in PRECISIONS]
    if unknown:
        fix = f"use some of {', '.join(PRECISIONS)}"
        raise reader.error("precision", f"{unknown[0]!r} is not a precision", fix)
    if len(set(raw)) != len(raw):
        raise reader.error("precision", f"{raw} names one twice", "list each once")
    return tuple(PRECISIONS[name] for name in raw)


def _trees(reader: _Reader) -> tuple[Tree, ...]:
    """`tree: [chain, 2x1, 2x2x1, n8]`: the token trees (static shapes, dynamic node budgets) every
    draft is also scored as, beside the chains of every γ (default: chains only)."""
    raw = reader.data.get("tree", [])
    example = "[chain, 2x1, 2x2x1]"
    if not isinstance(raw, list):
        raise reader.error("tree", f"expected a list of shapes, got {raw!r}", f"write e.g. {example}")
    try:
        return parse_trees(raw)
    except ConfigError as error:
        raise reader.error("tree", str(error), f"write e.g. {example}") from None


def _parse_tiers(reader: _Reader, name: str, base_dir: Path) -> TierSpec:
    base_ref = reader.text("base", "sparse")
    relative = base_dir / base_ref
    try:
        base = load_space(relative if relative.is_file() else base_ref)
    except ConfigError as exc:
        raise reader.error(
            "base",
            f"cannot load base space {base_ref!r} ({exc})",
            "name a built-in space or a path next to this file",
        ) from None
    if isinstance(base, TierSpec):
        raise reader.error(
            "base", f"base space {base.source} is itself a tiers space", "use a mask space, e.g. sparse"
        )
    num_tiers = reader.integer("num_tiers", 3, 2, 4)
    policy = reader.mapping("policy", _POLICY_KEYS)
    thresholds = policy.data.get("thresholds")
    numbers = isinstance(thresholds, list) and all(
        isinstance(t, float | int) and not isinstance(t, bool) for t in thresholds
    )
    tier_policy = TierPolicy(
        window=policy.integer("window", 8, 1, TOKENS_CAP),
        thresholds=tuple(float(t) for t in thresholds) if numbers else (),
    )
    try:
        if not numbers:
            raise ConfigError(f"expected a list of numbers, got {thresholds!r}")
        check_policy(tier_policy, num_tiers)
    except ConfigError as error:
        raise policy.error("thresholds", str(error), f"write e.g. {_example(num_tiers)}") from None
    return TierSpec(
        name=reader.text("name", name),
        source=reader.source,
        description=reader.text("description", ""),
        base=base,
        num_tiers=num_tiers,
        policy=tier_policy,
    )


def _example(num_tiers: int) -> list[float]:
    return [round((i + 1) / num_tiers, 2) for i in range(num_tiers - 1)]


def available_spaces() -> list[str]:
    """Names of the built-in space files."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def space_path(ref: str | Path) -> Path:
    """A built-in name (`sparse`) or a path to a YAML file -> the file's path."""
    path = Path(ref)
    if path.is_file():
        return path
    if path.suffix or len(path.parts) > 1:
        raise ConfigError(f"search space file {path} does not exist: check the path")
    builtin = SPACES_DIR / f"{ref}.yaml"
    if not builtin.is_file():
        names = ", ".join(available_spaces())
        raise ConfigError(f"unknown search space {str(ref)!r}: use one of {names} or a path to a YAML file")
    return builtin


def load_space(ref: str | Path) -> SpaceSpec | TierSpec:
    """Load and validate a space file by built-in name or path."""
    path = space_path(ref)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"search space {path} is not valid YAML ({exc}): fix the syntax") from None
    return parse_space(data, source=str(path), name=path.stem, base_dir=path.parent)
