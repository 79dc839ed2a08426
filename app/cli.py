"""The `cachescope` command: no arguments opens the desktop app; subcommands run headless.

Subcommands are the modules of `app.commands`; each defines NAME, HELP, `add_arguments`
and `run(args) -> int`. Exit status: 0 success, 2 bad input (one line on stderr), 1
internal error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from types import ModuleType

import app.commands
from app import version
from app.runtime import allocator
from engine.core.errors import InputError, one_line


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"cachescope: error: {message}\n")
        raise SystemExit(2)


class _Version(argparse.Action):
    """--version: the version is read when asked for (importlib.metadata costs every other
    run, the window's start among them, about 30 ms)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        sys.stdout.write(f"cachescope {version()}\n")  # where argparse's own version action writes
        parser.exit()


def command_modules() -> list[ModuleType]:
    mods = []
    for info in sorted(pkgutil.iter_modules(app.commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"app.commands.{info.name}"))
    return mods


def command_module(name: str) -> ModuleType | None:
    """The module of subcommand `name` (its file is the name with "_" for "-"), imported
    alone; None if there is none."""
    module = name.replace("-", "_")
    if module.startswith("_") or module not in {i.name for i in pkgutil.iter_modules(app.commands.__path__)}:
        return None
    mod = importlib.import_module(f"app.commands.{module}")
    return mod if mod.NAME == name else None


def build_parser(modules: list[ModuleType] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `modules` only (one command's run: the others'
    imports, such as the trace readers, are not the window's to wait for)."""
    parser = _Parser(prog="cachescope", description="Inspect the caches of LLM inference.")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in command_modules() if modules is None else modules:
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    allocator.tune()  # before the command allocates: freed large arrays go back to the system
    if not argv:
        argv = ["gui"]
    only = command_module(argv[0])
    parser = build_parser(None if only is None else [only])
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except InputError as exc:
        sys.stderr.write(f"cachescope: error: {one_line(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("cachescope: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence of a command line
        if args.debug:
            raise
        sys.stderr.write(f"cachescope: internal error: {type(exc).__name__}: {one_line(str(exc))} (run with --debug for details)\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
