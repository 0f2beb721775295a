"""One decode check: a draft or a tier set against autoregressive decoding, timed and proven lossless.

`skipsearch decode` (one draft, next to HF `generate`, HF's early exit and the estimator's
prediction) and `decode --from tiers.json` (a tier set next to its best single mask) run the same
flow (`measure`): every decoder on the same prompts, interleaved (`interleaved.benchmark`); then
the lossless check — on the timed runs when greedy, on greedy reruns when sampling, since sampled
runs differ by chance. `decode_draft` and `decode_tiers` return the report the CLI prints and
writes as JSON (`bench.decode_report`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipsearch.bench.decode_report import (
    DecodeConditions,
    DecodeReport,
    GraphedComparison,
    TiersReport,
    summaries_of,
)
from skipsearch.bench.decoders import AR, AR_GRAPHS, HF, SSD, SSD_GRAPHS, Decoder
from skipsearch.engine.gamma import GammaPolicy
from skipsearch.engine.result import DecodeTrace, Summary
from skipsearch.engine.sampling import GREEDY, Sampling
from skipsearch.engine.timing import Bucket, breakdown
from skipsearch.engine.tree_rounds import check_tree_pattern
from skipsearch.errors import ConfigError
from skipsearch.masks import Draft
from skipsearch.models.kernels import busy_cpu_warning
from skipsearch.tree_shapes import DynamicTree, Tree, as_tree

if TYPE_CHECKING:
    from skipsearch.acceptance.measure_config import MeasureConfig
    from skipsearch.bench.lossless import LosslessCheck
    from skipsearch.models.loading import LoadedModel
    from skipsearch.models.random_weights import RandomWeights
    from skipsearch.models.runner import LayerwiseRunner
    from skipsearch.tiers.manifest import TierManifest

TIERS, SINGLE = "ssd-tiers", "ssd-best-single"
FEW_REPEATS = 3  # below this, one slow pass moves the mean speed by a third or more


@dataclass(frozen=True)
class DecodeSettings:
    """How the decodes run: the same for every decoder of one check."""

    sampling: Sampling
    new_tokens: int
    repeats: int
    seed: int
    breakdown: bool = True  # SSD rounds timed phase by phase, at a device sync per phase boundary

    def conditions(self, prompts: int) -> DecodeConditions:
        """As the report holds them, with the caveats on their timing."""
        return DecodeConditions(
            self.sampling, prompts, self.repeats, self.new_tokens, tuple(timing_caveats(self.repeats))
        )


def timing_caveats(repeats: int) -> list[str]:
    """Why the speeds of this decode may be noise: few repeats, or a machine busier than its cores
    (the 1-minute load average, taken at the end of the timed passes, includes this process)."""
    caveats = []
    if repeats < FEW_REPEATS:
        caveats.append(
            f"only {repeats} repeat(s): speeds are single draws, not averages; use --repeats {FEW_REPEATS} "
            "or more before quoting them"
        )
    busy = busy_cpu_warning()
    if busy is not None:
        caveats.append(f"{busy}; rerun on an idle machine before quoting the speeds and the speedup")
    return caveats


@dataclass(frozen=True)
class Measured:
    """The timed runs of every decoder, in (repeat, prompt) order, and the lossless check."""

    runs: dict[str, list[DecodeTrace]]
    lossless: LosslessCheck

    def summaries(self) -> dict[str, Summary]:
        return {name: Summary.of(results) for name, results in self.runs.items()}

    def breakdown(self, name: str) -> tuple[Bucket, ...]:
        """`name`'s round time by context tercile and phase."""
        return tuple(breakdown([t for r in self.runs[name] for t in r.timings]))

    def runs_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {name: [r.to_dict() for r in results] for name, results in self.runs.items()}


