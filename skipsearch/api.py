"""The Python API: what the command line does, as functions a script or a notebook calls.

    import skipsearch

    result = skipsearch.search("smollm2-135m", budget=30, draft_vocab=16384, out="runs/api")
    print(result.best, result.gamma, f"{result.predicted_speedup:.3f}x", result.verdict)
    print(result.trials.sort_values("score", ascending=False).head())
    decoded = skipsearch.decode("smollm2-135m", result.best, gamma=result.gamma, n_prompts=2)
    print(f"{decoded.speedup:.2f}x, lossless: {decoded.lossless}")

`skipsearch run` and `skipsearch decode` call `search_into` and `decode_report` below, the same
functions `search` and `decode` call once they have built a configuration from their arguments;
the checks of every setting are the configuration's own, so the command line and the API refuse
the same values with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.prompts import PromptSpec
from skipsearch.config import RunConfig
from skipsearch.cost.verdict import Verdict
from skipsearch.masks import Draft, KVPattern, SkipMask, parse_draft_vocab
from skipsearch.models.registry import DEFAULT_MODEL
from skipsearch.options import check
from skipsearch.settings_rules import check_call
from skipsearch.tree_shapes import Tree, as_tree, parse_trees

if TYPE_CHECKING:
    import pandas as pd

    from skipsearch.bench.decode_report import DecodeReport
    from skipsearch.executors.base import ExecutorFactory
    from skipsearch.models.random_weights import RandomWeights
    from skipsearch.run.report import RunReport

AUTO = "auto"
RUNS_DIR = "runs"  # where run and compare directories go by default (git-ignored)


@dataclass(frozen=True)
class SearchResult:
    """What a search found: handed on by the search that wrote its run directory (`run_dir`), or
    read back from it, so a finished or copied run gives the same result (`SearchResult.load`).

    `best` is the draft the verdict names (the finalist with the best exact re-score where the run
    re-scored them), `gamma` its draft length, `tree` the shape of its rounds (None: a chain of
    `gamma`; a token tree such as `2x2x1` where one won), `judgement` the verdict on it
    (`cost.verdict.Verdict`: `predicted_speedup`, its speedup over autoregressive decoding by the
    run's cost model, and `pays`, whether that clears the verdict's margin), `verdict` the verdict's
    sentence, `trials` one row per trial (`trials.csv`), `summary` all of `best.json`, `markdown`
    all of `summary.md`.
    """

    best: Draft
    gamma: int
    tree: Tree | None
    judgement: Verdict
    verdict: str
    trials: pd.DataFrame = field(repr=False)
    run_dir: Path
    summary: dict[str, Any] = field(repr=False)
    markdown: str = field(repr=False, default="")
    measured_now: int = 0  # masks measured by the call that returned this (0 when read back)

    @property
    def predicted_speedup(self) -> float:
        return self.judgement.speedup

    @property
    def pays(self) -> bool:
        return self.judgement.pays

    @classmethod
    def load(cls, run_dir: str | Path) -> SearchResult:
        """The result of the run in `run_dir` (its report files, rewritten by `skipsearch report`)."""
        check_call(SearchResult.load, {"run_dir": run_dir})  # before the imports: a refusal writes nothing
        from skipsearch.run.report import read_run_report

        return cls.of(read_run_report(Path(run_dir)))

    @classmethod
    def of(cls, report: RunReport, measured_now: int = 0) -> SearchResult:
        """The result a run's report states (`run.report.RunReport`)."""
        summary = report.summary
        finalists = summary.get("finalists") or []
        draft = Draft(
            SkipMask.parse(summary["mask"], int(summary["num_layers"])),
            parse_draft_vocab(summary.get("draft_vocab")),
            KVPattern.parse(summary.get("kv")),
        )
        return cls(
            best=draft,
            gamma=int(finalists[0]["gamma"] if finalists else summary["gamma_best"]),
            tree=as_tree(finalists[0].get("tree") if finalists else summary.get("tree")),
            judgement=report.verdict,
            verdict=report.verdict_sentence,
            trials=report.trials,
            run_dir=report.run_dir,
            summary=summary,
            markdown=report.text,
            measured_now=measured_now,
        )


