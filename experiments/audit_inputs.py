"""Bad input, the way a hostile tester types it: every option of every sub-command, every path,
every stored setting on `--resume`, interrupts and the environment (issues 20 and 51); options
that depend on each other, lists with a duplicate, blank strings, read-only commands against a
snapshot of what they read, damaged model files and prompts, and the Python API misused (issue 61).

Each case runs `skipsearch` in a fresh process, in an empty directory of its own, with a 60 s limit,
against a tiny random Llama saved as a local model directory (as the tests build it), with the
cache and `HOME` in a scratch directory. The cases are generated:

- every option of every sub-command, as `skipsearch COMMAND --help` lists them (the experiment
  never imports the command line: it reads it as a user does), added to a command that works:
  a value option with 0, -1, nan, inf, a huge number and a word; a flag on its own;
- every path option (outputs and inputs) given a file, a directory, a path whose parent is
  missing, a place that cannot be written and a name longer than a file name may be;
- `--resume` of a finished run and of a finished compare with each stored setting typed
  differently, across kinds, and after SIGINT, SIGTERM and SIGKILL;
- `HOME` and `SKIPSEARCH_CACHE` empty, relative, a file, under a file, unwritable;
- files in bad formats (GGUF cut short, journals empty or damaged, `run.yaml` damaged);
- combinations: each rule of `skipsearch.settings_rules` where its other option does not hold,
  each option without another its help names, each list option with one value twice, each string
  option empty, a space or a newline;
- `report` and `export` of a run, a compare study, a live run (this process holds its lock) and a
  torn journal, the run's directory tree (paths, sizes, mtimes) compared before and after;
- a model directory without its tokenizer, with its weights cut short or an empty config, and a
  prompt that is not valid Unicode;
- every public function of the Python API with None, a wrong type and an out-of-range value, in
  a fresh `python -c`: refused with a TypeError or ValueError of `skipsearch.errors` naming the
  keyword.

A case fails on: a traceback; a hang (60 s); an exit code other than 0, 2 (1 for a decode that was
not lossless, 130 for an interrupt); a refusal that is not exactly one `skipsearch: error:` line;
a silent accept (exit 0 for a value outside the option's declared bound, `skipsearch.options`);
a file written outside the paths the case named and the cache, or anything left behind by a
command that failed (a half-made directory, a rewritten file); a resume that does not restore
what was stored. Writes `results/trust/audit.md` (totals by class, every failure) and exits 1 when
any case failed.

Run as root here: root writes through any mode bits, so "cannot be written" is a path under a
regular file (ENOTDIR) and one in `/sys/kernel` (EACCES even for root), not a `chmod`ed directory.

Run: `.venv/bin/python experiments/audit_inputs.py [--jobs 2] [--only PATTERN] [--limit S]` (about 25
minutes on two idle cores; `--limit` raises the 60 s that counts as a hang where other work shares the
cores).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import fcntl
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from race import tiny_model_dir

from skipsearch.errors import ConfigError
from skipsearch.options import DECLARED, Bound

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60
SMALL = ["--n-prompts", "1", "--new-tokens", "4", "--max-prompt-tokens", "16"]
COMMANDS = ("models", "plan", "measure", "speedup", "profile", "decode", "run", "compare", "report", "export")
VALUES = {
    "zero": "0",
    "negative": "-1",
    "nan": "nan",
    "inf": "inf",
    "huge": "99999999999999999999",
    "word": "many",
}
UNWRITABLE = Path("/sys/kernel/skipsearch-audit")  # EACCES for root too
LONG_NAME = "x" * 300  # a file name may have 255 bytes
# The bound an option reads where its name alone does not say (`skipsearch.options.DECLARED`).
BOUND_OF = {
    ("profile", "--repeats"): "profile_repeats",
    ("decode", "--seed"): "decode_seed",
    ("decode", "--max-new-tokens"): "new_tokens",
    ("decode", "--draft-stop"): "round_stop",
    ("profile", "--context-lengths"): "context_length",
    ("speedup", "--gamma"): "gamma",
}
# Options in the base command that the option under test cannot be given with.
CONFLICTS = {
    "--alphas": ("--alpha",),
    "--mask": ("--skip",),
    "--attn-skip": ("--skip",),
    "--mlp-skip": ("--skip",),
    "--from": ("--skip",),
}
# Path options: outputs (a file or a directory the command writes) and inputs it reads.
OUTPUTS = {
    ("run", "--out"): "dir",
    ("compare", "--out"): "dir",
    ("export", "--out"): "dir",
    ("profile", "--out"): "file",
    ("measure", "--json"): "file",
    ("decode", "--json"): "file",
}
INPUTS = {
    ("measure", "--model"),
    ("measure", "--prompts"),
    ("measure", "--latency-profile"),
    ("run", "--space"),
    ("decode", "--from"),
    ("report", "RUN"),
    ("export", "RUN"),
}


@dataclass
class Case:
    """One command line to run in a fresh process, in its own empty directory `{case}`."""

    group: str
    name: str
    argv: list[str]
    refuse: bool = False  # the case must exit 2
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset the variable
    outputs: tuple[str, ...] = ()  # paths (relative to the case directory) the case may write
    copies: dict[str, Path] = field(default_factory=dict)  # name in the case directory -> fixture
    codes: tuple[int, ...] = (0, 2)
    check: Callable[[Path, subprocess.CompletedProcess], str] | None = None  # '' when it holds
    untouched: tuple[str, ...] = ()  # directories whose every path, size and mtime must stay equal
    hold: str | None = None  # a run directory whose lock this audit holds, as a live run would
    python: str | None = None  # run `python -c` this instead of `skipsearch` (the Python API)


@dataclass
class Outcome:
    case: Case
    code: int | None
    seconds: float
    failures: list[str]
    last_line: str


# -- the options, as the command line lists them ---------------------------------------------------
def help_options(command: str) -> list[tuple[str, bool]]:
    """(option, takes a value) of every option `skipsearch COMMAND --help` lists, `-h` aside."""
    text = subprocess.run(
        [sys.executable, "-m", "skipsearch", command, "--help"], capture_output=True, text=True, check=True
    ).stdout
    return options_in_help(text)


def options_in_help(text: str) -> list[tuple[str, bool]]:
    """The options of one command's help text: `  --name VALUE  help` takes a value, `  --name  help`
    does not."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^  (?:-\w, )?(--[a-z][\w-]*)(.*)$", line)
        if match and match.group(1) != "--help":
            rest = match.group(2)
            takes_value = rest.startswith(" ") and not rest.startswith("  ") and rest.strip() != ""
            found.append((match.group(1), takes_value))
    return found