def measure(
    decoders: Callable[[Sampling], dict[str, Decoder]],
    runner: LayerwiseRunner,
    prompts: Sequence[tuple[int, ...]],
    settings: DecodeSettings,
    candidate: str,
    widest: int | None,
) -> Measured:
    """`decoders(sampling)` benchmarked, and `candidate` checked lossless against `AR`.

    `widest`: γ + 1 of the widest verify pass, to measure the tolerance a near-tie is judged by
    (`lossless.check_runs`); None judges by the dtype's default."""
    from skipsearch.bench.interleaved import benchmark
    from skipsearch.bench.lossless import check_runs

    prompts = list(prompts)
    runs = benchmark(decoders(settings.sampling), prompts, settings.repeats, settings.seed, runner.device)
    if settings.sampling.greedy:
        checked = runs
    else:  # sampled runs differ by chance: check losslessness on greedy reruns
        greedy = decoders(GREEDY)
        checked = {name: [greedy[name](p, None) for p in prompts] for name in (AR, candidate)}
    lossless = check_runs(runner, prompts, checked[AR], checked[candidate], widest)
    return Measured(runs, lossless)


def decode_draft(
    config: MeasureConfig,
    pick_draft: Callable[[int], Draft],
    policy: GammaPolicy,
    settings: DecodeSettings,
    weights: RandomWeights | None,
    graphs: bool = False,
    tree: Tree | None = None,
) -> DecodeReport:
    """One draft (`pick_draft(num_layers)`, called before anything slow) against autoregressive
    decoding, HF `generate` and, for a contiguous prefix, HF's early exit; with real weights, next
    to the estimator's prediction for it. Random weights: timing only, on random prompt ids.
    `tree`: the draft drafts token trees of that shape, and runs as a chain of `policy`'s γ beside.

    `graphs` adds the draft and the autoregressive baseline replayed from CUDA graphs (run eagerly
    over the same static buffers off a GPU), and the graphed SSD is the one checked lossless; with a
    `tree`, the graphed SSD drafts trees (`engine.graphed_tree`) and the graphed chain runs beside."""
    from skipsearch.acceptance.worker import prepare
    from skipsearch.bench.decoders import graphed_decoders, make_decoders
    from skipsearch.bench.estimate import estimator_check, estimators
    from skipsearch.engine.graphed_tree import TreeGraphSteps
    from skipsearch.engine.graphs import GraphSteps
    from skipsearch.masks import kv_label, vocab_label
    from skipsearch.models.draft_head import DraftHead
    from skipsearch.models.loading import eos_ids, load_model
    from skipsearch.models.random_weights import random_prompts
    from skipsearch.models.runner import LayerwiseRunner

    tree = as_tree(tree)  # a chain-shaped tree decodes as the chain
    if weights is None:
        measurement = prepare(config)
        draft = pick_draft(measurement.num_layers)
        runner, loaded = measurement.runner, measurement.loaded
        prompts = measurement.prompt_ids()
        vocab_ids = measurement.vocab_ids
    else:  # timing only: no reference, no estimator, random prompt ids, the first k ids as vocabulary
        measurement = None
        loaded = load_model(config.model, config.device, config.dtype, weights)
        runner = LayerwiseRunner(loaded.model)
        draft = pick_draft(runner.num_layers)
        spec = config.prompts
        prompts = random_prompts(spec.n_prompts, spec.max_prompt_tokens, runner.config.vocab_size, spec.seed)
        vocab_ids = range
    mask, vocab, kv = draft.mask, draft.vocab, draft.kv
    head = None if vocab is None else DraftHead.gather(runner, vocab_ids(vocab))
    gamma = policy.initial if policy.is_fixed else policy.gamma_max
    widest = gamma + 1
    if tree is not None:
        check_tree(tree, kv, policy, graphs)
        widest = max(widest, tree.verify_rows)
    steps, tree_steps = None, None
    if graphs:
        check_graphable(kv, policy)
        room = max(len(p) for p in prompts) + settings.new_tokens + widest + 1
        steps = GraphSteps(runner, [mask], [gamma], room, heads=[head], kvs=[kv])
        if tree is not None:
            tree_steps = TreeGraphSteps(steps, tree)

    def decoders(sampling: Sampling) -> dict[str, Decoder]:
        new, timed = settings.new_tokens, settings.breakdown
        found = make_decoders(runner, loaded, mask, policy, sampling, new, head, kv, timed, tree)
        if steps is not None:
            stop = eos_ids(loaded.model)
            found |= graphed_decoders(steps, policy, sampling, new, stop, timed, tree_steps)
        return found

    measured = measure(decoders, runner, prompts, settings, SSD if steps is None else SSD_GRAPHS, widest)
    runs, sampling = measured.runs, settings.sampling
    summaries = measured.summaries()
    estimates = tuple(
        estimator_check(
            e.evaluate(mask, sampling.temperature, config.draft_vocabs, kv).for_vocab(vocab, kv),
            e.mode,
            policy,
            sampling,
            summaries[SSD],
            tree,
        )
        for e in (estimators(measurement, tree, vocab) if measurement else [])
    )
    return DecodeReport(
        model=config.model,
        mask=str(mask),
        draft_vocab=vocab_label(vocab),
        kv=kv_label(kv),
        exit_layer=mask.exit_layer,
        gamma=policy.initial,
        tree=tree,
        dynamic_gamma=not policy.is_fixed,
        draft_stop=policy.stop_below,
        random_weights=weights is not None,
        kernel_plan_line=loaded.plan.line,
        kernel_plan=loaded.plan.details,
        conditions=settings.conditions(len(prompts)),
        summaries=summaries_of(summaries, HF),
        estimators=estimates,
        lossless=measured.lossless.passed,
        lossless_check=measured.lossless.to_dict(),
        hf_matches_autoregressive=(
            all(h.tokens == a.tokens for h, a in zip(runs[HF], runs[AR], strict=True))
            if sampling.greedy
            else None
        ),
        breakdown=measured.breakdown(SSD_GRAPHS if steps is not None else SSD),
        graphs=None if steps is None else graphed_report(steps.mode, runs, summaries),
        runs=measured.runs_dict(),
    )


