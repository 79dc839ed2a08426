"""Reading WEKA kv-cache-tester traces: one JSON document per agentic conversation.

A document holds `requests` (each with `t`, `model`, `in`, `out` and the `hash_ids` of its
full blocks) and nested `type: "subagent"` entries with their own `requests`, timed from
the sub-agent's start. Each sub-agent is a stream of its own; under `hash_id_scope:
"global"` every stream (and every conversation of a folder) shares one id space, so one
cache. What the published hit rates are lives in `engine.analysis.weka`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from engine.core import validation as v
from engine.core.errors import TraceError
from engine.core.trace import TraceRequest

FORMAT = "weka"
MAX_FILE_BYTES = v.MAX_FILE_BYTES
GLOBAL_SCOPE = "global"
_KINDS = ("s", "n")  # streaming or not


@dataclass(slots=True, frozen=True)
class WekaRequest:
    """One request of a conversation: top level (`agent` None) or of a sub-agent."""

    conversation: str  # the document's `id`
    agent: str | None  # the sub-agent's `agent_id`, None at the top level
    position: int  # index within its stream
    time: float  # seconds from the conversation's start (a sub-agent's `t` plus its own)
    model: str
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    kind: str  # "s" streaming, "n" not
    api_time: float
    think_time: float
    stop: str

    @property
    def stream(self) -> str:
        return self.conversation if self.agent is None else f"{self.conversation}/{self.agent}"

    @property
    def id(self) -> str:
        return f"{self.stream}#{self.position}"

    @property
    def is_subagent(self) -> bool:
        return self.agent is not None


@dataclass(slots=True, frozen=True)
class Subagent:
    agent_id: str
    subagent_type: str | None
    time: float
    num_requests: int
    models: tuple[str, ...]


@dataclass(slots=True, frozen=True)
class WekaTrace:
    """A conversation: its requests in time order (sub-agents' among them) and its settings."""

    id: str
    path: str
    block_size: int
    hash_id_scope: str
    models: tuple[str, ...]
    tool_tokens: int | None
    system_tokens: int | None
    requests: tuple[WekaRequest, ...]
    subagents: tuple[Subagent, ...]

    @property
    def top_level(self) -> list[WekaRequest]:
        return [r for r in self.requests if r.agent is None]


def looks_like_weka(obj: Any) -> bool:
    """The keys a kv-cache-tester document starts with (what the sniffer asks)."""
    return isinstance(obj, dict) and isinstance(obj.get("requests"), list) and (
        "hash_id_scope" in obj or ("block_size" in obj and "models" in obj))


def read_weka(path: str | Path) -> WekaTrace:
    """Parse one kv-cache-tester file; a malformed field raises `TraceError` naming it."""
    name = str(path)
    data = v.read_bytes(path, "WEKA trace", MAX_FILE_BYTES)
    if not data.strip():
        raise TraceError(name, None, None, "the file is empty")
    return parse_weka(v.loads(data, name, 1), name)


def parse_weka(doc: Any, name: str) -> WekaTrace:
    if not isinstance(doc, dict):
        raise TraceError(name, None, None, f"expected a JSON object (a kv-cache-tester conversation), got {v._type(doc)}")
    cid = doc.get("id", Path(name).stem)
    if not isinstance(cid, str) or not cid:
        raise TraceError(name, None, "id", f"expected a non-empty string, got {cid!r}"[:200])
    if "block_size" not in doc:
        raise TraceError(name, None, "block_size", "missing; a kv-cache-tester trace names the tokens per hash id")
    block_size = v.integer(doc["block_size"], name, None, "block_size", 1, 1 << 20)
    scope = doc.get("hash_id_scope", GLOBAL_SCOPE)
    if not isinstance(scope, str) or not scope:
        raise TraceError(name, None, "hash_id_scope", f"expected a string such as 'global', got {scope!r}"[:200])
    models = _models(doc, name, "models")
    tool = _opt_int(doc, "tool_tokens", name, "tool_tokens")
    system = _opt_int(doc, "system_tokens", name, "system_tokens")
    raw = doc.get("requests")
    if not isinstance(raw, list):
        raise TraceError(name, None, "requests", f"expected a list of requests, got {v._type(raw)}")
    out: list[WekaRequest] = []
    subs: list[Subagent] = []
    top = 0
    for i, item in enumerate(raw):
        where = f"requests[{i}]"
        if not isinstance(item, dict):
            raise TraceError(name, None, where, f"expected an object, got {v._type(item)}")
        if item.get("type") == "subagent":
            subs.append(_subagent(item, name, where, cid, block_size, out))
            continue
        out.append(_request(item, name, where, cid, None, top, 0.0, block_size))
        top += 1
    if not out:
        raise TraceError(name, None, "requests", "the conversation holds no requests")
    order = sorted(range(len(out)), key=lambda j: (out[j].time, j))  # stable: file order on ties
    return WekaTrace(cid, name, block_size, scope, models, tool, system, tuple(out[j] for j in order), tuple(subs))


def _subagent(item: dict[str, Any], name: str, where: str, cid: str, block_size: int,
              out: list[WekaRequest]) -> Subagent:
    agent = item.get("agent_id")
    if not isinstance(agent, str) or not agent:
        raise TraceError(name, None, f"{where}.agent_id", f"expected a non-empty string, got {agent!r}"[:200])
    start = v.number(item.get("t", 0), name, None, f"{where}.t", 0)
    kind = item.get("subagent_type")
    if kind is not None and not isinstance(kind, str):
        raise TraceError(name, None, f"{where}.subagent_type", f"expected a string, got {kind!r}"[:200])
    raw = item.get("requests")
    if not isinstance(raw, list):
        raise TraceError(name, None, f"{where}.requests", f"expected a list of requests, got {v._type(raw)}")
    models = _models(item, name, f"{where}.models") if "models" in item else ()
    for j, sub in enumerate(raw):
        fld = f"{where}.requests[{j}]"
        if not isinstance(sub, dict):
            raise TraceError(name, None, fld, f"expected an object, got {v._type(sub)}")
        if sub.get("type") == "subagent":
            raise TraceError(name, None, f"{fld}.type", "a sub-agent inside a sub-agent is not part of the format")
        out.append(_request(sub, name, fld, cid, agent, j, start, block_size))
    return Subagent(agent, kind, start, len(raw), models)


def _request(item: dict[str, Any], name: str, where: str, cid: str, agent: str | None, position: int,
             start: float, block_size: int) -> WekaRequest:
    for key in ("t", "model", "in", "hash_ids"):
        if key not in item:
            raise TraceError(name, None, f"{where}.{key}", "missing; every request needs t, model, in and hash_ids")
    t = v.number(item["t"], name, None, f"{where}.t", 0)
    model = item["model"]
    if not isinstance(model, str) or not model:
        raise TraceError(name, None, f"{where}.model", f"expected a model name, got {model!r}"[:200])
    n_in = v.integer(item["in"], name, None, f"{where}.in", 1, v.MAX_TOKENS)
    n_out = v.integer(item.get("out", 0), name, None, f"{where}.out", 0, v.MAX_TOKENS)
    ids = v.id_list(item["hash_ids"], name, None, f"{where}.hash_ids", v.MAX_HASH_ID)
    if len(ids) > n_in // block_size:
        raise TraceError(name, None, f"{where}.hash_ids",
                         f"{len(ids)} ids are more full blocks of {block_size} than {n_in} tokens hold")
    kind = item.get("type", "s")
    if kind not in _KINDS:
        raise TraceError(name, None, f"{where}.type", f"expected 's', 'n' or 'subagent', got {kind!r}"[:200])
    api = v.number(item.get("api_time", 0), name, None, f"{where}.api_time", 0)
    think = v.number(item.get("think_time", 0), name, None, f"{where}.think_time", 0)
    stop = item.get("stop", "")
    if not isinstance(stop, str):
        raise TraceError(name, None, f"{where}.stop", f"expected a string, got {stop!r}"[:200])
    return WekaRequest(cid, agent, position, start + t, model, n_in, n_out, ids, kind, api, think, stop)


def _models(obj: dict[str, Any], name: str, fld: str) -> tuple[str, ...]:
    raw = obj.get("models", [])
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise TraceError(name, None, fld, f"expected a list of model names, got {v._type(raw)}")
    return tuple(raw)


def _opt_int(obj: dict[str, Any], key: str, name: str, fld: str) -> int | None:
    return None if obj.get(key) is None else v.integer(obj[key], name, None, fld, 0, v.MAX_TOKENS)


# ---------------------------------------------------------------------------- a folder
def weka_files(folder: str | Path) -> list[Path]:
    """The `.json` files of a folder that are kv-cache-tester conversations, by name; a
    folder without one is refused."""
    p = Path(folder)
    if not p.is_dir():
        raise TraceError(str(folder), None, None, "is not a folder")
    files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".json" and f.is_file())
    if not files:
        raise TraceError(str(folder), None, None, "is a folder that holds no .json kv-cache-tester traces; open a "
                                                  "trace, conversation or session file, or a folder of such traces")
    return files