def search(
    model: str | None = None,
    *,
    budget: int | None = None,
    space: str | None = None,
    strategy: str | None = None,
    draft_vocab: int | str | None = None,
    kv: str | None = None,
    trees: Sequence[str] | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    seed: int | None = None,
    gamma_max: int | None = None,
    cost: str | None = None,
    objective: str | None = None,
    sampler: str | None = None,
    temperature: float | None = None,
    context: int | None = None,
    prompts: str | Sequence[str] | None = None,
    n_prompts: int | None = None,
    max_prompt_tokens: int | None = None,
    new_tokens: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    mode: str | None = None,
    progress: bool = True,
) -> SearchResult:
    """Search which layers `model`'s self-speculative draft should skip, as `skipsearch run` does.

    Every setting left at None takes `skipsearch run`'s default (or, with `resume=True`, the value
    the run in `out` stored; a setting given that differs from the stored one is refused, but for
    `budget`, which a resume may raise).
    - `model`: a registry alias, a Hugging Face id, a local directory or a .gguf file (default:
      the embedded SmolLM2-135M).
    - `space`: a shipped space (`sparse`, `contiguous`, `block`, `sublayer`, `tiers`) or a YAML path.
    - `draft_vocab`: score every mask drafting from the K most frequent token ids.
    - `kv`: a KV pattern such as `s4w1024` (needs `context`).
    - `trees`: token-tree shapes each draft is also scored as, e.g. `["2x1", "2x2x1"]` (`["chain"]`:
      chains only; default: the space's `tree:` list).
    - `cost`: `auto` (calibrated where `skipsearch profile` measured this model on this device),
      `calibrated` or `closed-form`.
    - `out`: the run directory (default `runs/<model>-<space>-<strategy>-s<seed>`).

    Every argument is checked first, by its keyword: its type (a `SettingTypeError`, a TypeError),
    its range and the combination as a whole (`settings_rules`; a `ConfigError`, a ValueError).
    """
    arguments = dict(locals())
    check_call(search, arguments)
    given = {
        "budget": budget,
        "space": space,
        "strategy": strategy,
        "seed": seed,
        "gamma_max": gamma_max,
        "cost": cost,
        "objective": objective,
        "sampler": sampler,
        "temperature": temperature,
        "context": context,
    }
    settings = {name: value for name, value in given.items() if value is not None}
    measured = {
        "model": model if model is not None or resume else DEFAULT_MODEL,
        "device": device,
        "dtype": dtype,
        "mode": mode,
    }
    prompt_settings = {
        "source": None if prompts is None else (prompts if isinstance(prompts, str) else " ".join(prompts)),
        "n_prompts": n_prompts,
        "max_prompt_tokens": max_prompt_tokens,
        "new_tokens": new_tokens,
    }
    with named_as_keywords(search):
        spec = PromptSpec(**{k: v for k, v in prompt_settings.items() if v is not None})
        measure = MeasureConfig(prompts=spec, **{k: v for k, v in measured.items() if v is not None})
        vocab = None if draft_vocab is None else (parse_draft_vocab(draft_vocab),)
        pattern = None if kv is None else (KVPattern.parse(kv),)
        config = RunConfig(
            measure=measure,
            **{"cost": AUTO, **settings},
            draft_vocab=vocab,
            kv=pattern,
            trees=None if trees is None else tuple(str(shape) for shape in parse_trees(trees)),
        )
    typed = {name for name, value in {**given, **measured, **prompt_settings}.items() if value is not None}
    if draft_vocab is not None:
        typed.add("draft_vocab")
    if kv is not None:
        typed.add("kv")
    if trees is not None:
        typed.add("trees")
    directory = Path(out) if out is not None else default_out(config)
    return search_into(config, directory, resume=resume, typed=stored_fields(typed), progress=progress)


@contextmanager
def named_as_keywords(function: Callable[..., Any]) -> Iterator[None]:
    """A configuration's own check, built from `function`'s arguments, names the command-line
    flag (`--draft-vocab 'x' is not ...`): here the refusal names the keyword (`draft_vocab`)."""
    import inspect

    from skipsearch.errors import SkipsearchError

    try:
        yield
    except SkipsearchError as error:
        message = str(error)
        for keyword in inspect.signature(function).parameters:
            flag = "--" + keyword.replace("_", "-")
            if message.startswith(flag + " ") or message.startswith(flag + ":"):
                error.args = (keyword + message[len(flag) :],)
                break
        raise


# A `search` keyword -> the `RunConfig` field a resume compares it with (`run.preflight.resumed_config`).
_STORED_FIELDS = {
    "model": "measure.model",
    "device": "measure.device",
    "dtype": "measure.dtype",
    "mode": "measure.mode",
    "source": "measure.prompts.source",
    "n_prompts": "measure.prompts.n_prompts",
    "max_prompt_tokens": "measure.prompts.max_prompt_tokens",
    "new_tokens": "measure.prompts.new_tokens",
}


def stored_fields(typed: set[str]) -> dict[str, str]:
    """The `RunConfig` fields the caller set, each with the name to quote when a resume refuses it."""
    names = {"source": "prompts"}
    return {_STORED_FIELDS.get(name, name): names.get(name, name) for name in typed}


def default_out(config: RunConfig) -> Path:
    """Where a run goes when no directory is given (as `skipsearch run` without `--out`)."""
    return Path(f"{RUNS_DIR}/{config.measure.model}-{config.space}-{config.strategy}-s{config.seed}")


def default_compare_out(config: RunConfig) -> Path:
    """Where a compare goes when no directory is given (as `skipsearch compare` without `--out`)."""
    return Path(f"{RUNS_DIR}/compare-{config.measure.model}-{config.space}")


