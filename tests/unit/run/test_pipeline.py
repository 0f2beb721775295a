"""`--cost auto`: which cost model a run scores with, decided once; a resume keeps the stored settings."""

from pathlib import Path

import pytest
import yaml

from skipsearch.config import COMPARED_STRATEGIES, CompareSettings, RunConfig, load_run_file
from skipsearch.errors import ConfigError
from skipsearch.run import compare as runs
from skipsearch.run import pipeline
from skipsearch.run.pipeline import cost_note
from skipsearch.run.search_step import RunContext
from skipsearch.store import RUN_FILE

PROFILE = "/cache/profiles/smollm2-135m-cpu.json"


def context(profiled: bool) -> RunContext:
    """Only `latency` and the provenance matter here: the model is never touched."""
    return RunContext(
        measurement=None,
        latency=object() if profiled else None,
        provenance={"latency_profile": PROFILE if profiled else None},
        scoring=None,
        scorer=None,
        setups={},
        space=None,
    )


def test_a_resumed_comparison_keeps_its_settings(
    tmp_path: Path, cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started in closed form for acceptance: a resume that types neither continues exactly that,
    to the new budget it types (the model is never loaded: the test stops where it would be)."""
    stored = CompareSettings(("random", "learned"), seeds=2, random_multiple=3)
    RunConfig(cost="closed-form", objective="acceptance", budget=5).save(tmp_path / RUN_FILE, {}, stored)
    opened: list[RunConfig] = []

    def stop(prepared: pipeline.PreparedRun) -> RunContext:
        opened.append(prepared.config)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "open_context", stop)
    with pytest.raises(KeyboardInterrupt):
        runs.run_compare(
            RunConfig(cost="auto", budget=9),
            CompareSettings(COMPARED_STRATEGIES),  # the defaults, not typed
            tmp_path,
            resume=True,
            progress=print,
            typed={"budget": "--budget"},
        )
    assert (opened[0].cost, opened[0].objective, opened[0].budget) == ("closed-form", "acceptance", 9)
    assert load_run_file(tmp_path / RUN_FILE)[2] == stored  # the strategies, seeds and multiple kept
    assert (tmp_path / RUN_FILE).is_file()  # a resumed run is never removed


def test_a_resume_refuses_a_typed_setting_it_would_ignore(tmp_path: Path, cache_in_tmp: Path) -> None:
    RunConfig(objective="acceptance", budget=5).save(tmp_path / RUN_FILE, {}, CompareSettings(("random",), 1))
    typed = {"objective": "--objective"}
    compare = CompareSettings(("random",), 1)
    with pytest.raises(ConfigError, match=r"--objective speedup would be ignored.*objective='acceptance'"):
        runs.run_compare(RunConfig(budget=9), compare, tmp_path, resume=True, progress=print, typed=typed)
    typed = {"compare.seeds": "--seeds"}
    with pytest.raises(ConfigError, match=r"--seeds 3 would be ignored.*stored seeds=1"):
        runs.run_compare(RunConfig(), CompareSettings(("random",), 3), tmp_path, True, print, typed=typed)


def test_a_resume_refuses_a_directory_of_the_other_kind(tmp_path: Path, cache_in_tmp: Path) -> None:
    RunConfig(budget=5).save(tmp_path / RUN_FILE, {})  # a run
    with pytest.raises(
        ConfigError, match=r"holds a `skipsearch run`, not a compare: continue it with `skipsearch run --out"
    ):
        runs.run_compare(RunConfig(), CompareSettings(("random",), 1), tmp_path, True, print)


def test_a_run_yaml_from_before_kinds_reads_its_compare_settings_from_the_provenance(tmp_path: Path) -> None:
    provenance = {"seeds": 2, "strategies": ["random", "learned", "random@3x"]}
    (tmp_path / RUN_FILE).write_text(
        yaml.safe_dump({"config": RunConfig().to_dict(), "provenance": provenance})
    )
    assert load_run_file(tmp_path / RUN_FILE)[2] == CompareSettings(("random", "learned"), 2, 3)


def test_the_note_names_the_profile_or_how_to_make_one() -> None:
    calibrated = cost_note(RunConfig(cost="calibrated"), context(True))
    assert "calibrated" in calibrated and PROFILE in calibrated
    closed = cost_note(RunConfig(cost="closed-form"), context(False))
    assert "closed form" in closed and "skipsearch profile --model smollm2-135m" in closed
    assert "skipsearch profile" not in cost_note(RunConfig(cost="closed-form"), context(True))


def test_a_run_is_one_descent(model_dir: str, tmp_path: Path, cache_in_tmp: Path, monkeypatch) -> None:
    """A tiny run loads its space file once, prices its scoring once, builds its search once (the
    depth of a local model is known before loading) and reads none of its report back: the result
    it returns is the one `SearchResult.load` reads from the files it wrote."""
    from collections import Counter

    import skipsearch
    from skipsearch.api import SearchResult
    from skipsearch.run import preflight, report
    from skipsearch.search import objective, space_files
    from skipsearch.store import SUMMARY_FILE
    from tests.unit.conftest import SMALL

    calls: Counter[str] = Counter()

    def count(module: object, name: str) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    count(space_files, "load_space")
    count(objective, "scoring_latency")
    count(preflight, "build_search")
    count(report, "read_run_report")
    count(report, "load_finalists")
    prompts = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    out = tmp_path / "run"
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
    assert calls == {"load_space": 1, "scoring_latency": 1, "build_search": 1}
    again = SearchResult.load(out)
    assert result.markdown == (out / SUMMARY_FILE).read_text() == again.markdown
    assert (result.best, result.gamma, result.tree, result.judgement, result.verdict, result.summary) == (
        again.best,
        again.gamma,
        again.tree,
        again.judgement,
        again.verdict,
        again.summary,
    )
    assert result.trials.equals(again.trials)


def test_runs_and_compares_default_to_the_runs_directory() -> None:
    from skipsearch.api import default_compare_out, default_out

    config = RunConfig(strategy="random", seed=2)
    assert default_out(config) == Path(f"runs/{config.measure.model}-sparse-random-s2")
    assert default_compare_out(config) == Path(f"runs/compare-{config.measure.model}-sparse")


def test_a_precision_space_has_its_copies_made_before_the_first_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The int8/int4 copies of every layer are made before the search, not inside its first trials
    (where they doubled the trials' times and `run`'s first estimates); copies that would not fit
    are left to the trials, without an error."""
    from types import SimpleNamespace

    from skipsearch.masks import SkipMask
    from skipsearch.models import draft_weights
    from skipsearch.models.runner import LayerwiseRunner
    from tests.conftest import tiny_model

    def context_of(runner: LayerwiseRunner, precisions: tuple[int, ...]) -> SimpleNamespace:
        space = SimpleNamespace(precisions=precisions)
        return SimpleNamespace(
            measurement=SimpleNamespace(runner=runner), setups={"random": SimpleNamespace(space=space)}
        )

    config = SimpleNamespace(strategy="random")
    runner = LayerwiseRunner(tiny_model("llama", layers=2, seed=1))
    pipeline.make_draft_copies(context_of(runner, (16, 8, 4)), config)
    every = [SkipMask.parse(f"w{bits}:0-1", 2) for bits in (8, 4)]
    assert runner.draft_weights.loaded_bytes == sum(runner.draft_weights.nbytes(m) for m in every) > 0

    plain = LayerwiseRunner(tiny_model("llama", layers=2, seed=1))
    pipeline.make_draft_copies(context_of(plain, (16,)), config)  # no lower precision: nothing made
    assert plain.draft_weights.loaded_bytes == 0

    refused = LayerwiseRunner(tiny_model("llama", layers=2, seed=1))

    def no_room(needed: int, what: str) -> None:
        raise ConfigError(f"{what} need {needed} bytes")

    monkeypatch.setattr(draft_weights, "_fits", no_room)
    pipeline.make_draft_copies(context_of(refused, (16, 8, 4)), config)  # left to the trials
    assert refused.draft_weights.loaded_bytes == 0