def read_weka_folder(folder: str | Path) -> list[WekaTrace]:
    """Every conversation of a folder; they must agree on the block size."""
    traces = [read_weka(f) for f in weka_files(folder)]
    sizes = {t.block_size for t in traces}
    if len(sizes) > 1:
        raise TraceError(str(folder), None, "block_size",
                         f"the traces use different block sizes ({', '.join(map(str, sorted(sizes)))}); replay one size at a time")
    ids = [t.id for t in traces]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TraceError(str(folder), None, "id", f"two files hold conversation {dup!r}")
    return traces


def merged_requests(traces: Iterable[WekaTrace], include_subagents: bool = True) -> list[WekaRequest]:
    """The requests of several conversations as concurrent users: all start at time 0 and
    run in time order (ties in folder order, then file order)."""
    keyed = []
    for n, trace in enumerate(traces):
        for j, r in enumerate(trace.requests):
            if include_subagents or r.agent is None:
                keyed.append(((r.time, n, j), r))
    keyed.sort(key=lambda kv: kv[0])
    return [r for _, r in keyed]


def to_trace_requests(requests: Iterable[WekaRequest], scopes: dict[str, str] | None = None,
                      keyed_by_model: bool = True) -> list[TraceRequest]:
    """The engine's block-level requests: the model as part of the key (unless
    `keyed_by_model` is False, the what-if of one cache shared across models) and, for a
    conversation whose scope is not global, the conversation as the salt."""
    out = []
    for i, r in enumerate(requests):
        scope = (scopes or {}).get(r.conversation, GLOBAL_SCOPE)
        salt = None if scope == GLOBAL_SCOPE else r.conversation
        out.append(TraceRequest(i, 1, r.id, salt, None, None, r.hash_ids, r.input_length, r.output_length,
                                r.time, r.model if keyed_by_model else None))
    return out


