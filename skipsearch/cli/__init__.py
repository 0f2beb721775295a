"""`skipsearch` command line: one module per sub-command, each with `register` and `run`.

Sub-command modules import torch and friends inside `run`, so light commands (`speedup`,
`report`) start instantly. The settings are judged as a whole before any work
(`skipsearch.settings_rules`); every `SkipsearchError` becomes one line on stderr and exit code 2;
SIGINT and SIGTERM stop a command the same way, with the command that resumes it.

- `models`: the registry aliases, their depth, source and offline availability.
- `plan`: the kernel plan a model runs on this device, with the timings behind each choice.
- `measure`: the acceptance profile and predicted speedup of one skip mask.
- `speedup`: the closed-form speedup for a given acceptance and cost (arithmetic only).
- `profile`: measure this device's latency profile of a model, for the calibrated cost model.
- `decode`: real self-speculative decoding of one draft against the baselines.
- `decode_tiers`: `decode --from tiers.json`, a tier set against the baselines.
- `decode_tables`: what the two decode commands print (speed per decoder, round time by phase).
- `run`: search which layers a model's draft should skip, into a run directory.
- `compare`: search strategies side by side at the same budget and seeds.
- `report`: rewrite a run directory's tables and plots from its journal (no model).
- `export`: engine configs for a run's best draft (no model), or a llama.cpp draft cut from its GGUF.
- `common`: the options shared by the commands that touch a model (model, prompts, mask).
- `executor_options`: the options of where masks are evaluated (this process or Ray workers).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from skipsearch.errors import ModelLoadError, SkipsearchError
from skipsearch.models.registry import unknown_model
from skipsearch.store import check_environment, matplotlib_beside_cache

COMMANDS = ("models", "plan", "measure", "speedup", "profile", "decode", "run", "compare", "report", "export")


_NOT_TYPED = object()
WRITES_NOTHING = ("speedup",)  # arithmetic only: no cache, no library that writes under HOME


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad option as every other error is reported: one line naming the
    problem and the fix, exit code 2 (argparse's own report starts with the whole usage block)."""

    def error(self, message: str) -> NoReturn:
        argument, _, rest = message.partition(": ")
        option = argument.removeprefix("argument ").split("/")[-1]
        if argument.startswith("argument ") and rest.startswith(f"{option} "):
            message = rest  # a check of `skipsearch.options`: it names the option and the fix
        else:
            message = f"{message} (see `{self.prog} --help`)"
        print(f"skipsearch: error: {message}", file=sys.stderr)
        sys.exit(2)


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = OneLineParser(
        prog="skipsearch", description="Find which layers a self-speculative draft should skip."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"skipsearch.cli.{name}").register(sub)
    return parser, sub.choices


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def typed_options(argv: list[str], args: argparse.Namespace) -> frozenset[str]:
    """The options the user typed, as opposed to left at their default (even when typed equal
    to it): `run --resume` refuses a typed setting its stored run would ignore. Found by parsing
    `argv` again with every default of the command replaced by a marker."""
    parser, commands = _build()
    options = [dest for dest in vars(args) if dest != "handler"]
    commands[args.command].set_defaults(**dict.fromkeys(options, _NOT_TYPED))
    again = vars(parser.parse_args(argv))
    return frozenset(dest for dest in options if again[dest] is not _NOT_TYPED)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0), or a bad option, reported in one line (2)
        return int(stop.code or 0)
    args.typed = typed_options(argv, args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    main_thread = threading.current_thread() is threading.main_thread()  # signals go to it alone
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None  # as a Ctrl-C does
    try:
        judge_command(args)  # the settings as a whole, before any work
        model = getattr(args, "model", None)
        if isinstance(model, str) and (problem := unknown_model(model)):
            raise ModelLoadError(problem)  # before the model's heavy imports
        if args.command not in WRITES_NOTHING:  # before any import that writes under HOME
            check_environment()
            matplotlib_beside_cache()
        return int(args.handler(args) or 0)
    except SkipsearchError as error:
        print(f"skipsearch: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the environment refused a file no check could foresee (a full disk)
        where = f"{error.filename}: " if error.filename else ""
        print(
            f"skipsearch: error: {where}{error.strerror or error}: check the path, its permissions and "
            "the free space",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM (`Terminated`): 128 + the signal
        terminated = isinstance(stop, Terminated)
        stopped = "terminated" if terminated else "interrupted"
        print(f"skipsearch: {stopped}{_resume_hint(args)}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where the command is, as a Ctrl-C's KeyboardInterrupt is, so it unwinds
    the same way through the search and the run owner (every finished trial kept, or what a new
    run made before its first removed) and `main` prints the command that continues it."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated


# How the few options whose dest is not their spelling are shown in a refusal.
SPELLED = {"from_path": "--from", "tier_set": "--from", "run_dir": "RUN", "run": "RUN"}
_NOT_SETTINGS = ("handler", "typed", "verbose", "command", "resume_dir")


def judge_command(args: argparse.Namespace) -> None:
    """The command's settings judged as a whole (`settings_rules.judge`), before any work: each
    option as parsed, plus what the rules read that no single option says (a compare's strategies
    as a list, whether `--from` names a tier set)."""
    from skipsearch.settings_rules import Names, judge

    settings = {dest: value for dest, value in vars(args).items() if dest not in _NOT_SETTINGS}
    if isinstance(settings.get("strategies"), str):
        settings["strategies"] = [s.strip() for s in settings["strategies"].split(",") if s.strip()] or [
            settings["strategies"]
        ]
    if "require_graphs" in settings:
        settings["tier_set"] = bool(settings.get("from_path")) and _is_tier_set(settings["from_path"])
    judge(settings, getattr(args, "typed", frozenset()), Names(spelled=SPELLED))


def _is_tier_set(path: str) -> bool:
    from skipsearch.tiers.manifest import is_tier_manifest

    try:
        return path.strip() != "" and is_tier_manifest(Path(path))
    except ValueError:  # not text: the one-mask reader says what is wrong with it
        return False


def _resume_hint(args: argparse.Namespace) -> str:
    """What an interrupted `run` or `compare` leaves: the command that continues it, or that
    nothing was kept (a new run stopped before its first trial removes what it made)."""
    from skipsearch.store import is_run

    out = getattr(args, "resume_dir", None)
    if out is None:
        return ""
    if is_run(out):
        again = f"skipsearch {args.command} --out {shlex.quote(str(out))} --resume"
        return f": every finished trial is kept; continue with `{again}`"
    return ": no trial had finished, so nothing was kept; run the command again"
