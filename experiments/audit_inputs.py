"""Bad input, the way a new user and a hostile tester type it: every case one line and exit 2?

Issue 20's audit, as a script: each case runs `skipsearch` in a fresh process against a tiny random
Llama saved as a local model directory (as the tests build it) or the embedded model where a case
needs real weights, in a scratch directory. A case passes when the command exits 2 with exactly one
line on stderr that starts with `skipsearch: error:`; any `Traceback` fails it. Prints one row per
case and the totals; exits 1 when any case failed.

Run: `.venv/bin/python experiments/audit_inputs.py` (about two minutes on two cores).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from race import tiny_model_dir

SMALL = ["--n-prompts", "1", "--new-tokens", "4", "--max-prompt-tokens", "16"]


def cases(model: str, scratch: Path) -> list[tuple[str, list[str]]]:
    """(name, arguments) of every bad input; files they need are made in `scratch`."""
    truncated = scratch / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x00" * 14)
    not_gguf = scratch / "fake.gguf"
    not_gguf.write_bytes(b"not a gguf at all")
    stranger = scratch / "someone-elses"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not a run")
    bad_best = scratch / "best.json"
    bad_best.write_text('{"mask": "a:4|m:4", "gamma_best": -4}')
    no_mask = scratch / "nomask.json"
    no_mask.write_text('{"gamma": 2}')
    empty_prompts = scratch / "empty.jsonl"
    empty_prompts.write_text("")
    run = ["run", "--model", model, *SMALL]
    return [
        ("--out /", [*run, "--out", "/"]),
        ("--out a directory of other files", [*run, "--out", str(stranger)]),
        ("--out under a file", [*run, "--out", str(bad_best / "x")]),
        ("--resume with no run", [*run, "--out", str(scratch / "none"), "--resume"]),
        ("--budget 0", [*run, "--budget", "0", "--out", str(scratch / "b0")]),
        ("--budget -3", [*run, "--budget", "-3", "--out", str(scratch / "b3")]),
        ("unknown space", [*run, "--space", "nope", "--out", str(scratch / "s")]),
        ("--context 0", [*run, "--context", "0", "--out", str(scratch / "c0")]),
        ("--context -5 --extrapolate-context", [*run, "--context", "-5", "--extrapolate-context"]),
        ("--gamma-max 0", [*run, "--gamma-max", "0", "--out", str(scratch / "g0")]),
        ("--draft-vocab 0", [*run, "--draft-vocab", "0", "--out", str(scratch / "v0")]),
        (
            "--draft-vocab big",
            ["measure", "--model", model, *SMALL, "--skip", "2", "--draft-vocab", "9999999"],
        ),
        ("unknown model", ["measure", "--model", "no-such-model", "--skip", "2"]),
        ("a file that is not a GGUF", ["measure", "--model", str(not_gguf), "--skip", "2"]),
        ("a truncated GGUF header", ["measure", "--model", str(truncated), "--skip", "2"]),
        ("a backwards range", ["measure", "--model", model, *SMALL, "--skip", "5-2"]),
        ("a layer past the depth", ["measure", "--model", model, *SMALL, "--skip", "40"]),
        ("a mangled mask", ["measure", "--model", model, *SMALL, "--mask", "zz:1,2|q"]),
        ("two masks", ["measure", "--model", model, *SMALL, "--skip", "2", "--mask", "a:1|m:1"]),
        ("--dtype nonsense", ["measure", "--model", model, *SMALL, "--skip", "2", "--dtype", "float7"]),
        (
            "--device cuda without one",
            ["measure", "--model", model, *SMALL, "--skip", "2", "--device", "cuda"],
        ),
        (
            "a prompt past the context",
            ["measure", "--model", model, "--skip", "2", "--max-prompt-tokens", "9000"],
        ),
        (
            "an empty prompt file",
            ["measure", "--model", model, *SMALL, "--skip", "2", "--prompts", str(empty_prompts)],
        ),
        ("decode --from a bad gamma_best", ["decode", "--model", model, *SMALL, "--from", str(bad_best)]),
        ("decode --from a file with no mask", ["decode", "--model", model, *SMALL, "--from", str(no_mask)]),
        ("decode --gamma 0", ["decode", "--model", model, *SMALL, "--skip", "2", "--gamma", "0"]),
        ("decode --repeats 0", ["decode", "--model", model, *SMALL, "--skip", "2", "--repeats", "0"]),
        ("report of no run", ["report", str(scratch / "none")]),
        ("export of no run", ["export", str(scratch / "none")]),
        ("speedup --alpha 2", ["speedup", "--alpha", "2", "--gamma", "3", "--c", "0.3"]),
        ("profile --context-lengths x", ["profile", "--model", model, "--context-lengths", "x"]),
        ("profile --out a directory", ["profile", "--model", model, "--out", str(stranger)]),
    ]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model = tiny_model_dir(scratch / "tiny-model")
        env = {**os.environ, "SKIPSEARCH_CACHE": str(scratch / "cache")}
        failures = 0
        bad_inputs = cases(model, scratch)
        print(f"{'case':<40} {'exit':>4}  one line  traceback")
        for name, args in bad_inputs:
            out = subprocess.run(
                [sys.executable, "-m", "skipsearch", *args], capture_output=True, text=True, env=env, cwd=tmp
            )
            lines = [line for line in out.stderr.splitlines() if line.strip() and "━" not in line]
            one_line = len(lines) == 1 and lines[0].startswith("skipsearch: error:")
            traceback = "Traceback" in out.stderr
            ok = out.returncode == 2 and one_line and not traceback
            failures += not ok
            line_cell, traceback_cell = "yes" if one_line else "NO", "YES" if traceback else "no"
            print(f"{name:<40} {out.returncode:>4}  {line_cell:>8}  {traceback_cell:>9}")
            if not ok:
                print("    " + (out.stderr.strip().splitlines() or ["(no stderr)"])[-1][:160])
        print(f"{len(bad_inputs) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
