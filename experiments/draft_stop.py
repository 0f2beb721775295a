"""A draft that stops a round when it is unsure: the stop predicted, then decoded.

Every round of a fixed γ drafts γ tokens, and every draft after the first rejected one is wasted.
With `GammaPolicy(stop_below=τ)` (`skipsearch decode --draft-stop τ`) a round ends as soon as the
draft's own probability of the token it proposes falls below τ (the token still goes to the
verify, which on this CPU costs about the same at any width), so it spends fewer draft steps where
it is likely to be rejected, and may afford a longer γ where it is sure.

For one draft (default: issue 19's searched Qwen winner, `results/draft_vocab/`):
- `predict`, on the search's 8 HumanEval prompts (`draft_vocab.SEARCH_PROMPTS`), teacher-forced
  (`rounds` estimator at γ 3, the draft's vocabulary):
  - how the draft's confidence (its softmax maximum over its vocabulary) predicts acceptance;
  - the rounds a stop at τ would play, for γ_max 2-8, replayed over the estimator's matches;
  - each policy's speedup priced by the calibrated cost model on the run's latency profile (a
    round of d drafts: d draft steps, the verify of d + 1 positions, the measured overhead).
  The draft's positions are estimated as in γ-3 rounds without a stop, so the other policies are
  approximate; the best fixed γ and the best stop are then re-scored exactly (`rounds` mode at
  their own γ and τ: `Estimator(round_stop=τ)`). Read the change against τ = 0 at the same γ.
  `--profile` prices with another latency profile (another machine's: `skipsearch profile`).
- `decode`: autoregressive decoding, the draft at the best fixed γ, and the draft with the best
  predicted stop, on the 8 held-out prompts `draft_vocab.py` decodes its winners on (never seen
  by the search or the choice of τ), interleaved and paired (`draft_vocab.paired_decodes`).
  Timing: run it alone on an idle machine.

    python experiments/draft_stop.py          # ~2 min predicting, ~5 min decoding, two idle cores

Writes `results/draft_stop/{name}.md` and `.json` (`--name`, default the model's).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
from _common import configure, markdown_table, stamp_line
from draft_vocab import AR, SEARCH_PROMPTS, held_out_prompts, paired_decodes

from skipsearch.acceptance.estimator import Estimator
from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.acceptance.worker import prepare
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.latency import LatencyProfile
from skipsearch.engine import GammaPolicy, autoregressive_decode, speculative_decode
from skipsearch.masks import Draft
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.loading import eos_ids

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "draft_stop"
PROMPTS = SEARCH_PROMPTS
PARTS = ("predict", "decode")
THRESHOLDS = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
GAMMAS = (2, 3, 4, 5, 6, 8)


def estimator(measurement: Any, draft: Draft, gamma: int, stop: float) -> Estimator:
    """The `rounds` estimator of the draft's vocabulary at `gamma` drafts a round, stopping below `stop`."""
    return Estimator(
        measurement.runner,
        measurement.estimator.reference,
        "rounds",
        measurement.vocab_ids,
        round_gamma=gamma,
        round_vocab=draft.vocab,
        round_stop=stop,
    )


def profile_of(measurement: Any, draft: Draft, gamma: int, stop: float) -> AcceptanceProfile:
    """The draft's greedy profile (its vocabulary's variant), rounds simulated at (`gamma`, `stop`)."""
    vocabs = () if draft.vocab is None else (draft.vocab,)
    found = estimator(measurement, draft, gamma, stop).evaluate(draft.mask, temperature=0, vocabs=vocabs)
    return found.for_vocab(draft.vocab)


def speedup(profile: AcceptanceProfile, cost: Calibrated, gamma: int, stop: float) -> float:
    """Tokens committed over the rounds' cost in autoregressive steps (a round of d drafts: d draft
    steps, the verify of d + 1 positions, the measured overhead)."""
    played = profile.played(gamma, stop)
    return sum(accepted + 1 for _, accepted in played) / sum(cost.round_cost(d) for d, _ in played)