def check_tree(tree: Tree, kv: Any, policy: GammaPolicy, graphs: bool) -> None:
    """Refuse what a token tree's rounds do not run, in one line each."""
    check_tree_pattern(tree, kv)
    if graphs and isinstance(tree, DynamicTree):
        raise ConfigError(
            f"dynamic trees ({tree}) choose their nodes on the host each pass, so they are not captured "
            "as CUDA graphs: drop --graphs, or give a static shape such as 2x2x1"
        )
    if policy.stop_below or not policy.is_fixed:
        raise ConfigError("a token tree drafts its whole shape: drop --draft-stop and --dynamic-gamma")
    if graphs and kv is not None:
        raise ConfigError(
            "token trees on CUDA graphs draft over every key (engine.graphed_tree): drop --graphs, "
            "or the KV pattern"
        )


def check_graphable(kv: Any, policy: GammaPolicy) -> None:
    """Refuse what the graphed steps do not run, in one line each."""
    if kv is not None and kv.pillars:
        raise ConfigError(
            "a KV pattern with pillars is not captured as CUDA graphs (each verify chooses the next round's "
            "pillars): drop --graphs, or --kv-pillars"
        )
    if policy.stop_below:
        raise ConfigError("graphed drafts run their full gamma: drop --graphs, or --draft-stop")


def graphed_report(
    mode: str, runs: dict[str, list[DecodeTrace]], summaries: dict[str, Summary]
) -> GraphedComparison:
    """How the graphed decoders compare (`GraphedComparison`)."""

    def speed(name: str) -> float:
        return summaries[name].tokens_per_second

    return GraphedComparison(
        mode=mode,
        ssd_vs_graphed_autoregressive=speed(SSD_GRAPHS) / speed(AR_GRAPHS),
        graphed_vs_eager_autoregressive=speed(AR_GRAPHS) / speed(AR),
        graphed_autoregressive_matches=all(
            g.tokens == a.tokens for g, a in zip(runs[AR_GRAPHS], runs[AR], strict=True)
        ),
    )


