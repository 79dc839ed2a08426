"""Finding a server's event endpoints: SGLang's `/server_info` descriptor and `--servers` files.

SGLang 0.5.23 reports its publisher under `kv_events` in `/server_info`
(`runtime_context.describe_kv_events_publisher`): `publisher`, `endpoint_host` (may be a
wildcard: the worker URL's host is dialled instead), `endpoint_port_base` (rank r listens
on base + r), `topic`, `block_size`, `dp_size`, and `replay_endpoint_port_base` when the
replay socket is tcp. A servers file has one `name endpoint [replay]` per line (`#`
comments, blank lines). No Qt; the HTTP read is bounded in size and time.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import InputError
from engine.remote.subscriber import check_endpoint

MAX_INFO_BYTES = 4 << 20
MAX_SERVERS = 4096
MAX_DP = 1024
_WILDCARDS = ("", "*", "0.0.0.0", "::", "[::]")


@dataclass(slots=True, frozen=True)
class ServerEndpoint:
    """One stream to subscribe to: the server it belongs to, its rank, its sockets."""

    server: str
    endpoint: str
    replay_endpoint: str | None = None
    rank: int = 0


@dataclass(slots=True, frozen=True)
class DescribedServer:
    """What `/server_info` says: one endpoint per data-parallel rank, the topic, the block size."""

    server: str
    endpoints: tuple[ServerEndpoint, ...]
    topic: str
    block_size: int | None


def _int(value: object, name: str, lo: int, hi: int, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InputError(f"{where}: kv_events.{name} must be a whole number from {lo} to {hi}, not {value!r}")
    return value


def describe(url: str, info: object) -> DescribedServer:
    """The endpoints of a server whose `/server_info` answered `info` (a parsed JSON object)."""
    where = f"{url}/server_info"
    if not isinstance(info, dict):
        raise InputError(f"{where} is not a JSON object")
    kv = info.get("kv_events")
    if kv is None:
        raise InputError(f"{where} describes no KV-event publisher (start the server with --kv-events-config)")
    if not isinstance(kv, dict):
        raise InputError(f"{where}: kv_events is not an object")
    if kv.get("publisher", "zmq") != "zmq":
        raise InputError(f"{where}: the publisher is {kv.get('publisher')!r}; only zmq can be attached to")
    parsed = urllib.parse.urlsplit(url)
    url_host = parsed.hostname or ""
    host = kv.get("endpoint_host", "*")
    if not isinstance(host, str) or len(host) > 255:
        raise InputError(f"{where}: kv_events.endpoint_host is not a host name")
    if host in _WILDCARDS:
        host = url_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    base = _int(kv.get("endpoint_port_base"), "endpoint_port_base", 1, 65535, where)
    dp = _int(kv.get("dp_size", 1), "dp_size", 1, MAX_DP, where)
    replay_base = kv.get("replay_endpoint_port_base")
    if replay_base is not None:
        replay_base = _int(replay_base, "replay_endpoint_port_base", 1, 65535, where)
    if base + dp - 1 > 65535 or (replay_base is not None and replay_base + dp - 1 > 65535):
        raise InputError(f"{where}: {dp} ranks from port {base} run past port 65535")
    topic = kv.get("topic", "")
    if not isinstance(topic, str):
        raise InputError(f"{where}: kv_events.topic is not a string")
    block_size = kv.get("block_size")
    if block_size is not None:
        block_size = _int(block_size, "block_size", 1, 1 << 20, where)
    server = parsed.netloc or url
    endpoints = []
    for r in range(dp):
        ep = check_endpoint(f"tcp://{host}:{base + r}")
        replay = check_endpoint(f"tcp://{host}:{replay_base + r}") if replay_base is not None else None
        endpoints.append(ServerEndpoint(server, ep, replay, r))
    return DescribedServer(server, tuple(endpoints), topic, block_size)


def fetch_server_info(url: str, timeout: float = 5.0) -> DescribedServer:
    """GET `url`/server_info and describe its publisher; InputError (one sentence) if not."""
    if not url.startswith(("http://", "https://")):
        raise InputError(f"{url!r} is not an http:// address of a server")
    if not math.isfinite(timeout) or timeout <= 0:
        raise InputError("the timeout must be a positive number of seconds")
    base = url.rstrip("/")
    if base.endswith("/server_info"):
        base = base[: -len("/server_info")]
    try:
        with urllib.request.urlopen(base + "/server_info", timeout=timeout) as resp:  # noqa: S310 - http(s) only
            raw = resp.read(MAX_INFO_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise InputError(f"{base}/server_info answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"cannot read {base}/server_info ({reason})") from None
    if len(raw) > MAX_INFO_BYTES:
        raise InputError(f"{base}/server_info is larger than {MAX_INFO_BYTES >> 20} MiB")
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{base}/server_info is not JSON") from None
    return describe(base, info)


def read_servers(path: str | Path) -> list[ServerEndpoint]:
    """A servers file: `name endpoint [replay]` per line; InputError naming the line if not."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError(f"{str(path)!r} is not a regular file" if p.exists() else f"{str(path)!r}: no such file")
        with p.open("rb") as f:
            raw = f.read(MAX_INFO_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{str(path)!r}: cannot read it ({type(exc).__name__})") from None
    if len(raw) > MAX_INFO_BYTES:
        raise InputError(f"{str(path)!r} is larger than {MAX_INFO_BYTES >> 20} MiB; a servers file is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{str(path)!r} is not UTF-8 text") from None
    out: list[ServerEndpoint] = []
    names: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise InputError(f"{str(path)!r} line {n}: expected 'name endpoint [replay]', not {len(words)} word(s)")
        name, endpoint = words[0], words[1]
        if name in names:
            raise InputError(f"{str(path)!r} line {n}: the server {name!r} is named twice")
        try:
            check_endpoint(endpoint)
            replay = check_endpoint(words[2]) if len(words) == 3 else None
        except InputError as exc:
            raise InputError(f"{str(path)!r} line {n}: {exc}") from None
        names.add(name)
        out.append(ServerEndpoint(name, endpoint, replay))
        if len(out) > MAX_SERVERS:
            raise InputError(f"{str(path)!r} names more than {MAX_SERVERS} servers")
    if not out:
        raise InputError(f"{str(path)!r} names no server")
    return out