def predict(measurement: Any, draft: Draft, draft_text: str, profile_path: Path) -> dict[str, Any]:
    """The confidence calibration and every (γ_max, τ) policy's predicted speedup over the rounds
    of γ 3 without a stop; then the best fixed γ and the best stop re-scored exactly (`rounds`
    mode at their own γ and τ)."""
    context = PROMPTS.max_prompt_tokens + PROMPTS.new_tokens / 2  # where draft_vocab.py prices
    latency = LatencyProfile.load(profile_path).for_context(context)
    cost = Calibrated(latency, draft.mask, context, draft.vocab, latency.vocab_size)
    profile = profile_of(measurement, draft, 3, 0.0)
    matches = torch.tensor([m for row in profile.greedy_match for m in row])
    confidence = torch.tensor([c for row in profile.greedy_confidence for c in row])
    calibration = []
    for tau in THRESHOLDS[1:]:
        unsure = confidence < tau
        calibration.append(
            {
                "below": tau,
                "share": float(unsure.float().mean()),
                "accepted_below": float(matches[unsure].float().mean()) if unsure.any() else None,
                "accepted_above": float(matches[~unsure].float().mean()),
            }
        )
    policies = [
        {
            "gamma_max": gamma,
            "tau": tau,
            "tokens_per_round": profile.tokens_per_round(gamma, tau),
            "drafts_per_round": profile.drafts_per_round(gamma, tau),
            "speedup": speedup(profile, cost, gamma, tau),
        }
        for gamma in GAMMAS
        for tau in THRESHOLDS
    ]
    found = {
        "draft": draft_text,
        "profile": str(profile_path.resolve().relative_to(ROOT)),
        "context": context,
        "positions": profile.n_positions,
        "alpha": profile.alpha,
        "draft_step": cost.round_time(1).draft / latency.step_time(context),
        "calibration": calibration,
        "policies": policies,
    }
    for policy in chosen(found).values():
        gamma, tau = policy["gamma_max"], policy["tau"]
        exact = profile_of(measurement, draft, gamma, tau)
        policy["exact"] = {
            "tokens_per_round": exact.tokens_per_round(gamma, tau),
            "drafts_per_round": exact.drafts_per_round(gamma, tau),
            "speedup": speedup(exact, cost, gamma, tau),
        }
    return found


