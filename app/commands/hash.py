"""`cachescope hash`: the block hashes a prompt gets, as a vLLM server (or Cachescope) computes them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app.commands._common import positive_int, print_json, seed_int
from engine.core import validation
from engine.core.errors import InputError
from engine.core.hashing import HASH_NAMES

NAME = "hash"
HELP = "print the block hashes of a prompt (vllm-sha256 / vllm-sha256-cbor equal a vLLM server's, sglang-sha256 SGLang's)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", metavar="FILE", help="token ids: a JSON list, {\"tokens\": [...]}, or whitespace-separated")
    src.add_argument("--messages", metavar="FILE", help="a conversation (OpenAI-style messages JSON), rendered "
                                                        "with the model's chat template")
    src.add_argument("--text", metavar="TEXT", help="text sent as one user message through the chat template")
    p.add_argument("--model", metavar="M", default=None,
                   help="tokenizer and chat template for --messages/--text (default: the bundled model)")
    p.add_argument("--block-size", type=positive_int, required=True, metavar="N", help="the server's block size")
    p.add_argument("--salt", default=None, metavar="S", help="the request's cache_salt")
    p.add_argument("--hash", choices=HASH_NAMES, default="vllm-sha256",
                   help="hash scheme (default vllm-sha256: vLLM's default prefix_caching_hash_algo; sglang-sha256: "
                        "SGLang's page hash, whose events carry the first 8 bytes signed)")
    p.add_argument("--hash-seed", default=None, metavar="SEED",
                   help="with a vllm-* hash: the server's PYTHONHASHSEED, if it was started with one")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="with sha256/xxh3: Cachescope's hash seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_tokens(path: str) -> list[int]:
    """Token ids from a file: a JSON list, an object with `tokens`, or plain whitespace/comma-separated ids."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({type(exc).__name__})") from None
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        value: Any = validation.loads(stripped, path, 1)  # depth, digits and NaN limits of every reader
        if isinstance(value, dict):
            value = value.get("tokens", value.get("token_ids"))
    else:
        try:
            value = [int(t) for t in stripped.replace(",", " ").split()]
        except ValueError:
            raise InputError(f"{path}: expected token ids (whole numbers)") from None
    return list(validation.id_list(value, path, None, "tokens", validation.MAX_TOKEN_ID))


def _prompt_tokens(args: argparse.Namespace) -> list[int]:
    if args.tokens is not None:
        if args.model is not None:
            raise InputError("--model applies to --messages and --text; --tokens are already token ids")
        return read_tokens(args.tokens)
    from engine.analysis.diff import request_from_messages, request_from_text
    from engine.model.loader import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    if args.text is not None:
        return list(request_from_text(tokenizer, args.text).token_ids)
    from engine.analysis.conversations import load_conversation_file, messages_of

    path = Path(args.messages)
    if not path.is_file():
        raise InputError(f"{args.messages}: no such file")
    convs = load_conversation_file(path)
    if not convs:
        raise InputError(f"{args.messages}: the file holds no conversation")
    return list(request_from_messages(tokenizer, messages_of(convs[0])).token_ids)


def run(args: argparse.Namespace) -> int:
    from engine.core.hashing import BlockHasher

    if args.hash_seed is not None and not args.hash.startswith("vllm-"):
        raise InputError("--hash-seed applies to the vllm-sha256 and vllm-sha256-cbor hashes")
    tokens = _prompt_tokens(args)
    hasher = BlockHasher(args.hash, args.seed, "", args.hash_seed)
    bs = args.block_size
    chain = hasher.hash_chain(tokens, bs, args.salt)
    # event_hash: the integer the server's events carry; event_key: it as Cachescope shows
    # every remote hash (16 hex digits, the bytes of the digest the server took it from)
    blocks = [{"index": i, "hash": h.hex(), "event_hash": hasher.event_int(h), "event_key": hasher.event_key(h).hex(),
               "tokens": tokens[i * bs:(i + 1) * bs]} for i, h in enumerate(chain)]
    result = {"hash": args.hash, "block_size": bs, "blocks": blocks}
    if args.json:
        print_json(result)
        return 0
    out = sys.stdout
    out.write(f"{len(tokens)} tokens, {len(blocks)} full block(s) of {bs} ({args.hash}"
              f"{', salt ' + repr(args.salt) if args.salt else ''})\n")
    for b in blocks:
        out.write(f"  {b['index']:>4}  {b['hash']}  event {b['event_hash']} ({b['event_key']})\n")
    rest = len(tokens) - len(blocks) * bs
    if rest:
        out.write(f"  the last {rest} token(s) fill no block and are never cached\n")
    return 0