def bound_of(command: str, option: str) -> Bound | None:
    name = BOUND_OF.get((command, option))
    by_option = {b.option: b for b in DECLARED if b.name not in BOUND_OF.values()}
    return next((b for b in DECLARED if b.name == name), None) if name else by_option.get(option)


def must_refuse(bound: Bound | None, text: str) -> bool:
    """Whether `text` is outside the option's declared bound (nothing is known of a string option)."""
    if bound is None:
        return False
    try:
        bound.parse(text)
    except ConfigError:
        return True
    return False


# -- the commands that work, to add one option to --------------------------------------------------
def base(command: str, model: str, fixtures: Path) -> tuple[list[str], dict[str, Path]]:
    """A command line that succeeds quickly, and the fixtures it needs copied into the case."""
    lines = {
        "models": "",
        "plan": "--model M",
        "measure": "--model M SMALL --skip 2",
        "speedup": "--alpha 0.8 --c 0.3",
        "profile": "--model M --repeats 2 --processes 1 --warmup 0 --context-lengths 16 --out p.json",
        "decode": "--model M SMALL --skip 2 --repeats 1",
        "run": "--model M SMALL --budget 2 --strategy random --out r",
        "compare": "--model M SMALL --budget 2 --seeds 1 --strategies random --out c",
        "report": "run",
        "export": "run",
    }
    words = [w for word in lines[command].split() for w in ({"M": [model], "SMALL": SMALL}.get(word, [word]))]
    copies = {"run": fixtures / "run"} if command in ("report", "export") else {}
    return [command, *words], copies


def with_option(argv: list[str], option: str, value: str | None) -> list[str]:
    """`argv` with `option` (and its value) set: replaced where given, added otherwise."""
    argv = list(argv)
    for dropped in (option, *CONFLICTS.get(option, ())):
        if dropped in argv:
            at = argv.index(dropped)
            del argv[at : at + 2]
    return argv + [option] + ([] if value is None else [value])


def outputs_of(argv: list[str]) -> tuple[str, ...]:
    """The paths a command line names for its outputs."""
    return tuple(argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("--out", "--json"))


def command_case(
    group: str, name: str, command: str, argv: list[str], refuse: bool, copies: dict[str, Path]
) -> Case:
    """A case of `command` line `argv`, writing where it names (`outputs_of`), with its own copy of
    the fixtures; a decode may also exit 1 (not lossless)."""
    return Case(
        group,
        name,
        argv,
        refuse,
        outputs=outputs_of(argv),
        copies=dict(copies),
        codes=(0, 1, 2) if command == "decode" else (0, 2),
    )


def option_cases(model: str, fixtures: Path) -> list[Case]:
    cases = []
    for command in COMMANDS:
        line, copies = base(command, model, fixtures)
        for option, takes_value in help_options(command):
            bound = bound_of(command, option)
            values = VALUES.items() if takes_value else [("flag", None)]
            for kind, value in values:
                argv = with_option(line, option, value)
                refuse = value is not None and must_refuse(bound, value)
                name = f"{command} {option}" + ("" if value is None else f" {value}")
                cases.append(command_case(f"value: {kind}", name, command, argv, refuse, copies))
    return cases


# -- paths ----------------------------------------------------------------------------------------
def path_cases(model: str, fixtures: Path) -> list[Case]:
    """Every path option with a file, a directory, a missing parent, an unwritable place and an
    over-long name. `file` and `dir` exist in every case directory."""
    kinds = {
        "a file": "file",
        "a directory": "dir",
        "a missing parent": "missing/parent/x",
        "an unwritable place": str(UNWRITABLE / "x"),
        "under a file": "file/x",
        "an over-long name": LONG_NAME,
    }
    cases = []
    for (command, option), want in {**OUTPUTS, **dict.fromkeys(INPUTS, "input")}.items():
        line, copies = base(command, model, fixtures)
        for kind, path in kinds.items():
            argv = [command, path] if option == "RUN" else with_option(line, option, path)
            # An output that is a new path in a directory that can be made is legal; the rest is not.
            legal = want != "input" and (
                path == "missing/parent/x"
                or (path == "dir" and want == "dir")
                or (path == "file" and want == "file")
            )
            if command == "measure" and option == "--prompts":
                legal = False  # none of these is a prompt file
            refuse = not legal
            if want == "input" and path == "dir" and option in ("--model",):
                refuse = True  # a directory without config.json
            cases.append(
                command_case(f"path: {kind}", f"{command} {option} {kind}", command, argv, refuse, copies)
            )
    return cases


# -- resume -----------------------------------------------------------------------------------------
RUN_CHANGES = [
    ("--seed", "1"),
    ("--space", "contiguous"),
    ("--strategy", "uniform"),
    ("--sampler", "gp"),
    ("--gamma-max", "4"),
    ("--objective", "acceptance"),
    ("--cost", "calibrated"),
    ("--temperature", "0.5"),
    ("--n-prompts", "2"),
    ("--max-prompt-tokens", "24"),
    ("--new-tokens", "6"),
    ("--prompt-seed", "1"),
    ("--mode", "self"),
    ("--round-gamma", "2"),
    ("--dtype", "float16"),
    ("--device", "meta"),
    ("--prompts", "stdlib"),
    ("--context", "64"),
    ("--extrapolate-context", None),
    ("--importance", "measured"),
    ("--draft-vocab", "8"),
    ("--kv-window", "8"),
    ("--pareto", None),
    ("--warm-start", None),
    ("--model", "smollm2-135m"),
]
COMPARE_CHANGES = [("--seeds", "2"), ("--strategies", "uniform"), ("--random-multiple", "2")]