def decode_tiers(
    config: MeasureConfig,
    manifest: TierManifest,
    gammas: Sequence[int],
    settings: DecodeSettings,
    require_graphs: bool,
    source: str,
) -> TiersReport:
    """A tier set (read from `source`) against autoregressive decoding and the set's best single
    mask, on CUDA graphs where there is a GPU and eagerly otherwise. On graphs the speedups are
    over the autoregressive decode replayed from the same graphs (`graphed_autoregressive_decode`),
    not over the eager one, which is reported beside it."""
    from skipsearch.engine import autoregressive_decode, speculative_decode
    from skipsearch.engine.graphed_decode import graphed_autoregressive_decode
    from skipsearch.engine.graphs import GraphSteps, make_steps
    from skipsearch.engine.tiered import TieredResult, tiered_decode
    from skipsearch.masks import SkipMask
    from skipsearch.models.loading import eos_ids

    runner, loaded, prompts = _load_for(config, manifest)
    stop = eos_ids(loaded.model)
    new_tokens = settings.new_tokens
    max_len = max(len(p) for p in prompts) + new_tokens + max(gammas) + 2
    steps, eager_reason = make_steps(
        runner, manifest.masks, gammas, max_len, manifest.buckets[0], require_graphs
    )
    predicted = manifest.predicted
    single = (
        predicted.get("pool_best_single") or predicted.get("best_single") or {"mask": str(manifest.masks[0])}
    )
    single_mask = SkipMask.parse(single["mask"], runner.num_layers)
    tiered: list[TieredResult] = []

    def decoders(sampling: Sampling) -> dict[str, Decoder]:
        def tiers(prompt: tuple[int, ...], generator: Any) -> DecodeTrace:
            out = tiered_decode(
                runner,
                prompt,
                manifest.masks,
                gammas,
                manifest.policy,
                new_tokens,
                sampling,
                generator,
                stop,
                steps,
                settings.breakdown,
            )
            tiered.append(out)
            return out.result

        found: dict[str, Decoder] = {
            AR: lambda p, g: autoregressive_decode(runner, p, new_tokens, sampling, g, stop),
            TIERS: tiers,
            SINGLE: lambda p, g: speculative_decode(
                runner, p, single_mask, new_tokens, int(single.get("gamma", gammas[0])), sampling, g, stop
            ),
        }
        if isinstance(steps, GraphSteps):  # the γ = 0 verify graph of tier 0 is the full model
            found[AR_GRAPHS] = lambda p, g: graphed_autoregressive_decode(
                steps, p, new_tokens, sampling, g, stop
            )
        return found

    measured = measure(decoders, runner, prompts, settings, TIERS, max(gammas) + 1)
    timed_tiers = tiered[1 : 1 + settings.repeats * len(prompts)]  # after benchmark's warm-up
    summaries = measured.summaries()
    baseline = AR_GRAPHS if AR_GRAPHS in summaries else AR
    rounds = [t for r in timed_tiers for t in r.tiers]
    share = tuple(rounds.count(t) / len(rounds) if rounds else 0.0 for t in range(len(manifest.masks)))
    return TiersReport(
        model=config.model,
        manifest=source,
        tiers=tuple(str(m) for m in manifest.masks),
        window=manifest.policy.window,
        thresholds=tuple(manifest.policy.thresholds),
        gammas=tuple(gammas),
        best_single=dict(single),
        mode=steps.mode,
        eager_reason=eager_reason,
        conditions=settings.conditions(len(prompts)),
        baseline=baseline,
        summaries=summaries_of(summaries, baseline),
        tier_share=share,
        predicted=dict(manifest.predicted),
        lossless=measured.lossless.passed,
        lossless_check=measured.lossless.to_dict(),
        breakdown=measured.breakdown(TIERS),
        runs=measured.runs_dict(),
        tier_runs=[list(r.tiers) for r in timed_tiers],
    )


def _load_for(
    config: MeasureConfig, manifest: TierManifest
) -> tuple[LayerwiseRunner, LoadedModel, list[tuple[int, ...]]]:
    """The model a tier set was searched on, checked by its depth, and the encoded prompts."""
    from skipsearch.acceptance.prompts import encode_prompts
    from skipsearch.models.loading import load_model
    from skipsearch.models.runner import LayerwiseRunner

    loaded = load_model(config.model, config.device, config.dtype)
    runner = LayerwiseRunner(loaded.model)
    if runner.num_layers != manifest.num_layers:
        raise ConfigError(
            f"the tiers are for a {manifest.num_layers}-layer model but {config.model} has "
            f"{runner.num_layers}: pass --model {manifest.model}"
        )
    context = getattr(loaded.model.config, "max_position_embeddings", None)
    return runner, loaded, [p.ids for p in encode_prompts(config.prompts, loaded.tokenizer, context)]