def search_into(
    config: RunConfig,
    out: Path,
    *,
    resume: bool = False,
    typed: dict[str, str] | None = None,
    executor_factory: ExecutorFactory | None = None,
    progress: bool = True,
) -> SearchResult:
    """Run `config` into `out` (`skipsearch run`'s whole job): check everything, load the model,
    search to the budget, re-score the finalists, write the report; the result as the report states
    it (nothing read back).
    `typed`: the stored settings the caller set, which a resume refuses to change (`RunConfig`
    field -> the name to quote); `executor_factory`: where masks are evaluated (default: this
    process; `executors.ray` for a Ray cluster)."""
    from skipsearch.executors.base import local_executor
    from skipsearch.progress import trial_progress
    from skipsearch.run.pipeline import start_run

    on_start, close_bar = trial_progress(f"{config.strategy} search", progress)
    try:
        found, report = start_run(
            config, out, resume, typed or {}, executor_factory or local_executor, on_start
        )
    finally:
        close_bar()
    return SearchResult.of(report, measured_now=found.model_evaluations)


@dataclass(frozen=True)
class DecodeResult:
    """A draft decoded for real against autoregressive decoding on the same kernels and prompts: the
    typed view of the decode's report (`bench.decode_report.DecodeReport`, what `skipsearch decode
    --json` writes: HF `generate`, the estimator's prediction, the round breakdown) for `draft`.

    `speedup`: SSD's tokens per second over the autoregressive decode's; `lossless`: greedy SSD
    gave the autoregressive tokens on every prompt (within the measured tolerance in bf16);
    `tokens_per_round` and `acceptance` as the engine measured them.
    """

    draft: Draft
    report: DecodeReport = field(repr=False)

    @property
    def gamma(self) -> int:
        return self.report.gamma

    @property
    def speedup(self) -> float:
        return self.report.speedup

    @property
    def lossless(self) -> bool:
        return self.report.lossless

    @property
    def tokens_per_round(self) -> float | None:
        return self.report.candidate.tokens_per_round

    @property
    def acceptance(self) -> float | None:
        return self.report.candidate.acceptance

    def __repr__(self) -> str:
        return (
            f"DecodeResult(draft={self.draft}, gamma={self.gamma}, speedup={self.speedup:.3f}, "
            f"lossless={self.lossless}, tokens_per_round={self.tokens_per_round}, "
            f"acceptance={self.acceptance})"
        )


def decode(
    model: str,
    draft: Draft | str,
    *,
    gamma: int = 3,
    prompts: str | Sequence[str] = PromptSpec.source,
    n_prompts: int = 4,
    max_prompt_tokens: int = PromptSpec.max_prompt_tokens,
    new_tokens: int = 64,
    repeats: int = 3,
    temperature: float = 0.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "auto",
    tree: Tree | str | None = None,
) -> DecodeResult:
    """Decode with `draft` (a `Draft`, or its string form such as `a:4,14|m:4,14|v:16384`) for real,
    against autoregressive decoding on the same kernels, as `skipsearch decode` does; greedy by
    default (`temperature` > 0 samples, still lossless in distribution). `tree`: draft token trees
    of that shape (e.g. `2x2x1`, a dynamic `n8`, or a `SearchResult`'s `tree`), beside the chain
    of `gamma`. Every argument is checked first, by its keyword, as `search`'s are."""
    from skipsearch.engine import GammaPolicy, Sampling

    check_call(decode, dict(locals()))

    for name, value in (("gamma", gamma), ("temperature", temperature), ("decode_seed", seed)):
        check(name, value)
    source = prompts if isinstance(prompts, str) else " ".join(prompts)
    spec = PromptSpec(source, n_prompts, max_prompt_tokens, new_tokens, seed)
    draft_vocab = draft.vocab if isinstance(draft, Draft) else None
    if isinstance(draft, str):
        from skipsearch.masks import split_draft

        draft_vocab = split_draft(draft)[1]
    config = MeasureConfig(
        model=model,
        prompts=spec,
        mode="rounds",
        device=device,
        dtype=dtype,
        draft_vocabs=() if draft_vocab is None else (draft_vocab,),
        round_gamma=gamma,
    )

    picked: list[Draft] = []

    def pick(num_layers: int) -> Draft:  # once the model's depth is known, before anything slow
        picked.append(draft if isinstance(draft, Draft) else Draft.parse(draft, num_layers))
        return picked[-1]

    shape = as_tree(tree)
    report = decode_report(
        config, pick, GammaPolicy.fixed(gamma), Sampling(temperature), new_tokens, repeats, seed, tree=shape
    )
    return DecodeResult(picked[-1], report)


def decode_report(
    config: MeasureConfig,
    pick_draft: Callable[[int], Draft],
    policy: Any,
    sampling: Any,
    new_tokens: int,
    repeats: int,
    seed: int,
    breakdown: bool = True,
    weights: RandomWeights | None = None,
    graphs: bool = False,
    tree: Tree | None = None,
) -> DecodeReport:
    """One decode check (`skipsearch decode`'s whole job): the draft `pick_draft(depth)` gives,
    timed against autoregressive decoding and HF `generate` and proven lossless; the report. With
    a `tree`, the draft drafts token trees of that shape, beside the same draft as a chain."""
    from skipsearch.bench.decode import DecodeSettings, decode_draft

    check("repeats", repeats)
    settings = DecodeSettings(sampling, new_tokens, repeats, seed, breakdown)
    return decode_draft(config, pick_draft, policy, settings, weights, graphs, tree)