def stored_config(run_dir: Path) -> dict:
    import yaml

    data = yaml.safe_load((run_dir / "run.yaml").read_text())
    return {key: value for key, value in data.items() if key != "provenance"}


def unchanged_but_budget(name: str, budget: int) -> Callable[[Path, subprocess.CompletedProcess], str]:
    """The resumed directory keeps every stored setting, the budget now `budget`, and its journal
    holds exactly the studies it had, each finished to the budget."""

    def check(case_dir: Path, result: subprocess.CompletedProcess) -> str:
        import yaml

        copy = case_dir / name
        before = yaml.safe_load((case_dir.parent.parent / "fixtures" / name / "run.yaml").read_text())
        after = yaml.safe_load((copy / "run.yaml").read_text())
        raised = budget != before["config"]["budget"]
        before["config"]["budget"] = budget
        for key in ("kind", "config", "compare"):
            if before.get(key) != after.get(key):
                return f"run.yaml's {key} changed on resume"
        changes = (after.get("provenance") or {}).get("resume_changes") or []
        if raised and not (changes and changes[-1]["to"] == budget):
            return "a raised budget is not recorded in run.yaml's resume_changes"
        studies = finished_trials(copy)
        expected = {"run": ["random"], "compare": ["random-s0"]}[name]
        if sorted(studies) != expected or any(n != budget for n in studies.values()):
            return f"studies after resume {studies}, expected {expected} with {budget} trials each"
        return ""

    return check


def finished_trials(run_dir: Path) -> dict[str, int]:
    """Each study's budget used: the distinct masks its feasible trials scored. A repeat of a scored
    mask, or an infeasible one, is a finished trial too, but costs no budget (`search.study`)."""
    return {
        name: len({t.user_attrs["mask"] for t in trials if scored(t)})
        for name, trials in complete(run_dir).items()
    }


def complete(run_dir: Path) -> dict[str, list[Any]]:
    """Each study's finished trials."""
    import optuna
    from optuna.trial import TrialState

    from skipsearch.search.study import journal_storage

    storage = journal_storage(run_dir)
    return {
        name: optuna.load_study(study_name=name, storage=storage).get_trials(states=(TrialState.COMPLETE,))
        for name in optuna.study.get_all_study_names(storage)
    }


def scored(trial: Any) -> bool:
    return bool(trial.user_attrs.get("feasible")) and not trial.user_attrs.get("repeat")


