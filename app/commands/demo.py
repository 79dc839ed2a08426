"""`cachescope demo NAME`: run one guided demo headless and print what it shows."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.commands._common import _int, print_json
from app.commands._publish import Publishing, add_publish_arguments
from engine.core.errors import InputError

NAME = "demo"
HELP = "run a guided demo of one cache behaviour (--list shows them all)"
MAX_THREADS = 256


def thread_count(text: str) -> int:
    """--threads: a whole number of torch intra-op threads, 1 to MAX_THREADS."""
    return _int(text, 1, MAX_THREADS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?", help="the demo to run (see --list)")
    p.add_argument("--list", action="store_true", help="list the demos, one line each")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--threads", type=thread_count, default=None, metavar="N",
                   help="torch intra-op threads for the model (default: torch's own, one per physical core); "
                        "on a machine shared with other work, fewer threads than cores avoid oversubscription")
    add_publish_arguments(p)


def run(args: argparse.Namespace) -> int:
    from engine.demos import get_demo, list_demos, run_demo

    if args.list:
        demos = list_demos()
        if args.json:
            print_json(demos)
        else:
            width = max(len(d["name"]) for d in demos)
            sys.stdout.write("".join(f"{d['name']:<{width}}  {d['summary']}\n" for d in demos))
        return 0
    if not args.name:
        raise InputError("name a demo to run, or pass --list to see them")
    get_demo(args.name)  # a bad name fails before any model is loaded
    threads_before = None
    if args.threads is not None:
        import torch

        threads_before = torch.get_num_threads()
        torch.set_num_threads(args.threads)
    publishing = Publishing(args)
    try:
        env = None
        if publishing.active:
            from engine.demos.env import DemoEnv

            def on_engine(engine: Any) -> None:
                # Runners and managers have a prefix cache to publish; a bare bus does not.
                if hasattr(engine, "block_size") and hasattr(engine, "events"):
                    publishing.hook(engine.events, engine.block_size)

            env = DemoEnv(on_engine=on_engine)
        result = run_demo(args.name, env)
    finally:
        publishing.close()
        if threads_before is not None:
            import torch

            torch.set_num_threads(threads_before)  # a command run in-process leaves the caller's setting
    if args.json:
        print_json(result)
    else:
        _print_human(result)
    return 0


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= 60 else text[:57] + "..."


def _print_human(r: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"{r['title']}\n\n{r['explanation']}\n\n")
    for step in r["steps"]:
        details = ", ".join(f"{k}={_short(v)}" for k, v in step.items() if k not in ("step", "action") and v is not None)
        out.write(f"{step['step']:>3}. {step['action']}\n")
        if details:
            out.write(f"     {details}\n")
    out.write("\nfindings:\n")
    for key, value in r["findings"].items():
        out.write(f"  {key}: {_short(value)}\n")
