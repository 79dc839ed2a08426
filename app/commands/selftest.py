"""`cachescope selftest`: prove that this installation can run its model, as a new user would.

It loads the default model into a fresh, empty user cache folder (so the first-start
conversion of the bundled GGUF really runs), holds a two-turn chat on the prefix-cache
engine, and checks that the second turn reused the physical blocks of the first and that
its output equals a run of the same prompt without reuse. It prints one JSON line and exits
0; a failed check is one line on stderr and exit status 1. The desktop bundle's smoke test
runs it, and so does the test suite from the source tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from app.commands._common import positive_int, print_json
from engine.resources import resource_path

NAME = "selftest"
HELP = "load the bundled model in a fresh cache folder, run a two-turn chat, check the prefix cache reused it"

# Greedy logits with and without reuse agree to float32 rounding (DESIGN 4.5).
LOGIT_TOLERANCE = 1e-4
_QUESTION_ID = 81  # an MT-bench writing question with a follow-up: a real two-turn chat
_SYSTEM = "You are a helpful assistant."


class SelftestFailed(Exception):
    """A check did not hold; the message is the one line the user sees."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", default=None,
                   help="local HF folder, .gguf file or hub id (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="use this cache folder instead of a fresh temporary one (kept afterwards)")
    p.add_argument("--max-new-tokens", type=positive_int, default=24, metavar="N",
                   help="tokens generated per turn (default 24)")
    p.add_argument("--block-size", type=positive_int, default=16, metavar="N", help="tokens per block (default 16)")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        with _user_folders(args.cache_dir) as cache:
            report = selftest(args.model, cache, args.max_new_tokens, args.block_size)
    except SelftestFailed as exc:
        sys.stderr.write(f"cachescope: selftest failed: {exc}\n")
        return 1
    report["total_s"] = round(time.monotonic() - started, 2)
    print_json(report)
    return 0


@contextmanager
def _user_folders(cache_dir: str | None) -> Iterator[Path]:
    """Point the user cache and data folders somewhere fresh for the duration of the test.

    Both CACHESCOPE_CACHE_DIR (which the loader reads first) and the XDG folders (which
    platformdirs reads) are overridden, so neither the user's converted models nor their
    session database are read or touched.
    """
    names = ("CACHESCOPE_CACHE_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME")
    saved = {name: os.environ.get(name) for name in names}
    scratch = Path(tempfile.mkdtemp(prefix="cachescope-selftest-"))
    cache = Path(cache_dir).expanduser().resolve() if cache_dir else scratch / "cache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        os.environ["CACHESCOPE_CACHE_DIR"] = str(cache)
        os.environ["XDG_CACHE_HOME"] = str(scratch / "xdg-cache")
        os.environ["XDG_DATA_HOME"] = str(scratch / "xdg-data")
        os.environ["XDG_CONFIG_HOME"] = str(scratch / "xdg-config")
        yield cache
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)


def _questions() -> list[str]:
    with resource_path("traces", "mt_bench_question.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["question_id"] == _QUESTION_ID:
                return list(row["turns"])
    raise SelftestFailed(f"the shipped MT-bench file has no question {_QUESTION_ID}")


def _seconds_since_process_start() -> float | None:
    """Wall time since this process started (what a user waits for), if psutil can tell."""
    try:
        import psutil
    except ImportError:
        return None
    return round(time.time() - psutil.Process().create_time(), 2)


def selftest(model: str | None, cache: Path, max_new_tokens: int, block_size: int) -> dict[str, Any]:
    """Run every check; return the report or raise SelftestFailed naming the first that failed."""
    from engine.model.loader import load_model, resolve_model
    from engine.model.runner import ModelRunner

    from app import version

    source = resolve_model(model)
    was_empty = not any(cache.iterdir())
    t0 = time.monotonic()
    try:
        loaded = load_model(model)
    except Exception as exc:  # the one line must say that loading, not chatting, failed
        raise SelftestFailed(f"cannot load the model {source.location}: {exc}") from None
    load_s = time.monotonic() - t0
    ready_after_start_s = _seconds_since_process_start()
    converted = source.kind == "gguf" and (cache / "models").is_dir()
    if source.kind == "gguf" and not converted:
        raise SelftestFailed(f"the model was not converted into the fresh cache folder {cache}")

    runner = ModelRunner(loaded, num_blocks=256, block_size=block_size, seed=0)
    questions = _questions()
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": questions[0]}]
    first = runner.chat(messages, max_new_tokens=max_new_tokens)
    messages += [{"role": "assistant", "content": first.output_text.strip()},
                 {"role": "user", "content": questions[1]}]
    prompt = runner.render_chat(messages)
    second = runner.generate(prompt, max_new_tokens=max_new_tokens)
    cold = runner.generate(prompt, max_new_tokens=max_new_tokens, use_cache=False)

    # The blocks the first prompt filled completely are the ones the second must find again.
    num_shared = first.num_prompt_tokens // block_size
    if first.prompt_token_ids[:num_shared * block_size] != prompt[:num_shared * block_size]:
        raise SelftestFailed("the chat template rendered the first turn differently inside the second")
    num_reused = second.num_cached_tokens // block_size
    if num_shared == 0:
        raise SelftestFailed(f"the first prompt ({first.num_prompt_tokens} tokens) fills no {block_size}-token block")
    if num_reused < num_shared or second.block_ids[:num_shared] != first.block_ids[:num_shared]:
        raise SelftestFailed(f"the second turn reused {num_reused} blocks, not the first turn's {num_shared} "
                             f"prompt blocks")
    if second.output_token_ids != cold.output_token_ids:
        raise SelftestFailed("the second turn's output with reuse differs from the same prompt computed afresh")
    diffs = [float((a - b).abs().max()) for a, b in ((second.first_logits, cold.first_logits),
                                                     (second.last_logits, cold.last_logits))
             if a is not None and b is not None and a.shape == b.shape]
    if not diffs:
        raise SelftestFailed("the runner returned no logits to compare")
    if max(diffs) > LOGIT_TOLERANCE:
        raise SelftestFailed(f"logits with and without reuse differ by {max(diffs):.2e} (> {LOGIT_TOLERANCE:g})")

    return {
        "ok": True,
        "version": version(),
        "frozen": bool(getattr(sys, "frozen", False)),
        "model": loaded.name,
        "model_file": source.location,
        "cache_dir": str(cache),
        "fresh_cache": was_empty,
        "converted_now": was_empty and converted,
        "load_model_s": round(load_s, 2),
        "model_ready_after_start_s": ready_after_start_s,
        "block_size": block_size,
        "turns": [{"turn": i, "prompt_tokens": r.num_prompt_tokens, "cached_tokens": r.num_cached_tokens,
                   "computed_tokens": r.num_computed_tokens, "output_tokens": len(r.output_token_ids),
                   "ttft_ms": round(r.ttft_ms, 1)}
                  for i, r in enumerate((first, second), 1)],
        "reused_blocks": num_reused,
        "first_turn_prompt_blocks": num_shared,
        "outputs_identical": True,
        "max_logit_diff": max(diffs),
    }