def lost_trials(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> list[str]:
    """The trials finished `before` a resume that are not finished, with the same values, after it."""
    kept = {(name, t.number, tuple(t.values)) for name, trials in after.items() for t in trials}
    return [
        f"{name}#{t.number}"
        for name, trials in before.items()
        for t in trials
        if (name, t.number, tuple(t.values)) not in kept
    ]


def resume_case(
    fixtures: Path,
    command: str,
    stored: str,
    group: str,
    name: str,
    words: list[str],
    refuse: bool,
    check: Callable[[Path, subprocess.CompletedProcess], str] | None = None,
) -> Case:
    """`COMMAND --out STORED --resume WORDS` over a copy of the stored run directory `STORED`."""
    return Case(
        group,
        name,
        [command, "--out", stored, "--resume", *words],
        refuse,
        outputs=(stored,),
        copies={stored: fixtures / stored},
        check=check,
    )


def resume_cases(fixtures: Path) -> list[Case]:
    restores, typed = "resume: restores every stored setting", "resume: a stored setting typed differently"
    cases = []
    compare_changes = [
        c for c in RUN_CHANGES if c[0] != "--strategy"
    ] + COMPARE_CHANGES  # compare has no --strategy
    for kind, changes in (("run", RUN_CHANGES), ("compare", compare_changes)):
        for option, value in changes:
            name = f"{kind} --resume {option} {value or ''}".strip()
            words = [option, *([] if value is None else [value])]
            cases.append(resume_case(fixtures, kind, kind, typed, name, words, True))
        cases += [
            resume_case(
                fixtures, kind, kind, restores, f"{kind} --resume --budget 3", ["--budget", "3"], False,
                unchanged_but_budget(kind, 3),
            ),
            resume_case(
                fixtures, kind, kind, typed, f"{kind} --resume --budget 1 (below the stored 2)",
                ["--budget", "1"], True,
            ),
            resume_case(
                fixtures, kind, kind, restores, f"{kind} --resume --seed 0 (as stored)", ["--seed", "0"],
                False, unchanged_but_budget(kind, 2),
            ),
        ]  # fmt: skip
    across = "resume: across kinds"
    cases += [
        resume_case(fixtures, "run", "compare", across, "run --resume of a compare", [], True),
        resume_case(fixtures, "compare", "run", across, "compare --resume of a run", [], True),
    ]
    return cases


# -- the environment ----------------------------------------------------------------------------------
def environment_cases(model: str, fixtures: Path) -> list[Case]:
    settings = {
        "HOME empty": {"SKIPSEARCH_CACHE": None, "HOME": ""},
        "HOME relative": {"SKIPSEARCH_CACHE": None, "HOME": "home"},
        "SKIPSEARCH_CACHE empty": {"SKIPSEARCH_CACHE": ""},
        "SKIPSEARCH_CACHE relative": {"SKIPSEARCH_CACHE": "cache"},
        "SKIPSEARCH_CACHE a file": {"SKIPSEARCH_CACHE": "{case}/file"},
        "SKIPSEARCH_CACHE under a file": {"SKIPSEARCH_CACHE": "{case}/file/cache"},
        "SKIPSEARCH_CACHE unwritable": {"SKIPSEARCH_CACHE": str(UNWRITABLE / "cache")},
    }
    cases = []
    for command in ("plan", "measure", "profile", "decode", "run", "compare"):
        line, _ = base(command, model, fixtures)
        for name, env in settings.items():
            cases.append(
                Case(
                    f"environment: {name}",
                    f"{command} with {name}",
                    line,
                    True,
                    env=env,
                    outputs=outputs_of(line),
                )
            )
    return cases


# -- files in bad formats ------------------------------------------------------------------------------
def format_cases(model: str, fixtures: Path) -> list[Case]:
    gguf = fixtures / "model.gguf"
    cases = []
    for size in (20, 5000, 2_000_000, 40_000_000):
        cut = fixtures / f"cut-{size}.gguf"
        if gguf.is_file():
            with gguf.open("rb") as handle:
                cut.write_bytes(handle.read(size))
            cases.append(
                Case(
                    "format: a GGUF cut short",
                    f"measure --model a GGUF cut at {size:,} bytes",
                    ["measure", "--model", str(cut), "--skip", "2", *SMALL],
                    True,
                )
            )
    (fixtures / "fake.gguf").write_bytes(b"not a gguf at all")
    cases.append(
        Case(
            "format: not a GGUF",
            "measure --model fake.gguf",
            ["measure", "--model", str(fixtures / "fake.gguf"), "--skip", "2"],
            True,
        )
    )
    for what, text in (
        ("empty", ""),
        ("damaged", '{"op_code": 0}\n'),
        ("not JSON", "{{{\n"),
        ("a list", "[1]\n"),
    ):
        run = fixtures / f"journal-{what.replace(' ', '-')}"
        shutil.copytree(fixtures / "run", run)
        (run / "optuna.journal").write_text(text)
        for command in (["report", "run"], ["export", "run"], ["run", "--out", "run", "--resume"]):
            # A journal whose records are not JSON is cut to its whole records (none here), and saved
            # beside it; a run resumes from that, as from an empty one. Whole JSON that is no Optuna
            # operation is refused.
            # Export reads best.json and only the journal's early exits, so an empty journal costs it
            # nothing; report reads the study itself.
            refuse = command[0] == "report" or what in ("damaged", "a list")
            cases.append(
                Case(
                    f"format: a journal {what}",
                    f"{command[0]} with a journal {what}",
                    command,
                    refuse,
                    outputs=("run",),
                    copies={"run": run},
                )
            )
    for what, text in (("empty", ""), ("not YAML", "{{{"), ("a list", "- 1\n"), ("a bad budget", None)):
        run = fixtures / f"runyaml-{what.replace(' ', '-')}"
        shutil.copytree(fixtures / "run", run)
        if text is None:
            text = (run / "run.yaml").read_text().replace("budget: 2", "budget: .nan")
        (run / "run.yaml").write_text(text)
        for command in (["report", "run"], ["run", "--out", "run", "--resume"]):
            cases.append(
                Case(
                    f"format: run.yaml {what}",
                    f"{command[0]} with run.yaml {what}",
                    command,
                    True,
                    outputs=("run",),
                    copies={"run": run},
                )
            )
    return cases


# -- combinations: options that depend on each other, lists with a duplicate, blank strings -------------
# A legal value of each option a combination sets; an option not here gets "1".
LEGAL = {
    "--strategy": "random",
    "--strategies": "random",
    "--sampler": "cmaes",
    "--importance": "measured",
    "--objective": "acceptance",
    "--mode": "shared-kv",
    "--tree": "2x1",
    "--context-lengths": "16",
    "--alphas": "0.8",
    "--table-alphas": "0.8",
    "--table-gammas": "2",
    "--top-p": "0.9",
    "--top-k": "5",
    "--temperature": "0",
    "--kv-window": "8",
    "--context": "64",
    "--draft-vocab": "8",
    "--cost": "closed-form",
    "--executor": "local",
    "--prompts": "stdlib",
    "--dtype": "float32",
    "--device": "cpu",
}
MAY_BE_EMPTY = ("--skip", "--attn-skip", "--mlp-skip")  # '' is the empty mask, as their help says
BLANKS = {"empty": "", "a space": " ", "a newline": "\n"}


def option_helps(text: str) -> dict[str, str]:
    """Each option of a help text with its whole help (the lines up to the next option)."""
    helps: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^  (?:-\w, )?(--[a-z][\w-]*)(.*)$", line)
        if match:
            current = match.group(1)
            helps[current] = match.group(2)
        elif current and line.startswith("    "):
            helps[current] += " " + line.strip()
        else:
            current = None
    return helps


def help_text(command: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "skipsearch", command, "--help"], capture_output=True, text=True, check=True
    ).stdout


def inapplicable(command: str, option: str, line: list[str]) -> bool:
    """Whether `settings_rules` says `option` does not apply in command line `line`: the audit
    reads the rules as data (what it checks is that the command line enforces them)."""
    from skipsearch.settings_rules import RULES, Applies

    dest = option.removeprefix("--").replace("-", "_")
    for rule in RULES:
        if not isinstance(rule, Applies) or rule.option != dest:
            continue
        for other in rule.others:
            flag = "--" + other.replace("_", "-")
            if other == "tier_set":
                return "--from" not in line
            if flag in line:
                value = line[line.index(flag) + 1] if flag not in FLAGS else True
                value = value.split(",") if other == "strategies" else value
                value = float(value) if other == "temperature" else value
                return not rule.holds(value)
        defaults = {"mode": "shared-kv", "objective": "speedup", "context": None, "table": False}
        defaults |= {"temperature": 0.0 if command == "decode" else 1.0, "strategy": "learned"}
        known = [o for o in rule.others if o in defaults]
        return bool(known) and not rule.holds(defaults[known[0]])
    return False


NOT_HOLDING = {
    "objective": "acceptance",
    "mode": "shared-kv",
    "temperature": "0",
    "strategy": "random",
    "strategies": "random",
}
FLAGS = {"--table", "--extrapolate-context", "--pareto", "--warm-start", "--random-weights"}