def chosen(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The policies the decode plays: the best fixed γ and the best with a stop, by prediction."""
    policies = found["policies"]
    fixed = max((p for p in policies if p["tau"] == 0.0), key=lambda p: p["speedup"])
    stopping = max((p for p in policies if p["tau"] > 0.0), key=lambda p: p["speedup"])
    return {policy_label(p): p for p in (fixed, stopping)}


def policy_label(policy: dict[str, Any]) -> str:
    stop = f" stop {policy['tau']:.1f}" if policy["tau"] else ""
    return f"γ {policy['gamma_max']}{stop}"


def decode(measurement: Any, draft: Draft, found: dict[str, Any], repeats: int, count: int) -> dict[str, Any]:
    """The chosen policies decoded against autoregressive decoding on the held-out prompts."""
    runner, loaded = measurement.runner, measurement.loaded
    prompts = held_out_prompts(loaded.tokenizer, count)
    stop, new = eos_ids(loaded.model), PROMPTS.new_tokens
    head = None if draft.vocab is None else DraftHead.gather(runner, measurement.vocab_ids(draft.vocab))
    decoders = {AR: lambda p, g: autoregressive_decode(runner, p, new, eos_ids=stop)}
    policies = chosen(found)
    for label, policy in policies.items():
        gamma = GammaPolicy.fixed(policy["gamma_max"], policy["tau"])
        decoders[label] = lambda p, g, y=gamma: speculative_decode(
            runner, p, draft.mask, new, y, eos_ids=stop, head=head
        )
    widest = max(p["gamma_max"] for p in policies.values()) + 1
    decoded = paired_decodes(runner, prompts, decoders, repeats, widest)
    return {**decoded, "policies": policies, **loaded.plan.to_record()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--draft", default="a:5,7,8,9,10,11|m:5,7,8,9,10,11|v:32768")
    p.add_argument("--profile", help="latency profile (default: results/profile/xeon-amx/{model}.json)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the decode prompts")
    p.add_argument("--decode-prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    p.add_argument("--name", help="the results' file name (default: the model's; another machine or dtype)")
    args = p.parse_args()
    configure(args.threads)
    profile_path = Path(args.profile or ROOT / "results" / "profile" / "xeon-amx" / f"{args.model}.json")
    name = args.name or args.model
    saved = OUT / f"{name}.json"
    found: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {}
    measurement = prepare(MeasureConfig(model=args.model, prompts=PROMPTS, mode="rounds"))
    draft = Draft.parse(args.draft, measurement.num_layers)
    if "predict" in args.parts:
        predicted = predict(measurement, draft, args.draft, profile_path)
        command = shlex.join(["python", "experiments/draft_stop.py", *sys.argv[1:]])
        found = {"model": args.model, **predicted, **measurement.loaded.plan.to_record(), "command": command}
    if "decode" in args.parts:
        if found.get("draft") != args.draft:
            raise SystemExit(f"{saved} predicts for another draft: run --parts predict first")
        decoded = decode(measurement, draft, found, args.repeats, args.decode_prompts)
        found["decode"] = {**decoded, "threads": args.threads}
    OUT.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(found, indent=1) + "\n")
    write_report(found, OUT / f"{name}.md")


def write_report(found: dict, path: Path) -> None:
    fixed = {p["gamma_max"]: p["speedup"] for p in found["policies"] if p["tau"] == 0.0}
    best = max(found["policies"], key=lambda p: p["speedup"])
    lines = [
        f"# A draft that stops when unsure: {found['model']}, `{found['draft']}`",
        "",
        f"`{found.get('command', 'python experiments/draft_stop.py')}` (see its docstring). "
        f"A prediction: {found['positions']} "
        f"positions of {PROMPTS.n_prompts} HumanEval prompts, teacher-forced (α {found['alpha']:.3f}); "
        f"priced by `{found['profile']}` at {found['context']:.0f} tokens, where a draft step costs "
        f"{found['draft_step']:.2f} of a step. Acceptance measured on the kernel plan: "
        f"{found.get('kernel_plan_line', found['kernel_plan'])}.",
        "",
        "How the draft's confidence predicts acceptance:",
        "",
        *markdown_table(
            ["confidence below", "share of positions", "accepted below", "accepted above"],
            [
                [
                    f"{c['below']:.1f}",
                    f"{c['share']:.3f}",
                    "-" if c["accepted_below"] is None else f"{c['accepted_below']:.3f}",
                    f"{c['accepted_above']:.3f}",
                ]
                for c in found["calibration"]
            ],
        ),
        "",
        "Rounds replayed with a stop at τ (τ 0: every round drafts γ_max):",
        "",
        *markdown_table(
            ["γ_max", "τ", "drafts/round", "tokens/round", "predicted speedup", "against τ 0"],
            [
                [
                    str(p["gamma_max"]),
                    f"{p['tau']:.1f}",
                    f"{p['drafts_per_round']:.2f}",
                    f"{p['tokens_per_round']:.2f}",
                    f"{p['speedup']:.3f}",
                    f"{p['speedup'] / fixed[p['gamma_max']]:.3f}×",
                ]
                for p in found["policies"]
            ],
        ),
        "",
        f"Best: γ_max {best['gamma_max']}, τ {best['tau']:.1f}, {best['speedup']:.3f} predicted, "
        f"{best['speedup'] / max(fixed.values()):.3f}× the best fixed γ ({max(fixed.values()):.3f}).",
        "",
        "Re-scored exactly (`rounds` mode at their own γ and τ): "
        + "; ".join(
            f"{label}: {policy['exact']['speedup']:.3f} ({policy['exact']['tokens_per_round']:.2f} tokens, "
            f"{policy['exact']['drafts_per_round']:.2f} drafts a round)"
            for label, policy in chosen(found).items()
        )
        + ".",
        "",
        *decode_report(found.get("decode")),
    ]
    path.write_text("\n".join(lines))


def decode_report(decoded: dict[str, Any] | None) -> list[str]:
    """The decode's table: each policy against autoregressive decoding, paired."""
    if decoded is None:
        return []
    rows = []
    for label, policy in decoded["policies"].items():
        run = decoded[label]
        only, check = run["decode_only"], run["lossless"]
        ms = run["breakdown_ms"]
        rows.append(
            [
                label,
                f"{policy['speedup']:.3f} → {policy['exact']['speedup']:.3f}",
                f"**{only['aggregate']:.3f}×** ({only['min']:.2f}–{only['max']:.2f})",
                f"{run['end_to_end']['aggregate']:.3f}×",
                f"{run['drafts_per_round']:.2f} / {run['tokens_per_round']:.2f} "
                f"({policy['exact']['drafts_per_round']:.2f} / {policy['exact']['tokens_per_round']:.2f})",
                f"{ms['draft']:.1f} / {ms['verify']:.1f} / {ms['sample'] + ms['cache'] + ms['other']:.1f}",
                f"{check['real_divergences']} real, {check['near_ties']} near-ties",
            ]
        )
    return [
        f"Decoded on {decoded['prompts']} held-out HumanEval prompts × {decoded['repeats']} repeats "
        f"(never seen by the search or the choice of τ), interleaved and paired with autoregressive "
        f"decoding on the same kernels, greedy, {decoded['threads']} threads. " + stamp_line(decoded["meta"]),
        "",
        f"Kernel plan: {decoded.get('kernel_plan_line', decoded['kernel_plan'])}.",
        "",
        *markdown_table(
            [
                "policy",
                "predicted → exact",
                "SSD / AR decode only (min–max of pairs)",
                "end to end",
                "drafts / tokens a round (exact, search prompts)",
                "ms a round: draft / verify / rest",
                "lossless",
            ],
            rows,
        ),
        "",
    ]


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