def weka_conversation(docs: list[tuple[int, Any]], name: str) -> tuple[str, list[TraceRequest], dict[str, Any], int]:
    """A kv-cache-tester file as the parts of a trace conversation for `sessions import`
    (title, requests, settings, line): its requests (sub-agents' among them, in time order),
    their models kept in the settings, since a stored trace line has no model column."""
    if len(docs) != 1:
        raise TraceError(name, docs[1][0], None, "a kv-cache-tester trace is one JSON document; this file holds more")
    trace = parse_weka(docs[0][1], name)
    requests = to_trace_requests(trace.requests, {trace.id: trace.hash_id_scope})
    models = list(trace.models) or sorted({r.model for r in trace.requests})
    for r in trace.requests:
        if r.model not in models:
            models.append(r.model)
    settings = {"block_size": trace.block_size, "source_format": FORMAT, "hash_id_scope": trace.hash_id_scope,
                "models": models, "request_models": [models.index(r.model) for r in trace.requests],
                "streams": sorted({r.stream for r in trace.requests})}
    return trace.id, requests, settings, docs[0][0]


def with_models(requests: list[TraceRequest], settings: dict[str, Any]) -> list[TraceRequest]:
    """Stored trace requests with the models `weka_conversation` kept in the settings put
    back (the requests unchanged when the settings hold none)."""
    models = settings.get("models")
    index = settings.get("request_models")
    if not isinstance(models, list) or not isinstance(index, list) or len(index) != len(requests):
        return requests
    from dataclasses import replace

    return [replace(r, model=models[i]) if isinstance(i, int) and 0 <= i < len(models) else r
            for r, i in zip(requests, index)]


def load_weka(path: str | Path) -> list[WekaTrace]:
    """A kv-cache-tester file, or a folder of them, as a list of conversations."""
    return read_weka_folder(path) if Path(path).is_dir() else [read_weka(path)]


def load_weka_requests(path: str | Path, include_subagents: bool = True,
                       keyed_by_model: bool = True) -> list[TraceRequest]:
    """The engine requests of a kv-cache-tester file or folder, in time order."""
    traces = load_weka(path)
    return to_trace_requests(merged_requests(traces, include_subagents),
                             {t.id: t.hash_id_scope for t in traces}, keyed_by_model)