def combination_cases(model: str, fixtures: Path) -> list[Case]:
    """Every option whose help names another option of its command, given without that one
    (refused where the rules say it does not apply); every list option with one value twice;
    every string option empty, a space or a newline."""
    cases = []
    for command in COMMANDS:
        line, copies = base(command, model, fixtures)
        helps = option_helps(help_text(command))
        for option, takes_value in help_options(command):
            help_of = helps.get(option, "")
            value = LEGAL.get(option, "1") if takes_value else None
            for other in sorted(set(re.findall(r"--[a-z][\w-]*", help_of)) - {option}):
                if other not in helps:
                    continue
                argv = [w for i, w in enumerate(line) if w != other and (i == 0 or line[i - 1] != other)]
                argv = with_option(argv, option, value)
                cases.append(
                    command_case(
                        "combination: an option without the one its help names",
                        f"{command} {option} without {other}",
                        command,
                        argv,
                        inapplicable(command, option, argv),
                        copies,
                    )
                )
            # --alphas: acceptances by depth, which may repeat; --mask: a mask string, whose layer
            # lists --skip, --attn-skip and --mlp-skip cover
            comma = re.search(r"comma-\s*separated|\d,\d", help_of) is not None
            comma = comma and option not in ("--alphas", "--mask")
            is_list = comma or "..." in help_of.split("  ")[0]
            if takes_value and is_list:
                one = LEGAL.get(option, "1")
                twice = f"{one},{one}" if comma else None
                argv = with_option(line, option, twice) if twice else [*with_option(line, option, one), one]
                if option.startswith("--table-"):
                    argv = with_option(argv, "--table", None)
                cases.append(
                    Case(
                        "combination: a list with a duplicate",
                        f"{command} {option} twice",
                        argv,
                        True,
                        outputs=outputs_of(argv),
                        copies=dict(copies),
                    )
                )
            if takes_value and bound_of(command, option) is None and option not in MAY_BE_EMPTY:
                for kind, blank in BLANKS.items():
                    argv = with_option(line, option, blank)
                    cases.append(
                        Case(
                            f"combination: a string {kind}",
                            f"{command} {option} {kind}",
                            argv,
                            True,
                            copies=dict(copies),
                        )
                    )
    from skipsearch.settings_rules import RULES, Applies

    for command in COMMANDS:  # each rule of the table, typed where its other option does not hold
        line, copies = base(command, model, fixtures)
        options = dict(help_options(command))
        for rule in (r for r in RULES if isinstance(r, Applies)):
            option = "--" + rule.option.replace("_", "-")
            if option not in options:
                continue
            argv = with_option(line, option, LEGAL.get(option, "1") if options[option] else None)
            for other in rule.others:  # the other option at a value where the rule does not hold
                flag = "--" + other.replace("_", "-")
                if other in NOT_HOLDING and flag in options:
                    argv = with_option(argv, flag, NOT_HOLDING[other])
                    break
            cases.append(
                command_case(
                    "combination: an option where it does not apply",
                    f"{command} {option} (rule)",
                    command,
                    argv,
                    inapplicable(command, option, argv),
                    copies,
                )
            )
    for option, value in (("--warm-start", None), ("--sampler", "cmaes"), ("--importance", "measured")):
        for strategy in ("random", "uniform", "learned", "knapsack"):
            line, _ = base("run", model, fixtures)
            argv = with_option(with_option(line, "--strategy", strategy), option, value)
            cases.append(
                Case(
                    "combination: an option and a strategy",
                    f"run --strategy {strategy} {option}",
                    argv,
                    inapplicable("run", option, argv),
                    outputs=outputs_of(argv),
                )
            )
    return cases


# -- read-only commands: the run directory they read is unchanged --------------------------------------
def read_only_cases(fixtures: Path) -> list[Case]:
    torn = fixtures / "torn"
    if not torn.exists():
        shutil.copytree(fixtures / "run", torn)
        with (torn / "optuna.journal").open("a") as journal:
            journal.write('{"op_code": 4, "worker_id": "x", "trial_id"')  # a writer killed mid-record
    cases = []
    for name, argv, refuse, untouched, copies, hold in (
        ("export --out elsewhere", ["export", "run", "--out", "x"], False, ("run",), {"run": "run"}, None),
        (
            "export one compare study --out elsewhere",
            ["export", "compare", "--study", "random-s0", "--out", "x"],
            False,
            ("compare",),
            {"compare": "compare"},
            None,
        ),
        (
            "report a compare without --study",
            ["report", "compare"],
            True,
            ("compare",),
            {"compare": "compare"},
            None,
        ),
        ("report a torn journal", ["report", "run"], True, ("run",), {"run": "torn"}, None),
        ("export a torn journal", ["export", "run", "--out", "x"], True, ("run",), {"run": "torn"}, None),
        ("report a live run", ["report", "run"], True, ("run",), {"run": "run"}, "run"),
        ("export a live run", ["export", "run", "--out", "x"], True, ("run",), {"run": "run"}, "run"),
        (
            "report a compare study",
            ["report", "compare", "--study", "random-s0"],
            False,
            (),
            {"compare": "compare"},
            None,
        ),
    ):
        cases.append(
            Case(
                "read-only: the run it reads is unchanged",
                name,
                argv,
                refuse,
                outputs=outputs_of(argv) + (("compare/studies/random-s0",) if "--study" in argv else ()),
                copies={key: fixtures / value for key, value in copies.items()},
                untouched=untouched,
                hold=hold,
            )
        )
    return cases


# -- foreign files: a damaged model directory, prompts that are not valid Unicode ----------------------
def foreign_cases(model: str, fixtures: Path) -> list[Case]:
    broken = {}
    for damage in ("no tokenizer", "weights cut short", "config.json of {}"):
        directory = fixtures / f"model-{damage.split()[0]}"
        if not directory.exists():
            shutil.copytree(model, directory)
            if damage == "no tokenizer":
                for path in directory.glob("*token*"):
                    path.unlink()
            elif damage == "weights cut short":
                weights = directory / "model.safetensors"
                weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
            else:
                (directory / "config.json").write_text("{}")
        broken[damage] = directory
    bad = fixtures / "surrogate.jsonl"
    bad.write_text('{"prompt": "def f():\\n    return \\ud800"}\n')
    cases = []
    for command in ("plan", "measure", "decode", "run", "profile"):
        # float32: `--dtype auto` would first time bf16 against float32 on this CPU, seconds the load
        # guard under test does not need (and minutes on a busy machine)
        line = with_option(base(command, model, fixtures)[0], "--dtype", "float32")
        for damage, directory in broken.items():
            argv = with_option(line, "--model", str(directory))
            cases.append(
                Case(
                    f"foreign: a model directory with {damage}",
                    f"{command} --model with {damage}",
                    argv,
                    True,
                    codes=(2,),
                )
            )
        if command in ("measure", "decode", "run"):
            argv = with_option(with_option(line, "--prompts", str(bad)), "--n-prompts", "1")
            cases.append(
                Case(
                    "foreign: a prompt that is not valid Unicode",
                    f"{command} --prompts surrogate",
                    argv,
                    True,
                )
            )
    return cases


