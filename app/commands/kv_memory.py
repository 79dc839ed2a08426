"""`cachescope kv-memory`: KV cache bytes per token, per layer and in total."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import non_negative_int, print_json
from engine.core.errors import InputError

NAME = "kv-memory"
HELP = "KV cache memory of a model, a preset or a config.json for N tokens (per layer, total, formula)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.model.kv_memory import DTYPE_BYTES, PRESETS

    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="M", help="load a model (local HF folder, .gguf file, hub id, or "
                        "'default' for the bundled SmolLM2) and measure its real KV tensors too")
    source.add_argument("--preset", metavar="NAME", help=f"a known model: {', '.join(PRESETS)}")
    source.add_argument("--config", metavar="config.json", help="a Hugging Face config.json")
    p.add_argument("--tokens", type=non_negative_int, required=True, metavar="N", help="tokens held in the cache")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default=None,
                   help="bytes per value (default: the model's dtype with --model, else bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.model.kv_memory import (kv_memory_report, normalise_dtype, preset,
                                  shape_from_config, shape_from_config_file)

    if args.preset:
        report = kv_memory_report(preset(args.preset), args.tokens, args.dtype or "bf16")
    elif args.config:
        report = kv_memory_report(shape_from_config_file(args.config), args.tokens, args.dtype or "bf16")
    else:
        from engine.model.kv_pool import measure_loaded_model  # torch: only when a model is measured
        from engine.model.loader import load_model

        loaded = load_model(args.model or None)
        dtype = args.dtype or normalise_dtype(str(loaded.dtype))
        shape = shape_from_config(loaded.model.config.to_dict(), name=loaded.name)
        report = kv_memory_report(shape, args.tokens, dtype)
        measured = measure_loaded_model(loaded, args.tokens, dtype)
        if measured.get("pool_dtype") is not None:
            measured["matches_formula"] = (measured["total_bytes"] == report["total_bytes"]
                                           and measured["per_layer_bytes"] == report["per_layer_bytes"])
        if measured["model_dtype"] == report["dtype"]:
            measured["dynamic_cache_matches_formula"] = (
                measured["dynamic_cache_bytes_per_token"] == report["bytes_per_token"])
        report["measured"] = measured
        if measured.get("matches_formula") is False:
            raise InputError("measured KV bytes differ from the formula; this model's cache layout is not "
                             "plain per-head K and V")
    if args.json:
        print_json(report)
    else:
        _print_human(report)
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _print_human(r: dict) -> None:
    out = sys.stdout
    out.write(f"{r['name']}: {r['layers']} layers, {r['kv_heads']} KV heads, head dim {r['head_dim']}, "
              f"{r['dtype']} ({r['attention']})\n")
    out.write(f"{r['bytes_per_token']:,} bytes per token; {r['tokens']:,} tokens -> {_human(r['total_bytes'])} "
              f"({_human(r['per_layer_bytes'][0] if r['per_layer_bytes'] else 0)} per layer)\n")
    out.write(f"formula: {r['formula']}\n         {r['formula_values']}\n")
    if "note" in r:
        out.write(f"note: {r['note']}\n")
    m = r.get("measured")
    if m:
        if m.get("pool_dtype"):
            out.write(f"measured pool tensors: {m['total_bytes']:,} bytes "
                      f"({'equals' if m.get('matches_formula') else 'differs from'} the formula)\n")
        out.write(f"measured DynamicCache: {m['dynamic_cache_bytes_per_token']:,} bytes per token "
                  f"in {m['model_dtype']}\n")