# -- the Python API: every public function with None, a wrong type, an out-of-range value ---------------
API_CALLS = {  # a call that works but for the argument under test (never reached: each case refuses)
    "search": ("skipsearch.search", {"model": "M", "out": "r", "budget": 2}),
    "decode": ("skipsearch.decode", {"model": "M", "draft": "a:1"}),
    "load_model": ("skipsearch.load_model", {"name": "M"}),
    "SearchResult.load": ("skipsearch.SearchResult.load", {"run_dir": "run"}),
    "Draft.parse": ("skipsearch.Draft.parse", {"text": "a:1", "num_layers": 6}),
    "SkipMask.parse": ("skipsearch.SkipMask.parse", {"text": "a:1", "num_layers": 6}),
}
API_SNIPPET = """
import sys, skipsearch
from skipsearch.errors import SkipsearchError
try:
    result = {call}(**{arguments})
except (TypeError, ValueError) as error:
    if not isinstance(error, SkipsearchError) or not str(error).startswith({keyword!r}):
        raise
    print("skipsearch: error:", error, file=sys.stderr)
    sys.exit(2)
"""


def api_cases(model: str) -> list[Case]:
    import inspect

    import skipsearch
    from skipsearch.options import BOUNDS

    cases = []
    for name, (call, working) in API_CALLS.items():
        function = functools.reduce(getattr, call.split(".")[1:], skipsearch)
        for parameter in inspect.signature(function).parameters.values():
            if parameter.name in ("self", "cls", "progress", "resume", "announce"):
                continue
            optional = parameter.default is None
            wrong = "x" if parameter.name in BOUNDS or parameter.name in ("num_layers",) else 12345
            if parameter.name in ("trees",):
                wrong = "2x1"  # a string where a list of shapes is expected
            misuse = {"a wrong type": wrong}
            if not optional:
                misuse["None"] = None
            if parameter.name in BOUNDS or parameter.name == "num_layers":
                misuse["out of range"] = -1
            for kind, value in misuse.items():
                arguments = {**working, parameter.name: value}
                arguments = {k: (model if v == "M" else v) for k, v in arguments.items()}
                cases.append(
                    Case(
                        f"api: {kind}",
                        f"{name}({parameter.name}={value!r})",
                        [],
                        True,
                        python=API_SNIPPET.format(
                            call=call, arguments=repr(arguments), keyword=parameter.name
                        ),
                    )
                )
    return cases


# -- running one case -----------------------------------------------------------------------------------
def snapshot(directory: Path) -> dict[str, tuple]:
    """Every path under `directory`: (size, mtime) of files, () of directories."""
    seen = {}
    for parent, folders, files in os.walk(directory):
        for name in folders:
            seen[os.path.relpath(os.path.join(parent, name), directory)] = ()
        for name in files:
            path = os.path.join(parent, name)
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            seen[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns)
    return seen


def error_lines(stderr: str) -> list[str]:
    """Stderr without progress bars and log records: what a refusal must keep to one line."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip()
        and "━" not in line
        and "%|" not in line
        and not re.match(r"(WARNING|INFO|DEBUG) ", line)
    ]


def run_case(case: Case, scratch: Path, number: int) -> Outcome:
    case_dir = scratch / "cases" / f"{number:04d}"
    case_dir.mkdir(parents=True)
    (case_dir / "file").write_text("a file that is not a run\n")
    (case_dir / "dir").mkdir()
    for name, fixture in case.copies.items():
        shutil.copytree(fixture, case_dir / name)
    env = {**os.environ, "HOME": str(scratch / "home"), "SKIPSEARCH_CACHE": str(scratch / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value.replace("{case}", str(case_dir))
    held = None
    if case.hold is not None:  # this process stands in for a live run: it holds the run's lock
        held = os.open(case_dir / case.hold / ".owner.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(held, fcntl.LOCK_EX)
        os.pwrite(held, f"{os.getpid()}\n".encode(), 0)
    before, home_before, root_before = snapshot(case_dir), snapshot(scratch / "home"), set(os.listdir("/"))
    temp_before = set(os.listdir(tempfile.gettempdir()))
    untouched = {name: snapshot(case_dir / name) for name in case.untouched}
    command = ["-c", case.python] if case.python else ["-m", "skipsearch", *case.argv]
    start = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            env=env,
            cwd=case_dir,
            timeout=TIMEOUT,
        )
        code: int | None = result.returncode
    except subprocess.TimeoutExpired as expired:
        result = subprocess.CompletedProcess(case.argv, -1, expired.stdout or "", expired.stderr or "")
        code = None
    seconds = time.monotonic() - start
    stderr = (
        result.stderr if isinstance(result.stderr, str) else (result.stderr or b"").decode(errors="replace")
    )
    if held is not None:
        os.close(held)
    failures = judge(case, code, stderr, case_dir, before)
    for name, tree in untouched.items():
        if snapshot(case_dir / name) != tree:
            failures.append(f"wrote into what it only reads: {name}")
    stray = {
        p for p in set(os.listdir(tempfile.gettempdir())) - temp_before if p.startswith(("ray", "skipsearch"))
    }
    if stray:
        failures.append(f"left in the system temp dir: {sorted(stray)[0]}")
    if snapshot(scratch / "home") != home_before:
        failures.append("wrote into HOME")
    if set(os.listdir("/")) != root_before:
        failures.append("wrote into /")
    if not failures and code == 0 and case.check is not None:
        why = case.check(case_dir, result)
        failures += [why] if why else []
    lines = error_lines(stderr)
    shutil.rmtree(case_dir, ignore_errors=True)
    return Outcome(case, code, seconds, failures, lines[-1] if lines else "")


def named(path: str, output: str) -> bool:
    """Whether `path` is what a case named `output` may write: the output itself, what is inside
    it, a directory made on the way to it, or the tables a profile writes beside itself."""
    return (
        path in (output, os.path.splitext(output)[0] + ".txt")
        or path.startswith(output + os.sep)
        or output.startswith(path + os.sep)
    )


def judge(case: Case, code: int | None, stderr: str, case_dir: Path, before: dict[str, tuple]) -> list[str]:
    failures = []
    if code is None:
        return ["hang"]
    if "Traceback" in stderr:
        failures.append("traceback")
    if code not in case.codes:
        failures.append(f"exit {code}")
    if code == 2:
        lines = error_lines(stderr)
        if len(lines) != 1 or not lines[0].startswith("skipsearch: error: "):
            failures.append("not one line")
    if case.refuse and code in (0, 1):
        failures.append("silent accept")
    after = snapshot(case_dir)
    allowed = tuple(os.path.normpath(p) for p in (*case.outputs, *case.copies) if not os.path.isabs(p))
    changed = [p for p in after if before.get(p) != after[p]] + [p for p in before if p not in after]
    # The owner's lock file records its holder's pid, and a journal torn by a killed writer is cut
    # to its whole records with the original kept beside it (docs/search.md): both by design.
    changed = [p for p in changed if not re.search(r"(^|/)(\.owner\.lock|optuna\.journal(\.torn-\d+)?)$", p)]
    if code == 2:
        if changed:
            failures.append(f"left behind: {changed[0]}")
    else:
        stray = [p for p in changed if not any(named(p, a) for a in allowed)]
        if stray:
            failures.append(f"wrote outside its outputs: {stray[0]}")
    return failures


# -- interrupts ------------------------------------------------------------------------------------------
def interrupt_outcomes(model: str, scratch: Path) -> list[Outcome]:
    """A run and a compare stopped by SIGINT, SIGTERM (as `kill PID` or a job scheduler sends it) and
    SIGKILL once a trial finished, then resumed: SIGINT and SIGTERM say how to resume; the resume
    finishes the budget with every trial kept."""
    outcomes = []
    env = {**os.environ, "HOME": str(scratch / "home"), "SKIPSEARCH_CACHE": str(scratch / "cache")}
    for kind in ("run", "compare"):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            work = scratch / "interrupts" / f"{kind}-{sig.name}"
            work.mkdir(parents=True)
            line, _ = base(kind, model, scratch / "fixtures")
            argv = with_option(with_option(line, "--budget", "6"), "--out", "out")
            start = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, "-m", "skipsearch", *argv],
                cwd=work,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell's `&` ignores it
            )
            journal = work / "out" / "optuna.journal"
            while time.monotonic() - start < TIMEOUT and process.poll() is None:
                if journal.is_file() and re.search(
                    r'"state":1\b', journal.read_text(errors="replace").replace(" ", "")
                ):
                    break
                time.sleep(0.05)
            process.send_signal(sig)
            _, stderr = process.communicate(timeout=TIMEOUT)
            failures = []
            if "Traceback" in stderr:
                failures.append("traceback")
            if sig != signal.SIGKILL and f"skipsearch {kind} --out out --resume" not in stderr:
                failures.append(f"no resume command on {sig.name}")
            name = f"{kind} stopped by {sig.name}"
            case = Case(f"interrupt: {sig.name}", name, argv)
            outcomes.append(
                Outcome(
                    case,
                    process.returncode,
                    time.monotonic() - start,
                    failures,
                    (error_lines(stderr) or [""])[-1],
                )
            )
            before = complete(work / "out") if journal.is_file() else {}
            resumed = subprocess.run(
                [sys.executable, "-m", "skipsearch", kind, "--out", "out", "--resume"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            failures = ["traceback"] if "Traceback" in resumed.stderr else []
            if resumed.returncode != 0:
                failures.append(f"exit {resumed.returncode}")
            else:
                trials = finished_trials(work / "out")
                if any(n != 6 for n in trials.values()) or not trials:
                    failures.append(f"budget used after resume {trials}, expected 6 each")
                if lost := lost_trials(before, complete(work / "out")):
                    failures.append(f"trials finished before the resume lost: {', '.join(lost)}")
            case = Case(
                f"interrupt: {sig.name}, then --resume",
                f"{name}, resumed",
                [kind, "--out", "out", "--resume"],
            )
            outcomes.append(
                Outcome(case, resumed.returncode, 0.0, failures, (error_lines(resumed.stderr) or [""])[-1])
            )
    return outcomes


# -- the whole audit -------------------------------------------------------------------------------------
def fixtures_in(scratch: Path, model: str) -> Path:
    """A finished run and a finished compare of the tiny model, and the embedded model's GGUF."""
    fixtures = scratch / "fixtures"
    fixtures.mkdir()
    env = {**os.environ, "HOME": str(scratch / "home"), "SKIPSEARCH_CACHE": str(scratch / "cache")}
    for kind in ("run", "compare"):
        line, _ = base(kind, model, fixtures)
        line = with_option(line, "--out", str(fixtures / kind))
        subprocess.run([sys.executable, "-m", "skipsearch", *line], env=env, check=True, capture_output=True)
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "from skipsearch.models.loading import resolve_gguf; from skipsearch.models.registry "
            "import REGISTRY; print(resolve_gguf(REGISTRY['smollm2-135m']))",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if found.returncode == 0:
        os.symlink(found.stdout.strip(), fixtures / "model.gguf")
    return fixtures


def table(outcomes: list[Outcome]) -> list[str]:
    groups: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        groups[outcome.case.group].append(outcome)
    lines = ["| class | cases | passed | failed | why (count) |", "|---|---:|---:|---:|---|"]
    for group, rows in sorted(groups.items()):
        reasons = collections.Counter(f.split(":")[0] for o in rows for f in o.failures)
        failed = sum(bool(o.failures) for o in rows)
        why = ", ".join(f"{r} ({n})" for r, n in reasons.most_common()) or "-"
        lines.append(f"| {group} | {len(rows)} | {len(rows) - failed} | {failed} | {why} |")
    failed = sum(bool(o.failures) for o in outcomes)
    lines.append(f"| **all** | **{len(outcomes)}** | **{len(outcomes) - failed}** | **{failed}** | |")
    return lines


def report(outcomes: list[Outcome], minutes: float, retried: int = 0) -> str:
    reasons = collections.Counter(f.split(":")[0] for o in outcomes for f in o.failures)
    slowest = max(outcomes, key=lambda o: o.seconds)
    lines = [
        "# Bad input, audited (issues 20, 51 and 61)",
        "",
        f"`.venv/bin/python experiments/audit_inputs.py`, {time.strftime('%Y-%m-%d')}: "
        f"{len(outcomes)} cases, each "
        f"`skipsearch` in a fresh process with a {TIMEOUT} s limit, in {minutes:.0f} minutes on "
        f"{os.cpu_count()} cores; the slowest case took {slowest.seconds:.0f} s ({slowest.case.name}). "
        f"{retried} case(s) ran past the limit beside another and were run again alone (a hang only if "
        "again past it).",
        "",
        "Failures by kind over all cases: "
        + (", ".join(f"{reason}: {count}" for reason, count in reasons.most_common()) or "none")
        + f". Tracebacks: {reasons['traceback']}; hangs: {reasons['hang']}; silent accepts: "
        f"{reasons['silent accept']}; files written outside the named paths and the cache: "
        f"{reasons['wrote outside its outputs'] + reasons['wrote into HOME'] + reasons['wrote into /']}; "
        f"left behind by a failed command: {reasons['left behind']}; writes by a read-only command: "
        f"{reasons['wrote into what it only reads']}; left in the system temp dir: "
        f"{reasons['left in the system temp dir']}.",
        "",
        *table(outcomes),
        "",
    ]
    failed = [o for o in outcomes if o.failures]
    if failed:
        lines += ["## Failures", ""]
        lines += [
            f"- `{o.case.name}` (exit {o.code}): {'; '.join(o.failures)}. Last line: `{o.last_line[:200]}`"
            for o in failed
        ]
        lines.append("")
    lines += ["## A refusal of each class", ""]
    shown = set()
    for outcome in sorted(outcomes, key=lambda o: not o.case.refuse):  # a declared bound's refusal first
        if outcome.case.group not in shown and outcome.code == 2 and outcome.last_line:
            shown.add(outcome.case.group)
            lines.append(f"- {outcome.case.group}, `{outcome.case.name}`: `{outcome.last_line[:240]}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    global TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default %(default)s)")
    parser.add_argument("--only", help="run only the cases whose name matches this regular expression")
    parser.add_argument("--out", default=str(ROOT / "results" / "trust" / "audit.md"), help="report file")
    parser.add_argument(
        "--limit",
        type=int,
        default=TIMEOUT,
        help="seconds a case may take before it counts as a hang (default %(default)s; raise it on a "
        "machine other work keeps busy, where a slow case is not a hang; the report states it)",
    )
    parser.add_argument(
        "--keep", type=Path, help="copy the interrupt cases' run directories here when one fails (to inspect)"
    )
    args = parser.parse_args(argv)
    TIMEOUT = args.limit
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="audit-") as work:
        scratch = Path(work)
        (scratch / "home").mkdir()
        model = tiny_model_dir(scratch / "tiny-model")
        fixtures = fixtures_in(scratch, model)
        cases = (
            option_cases(model, fixtures)
            + path_cases(model, fixtures)
            + resume_cases(fixtures)
            + environment_cases(model, fixtures)
            + format_cases(model, fixtures)
            + combination_cases(model, fixtures)
            + read_only_cases(fixtures)
            + foreign_cases(model, fixtures)
            + api_cases(model)
        )
        if args.only:
            cases = [c for c in cases if re.search(args.only, c.name)]
        print(f"{len(cases)} cases, {args.jobs} at a time", flush=True)
        outcomes: list[Outcome] = []
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_case, case, scratch, number) for number, case in enumerate(cases)]
            for future in concurrent.futures.as_completed(futures):
                outcome = future.result()
                outcomes.append(outcome)
                if outcome.failures:
                    print(
                        f"FAIL {outcome.case.name}: {'; '.join(outcome.failures)} | {outcome.last_line[:99]}",
                        flush=True,
                    )
                if len(outcomes) % 50 == 0:
                    print(f"{len(outcomes)}/{len(cases)} done", flush=True)
        # A case past the limit while another ran beside it may be slow, not hung: it runs again,
        # alone, and counts as a hang only if it runs past the limit again.
        hung = [o for o in outcomes if o.failures == ["hang"]]
        retried = {id(o): run_case(o.case, scratch, len(cases) + n) for n, o in enumerate(hung)}
        outcomes = [retried.get(id(o), o) for o in outcomes]
        for outcome in retried.values():
            verdict = "; ".join(outcome.failures) or "passed"
            print(f"retried alone: {outcome.case.name}: {verdict}", flush=True)
        if not args.only or re.search(args.only, "interrupt"):
            interrupts = interrupt_outcomes(model, scratch)
            outcomes += interrupts
            if args.keep and any(o.failures for o in interrupts):
                shutil.copytree(scratch / "interrupts", args.keep, dirs_exist_ok=True)
    order = {case.name: i for i, case in enumerate(cases)}
    outcomes.sort(key=lambda o: order.get(o.case.name, len(order)))
    text = report(outcomes, (time.monotonic() - started) / 60, len(hung))
    if not args.only:
        Path(args.out).write_text(text)
    print("\n".join(table(outcomes)))
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
