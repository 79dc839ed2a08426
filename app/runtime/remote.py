"""The app attached to a running vLLM server: options, the controller, stream health.

`AttachOptions` is what File > Attach to vLLM... asks for (validated into one sentence);
`RemoteController` runs one `engine.remote` subscriber per data-parallel rank off the GUI
thread and emits their Cachescope events on one bus wired to the bridge, so every view
shows the remote pool exactly as it shows the embedded engine's. Health (batches,
refilled, missed, malformed, lag) is polled for the status bar; a server restart starts a
fresh pool and says so. The dialog lives in `app.dialogs.attach_dialog`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, QTimer, Signal

from app.runtime.context import AppContext, engine_info
from engine.core.events import EventBus

HASH_SCHEMES = ("vllm-sha256", "vllm-sha256-cbor")
MAX_RANKS = 64
HEALTH_MS = 250
_TCP = re.compile(r"^tcp://(?P<host>\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d+)$")
SETTINGS_KEY = "attach/options"


@dataclass(slots=True, frozen=True)
class AttachOptions:
    """How to reach a vLLM server's KV-event stream (its `--kv-events-config`)."""

    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str = "tcp://127.0.0.1:5558"  # "" when the server has none
    topic: str = "kv-events"
    data_parallel_size: int = 1
    bind: bool = False  # the server was given a concrete host, so it connects and we bind
    hash_scheme: str = "vllm-sha256"
    tokenizer: str = ""  # a local Hugging Face folder; "" = the default model's tokenizer
    block_size: int = 16

    def validated(self) -> AttachOptions:
        """These options, stripped; ValueError with one sentence when they cannot work."""
        opts = replace(self, endpoint=self.endpoint.strip(), replay_endpoint=self.replay_endpoint.strip(),
                       topic=self.topic.strip(), tokenizer=self.tokenizer.strip())
        _check_endpoint(opts.endpoint, "The endpoint")
        if opts.replay_endpoint:
            _check_endpoint(opts.replay_endpoint, "The replay endpoint")
            if opts.replay_endpoint == opts.endpoint:
                raise ValueError("The replay endpoint must differ from the endpoint (vLLM binds them to two ports).")
        if not 1 <= opts.data_parallel_size <= MAX_RANKS:
            raise ValueError(f"Data-parallel ranks must be between 1 and {MAX_RANKS}, not {opts.data_parallel_size}.")
        if opts.data_parallel_size > 1:
            for ep in (opts.endpoint, opts.replay_endpoint):
                if ep and not ep.startswith("tcp://"):
                    raise ValueError(f"{ep} has no port to add a rank to; data-parallel ranks need tcp:// endpoints.")
                m = _TCP.match(ep) if ep else None
                if m and int(m["port"]) + opts.data_parallel_size - 1 > 65535:
                    raise ValueError(f"{ep} plus {opts.data_parallel_size - 1} ranks passes port 65535.")
        m = _TCP.match(opts.endpoint)
        if opts.bind and m and m["host"] not in ("*", "0.0.0.0", "127.0.0.1", "localhost"):
            raise ValueError(f"To bind, give a local address such as tcp://*:{m['port']}, not {m['host']}.")
        if not opts.bind and m and m["host"] == "*":
            raise ValueError(f"{opts.endpoint} is a wildcard: connect to the server's host "
                             f"(tcp://HOST:{m['port']}), or tick Bind when the server connects to us.")
        if opts.hash_scheme not in HASH_SCHEMES:
            raise ValueError(f"The hash scheme must be one of {', '.join(HASH_SCHEMES)}, not {opts.hash_scheme!r}.")
        if not 1 <= opts.block_size <= 4096:
            raise ValueError(f"The block size must be between 1 and 4096 tokens, not {opts.block_size}.")
        if opts.tokenizer:
            folder = Path(opts.tokenizer).expanduser()
            if not folder.is_dir():
                raise ValueError(f"The tokenizer folder {folder} does not exist.")
            if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
                raise ValueError(f"{folder} holds no tokenizer (no tokenizer.json or tokenizer_config.json).")
        return opts

    def rank_endpoints(self) -> list[tuple[int, str, str]]:
        """(rank, endpoint, replay endpoint) per data-parallel rank: rank r adds r to both ports."""
        out = []
        for rank in range(self.data_parallel_size):
            out.append((rank, _plus_port(self.endpoint, rank), _plus_port(self.replay_endpoint, rank)))
        return out

    def save(self, settings: QSettings) -> None:
        for key, value in asdict(self).items():
            settings.setValue(f"{SETTINGS_KEY}/{key}", value)

    @classmethod
    def load(cls, settings: QSettings) -> AttachOptions:
        """The options last used (defaults for any not saved or unreadable)."""
        values: dict[str, Any] = {}
        for key, default in asdict(cls()).items():
            raw = settings.value(f"{SETTINGS_KEY}/{key}", default)
            try:
                if isinstance(default, bool):
                    values[key] = raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1")
                elif isinstance(default, int):
                    values[key] = int(raw)
                else:
                    values[key] = str(raw)
            except (TypeError, ValueError):
                values[key] = default
        return cls(**values)


def _check_endpoint(endpoint: str, what: str) -> None:
    if not endpoint:
        raise ValueError(f"{what} is empty; vLLM's default is tcp://*:5557 on the server, tcp://HOST:5557 here.")
    if endpoint.startswith(("ipc://", "inproc://")):
        if len(endpoint.split("://", 1)[1]) == 0:
            raise ValueError(f"{what} {endpoint} names no path.")
        return
    m = _TCP.match(endpoint)
    if m is None:
        raise ValueError(f"{what} {endpoint!r} is not a ZMQ endpoint such as tcp://127.0.0.1:5557.")
    port = int(m["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} {endpoint} has port {port}; ports run from 1 to 65535.")


def _plus_port(endpoint: str, rank: int) -> str:
    if not endpoint or rank == 0:
        return endpoint
    m = _TCP.match(endpoint)
    return f"tcp://{m['host']}:{int(m['port']) + rank}"


@dataclass(slots=True)
class StreamHealth:
    """The stream as the status bar reports it, summed over ranks."""

    num_batches: int = 0
    num_refilled: int = 0
    num_missed: int = 0
    num_malformed: int = 0
    num_restarts: int = 0
    lag_s: float | None = None  # now minus the newest batch's server time (clock skew included)
    ranks: int = 0
    connected: bool = False
    last_error: str = ""

    def text(self) -> str:
        if self.lag_s is None:
            lag = "lag —"
        else:
            lag = f"lag {self.lag_s * 1000:.0f} ms" if self.lag_s < 10 else f"lag {self.lag_s:,.0f} s"
        return (f"vLLM · {self.num_batches:,} batches · {self.num_refilled:,} refilled · {self.num_missed:,} missed"
                f" · {self.num_malformed:,} malformed · {lag}")


def sum_health(streams: list[Any], connected: bool) -> StreamHealth:
    """One `StreamHealth` from the engine's per-stream health (`engine.remote` StreamHealth)."""
    h = StreamHealth(ranks=len(streams), connected=connected)
    lags = [s.lag_s for s in streams if s.lag_s is not None]
    for s in streams:
        h.num_batches += s.batches
        h.num_refilled += s.refilled
        h.num_missed += s.missed
        h.num_malformed += s.malformed
        h.num_restarts += s.restarts
        if s.last_error:
            h.last_error = s.last_error
    h.lag_s = min(lags) if lags else None
    return h


class RemoteController(QObject):
    """Attaches the app to a vLLM server; the views follow the remote pool through the bridge.

    The engine's `Attachment` runs one subscriber thread per rank and numbers every
    converted event on one bus, which the bridge listens to like an embedded engine's.
    Signals (GUI thread): `sigAttached(AttachOptions)`, `sigDetached()`, `sigHealth(StreamHealth)`
    every HEALTH_MS while attached, `sigMessage(str)` for what the user must read (a restart,
    a refill that timed out), `sigTokenizer(object)` when the chosen tokenizer has loaded.
    """

    sigAttached = Signal(object)
    sigDetached = Signal()
    sigHealth = Signal(object)
    sigMessage = Signal(str)
    sigTokenizer = Signal(object)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.options: AttachOptions | None = None
        self.attachment: Any = None
        self.tokenizer: Any = None
        self.last_health = StreamHealth()
        self._timer = QTimer(self, interval=HEALTH_MS)
        self._timer.timeout.connect(self._poll)
        self.sigTokenizer.connect(self._set_tokenizer)
        # another subject (a trace, a chat) ends the attach
        ctx.sigSubjectChanged.connect(lambda subject: subject.kind != "server" and self.detach())

    @property
    def is_attached(self) -> bool:
        return self.options is not None

    # ------------------------------------------------------------------ attach / detach
    def attach(self, options: AttachOptions) -> AttachOptions:
        """Subscribe to every rank; raises ValueError (one sentence) for bad options or sockets."""
        from engine.remote.attachment import Attachment
        from engine.remote.attachment import AttachOptions as EngineOptions

        opts = options.validated()
        self.detach()
        engine_opts = EngineOptions(endpoints=(opts.endpoint,),
                                    replay_endpoints=(opts.replay_endpoint,) if opts.replay_endpoint else (),
                                    topic=opts.topic, data_parallel_size=opts.data_parallel_size, bind=opts.bind)
        bus = EventBus()
        attachment = Attachment(engine_opts, on_notice=self._on_notice, events=bus)
        # The views reset to an empty remote pool before the first batch can arrive.
        self.ctx.attach_events(bus, self._engine_info(opts))
        try:
            attachment.start()
        except Exception as exc:
            attachment.stop()
            self.ctx.bridge.detach()
            text = str(exc).rstrip(".")
            raise ValueError(f"Could not attach to {opts.endpoint}: {text}.") from None
        self.attachment = attachment
        self.options = opts
        self._timer.start()
        self._load_tokenizer(opts.tokenizer)
        self.sigAttached.emit(opts)
        return opts

    def detach(self) -> None:
        """Stop every subscriber; the views keep the pool as it was, now offline."""
        if self.options is None:
            return
        self.attachment.stop()
        self._poll()
        self._timer.stop()
        self.ctx.bridge.flush(everything=True)
        self.ctx.bridge.detach()
        self.options = None
        self.sigDetached.emit()

    def _engine_info(self, opts: AttachOptions) -> dict[str, Any]:
        ranks = f" ×{opts.data_parallel_size} ranks" if opts.data_parallel_size > 1 else ""
        info = engine_info(block_size=opts.block_size, num_blocks=0, model=f"vLLM {opts.endpoint}{ranks}")
        info.update(remote=True, endpoint=opts.endpoint, hash_scheme=opts.hash_scheme,
                    data_parallel_size=opts.data_parallel_size)
        return info

    def _on_notice(self, pool: Any, kind: str, message: str) -> None:
        # A subscriber thread: the signal is queued to the GUI thread.
        if kind == "restart":
            self.sigMessage.emit(f"The vLLM server ({pool.source}) restarted: its batches began again at 0, "
                                 "so its pool starts fresh.")
        elif kind in ("refill_timeout", "error"):
            self.sigMessage.emit(f"{pool.source}: {message}")

    # ------------------------------------------------------------------ health
    def health(self) -> StreamHealth:
        if self.attachment is None:
            return StreamHealth()
        return sum_health(self.attachment.health(), self.options is not None)

    def _poll(self) -> None:
        self.last_health = self.health()
        self.sigHealth.emit(self.last_health)

    # ------------------------------------------------------------------ tokenizer
    def _load_tokenizer(self, folder: str) -> None:
        """Load the chosen tokenizer on a thread of its own (the model worker may be busy)."""
        from engine.model.loader import load_tokenizer

        def run() -> None:
            try:
                tok = load_tokenizer(folder or None)
            except Exception as exc:  # noqa: BLE001 - shown as a message; ids still show
                try:
                    self.sigMessage.emit(f"The tokenizer could not be loaded ({exc}); token ids are shown instead of text.")
                except RuntimeError:  # the window closed meanwhile
                    pass
                return
            try:
                self.sigTokenizer.emit(tok)
            except RuntimeError:  # the window closed while it loaded
                pass

        self.tokenizer = None
        threading.Thread(target=run, name="attach-tokenizer", daemon=True).start()

    def _set_tokenizer(self, tok: Any) -> None:
        self.tokenizer = tok
        self.ctx.remote_tokenizer = tok
        self.ctx.state.touch()  # views redraw their text with it

    def stop(self) -> None:
        self.detach()


def view_tokenizer(ctx: AppContext) -> Any:
    """The tokenizer views decode token ids with: the attached server's, else the model's."""
    if ctx.state.remote is not None and ctx.remote_tokenizer is not None:
        return ctx.remote_tokenizer
    return getattr(ctx.runner, "tokenizer", None)


def decode_tokens(ctx: AppContext, token_ids: Any, limit: int = 48) -> str | None:
    """Token ids as text with the view tokenizer, or None when there is none."""
    tok = view_tokenizer(ctx)
    if tok is None:
        return None
    try:
        return tok.decode(list(token_ids)[:limit])
    except Exception:  # noqa: BLE001 - ids from another model
        return None


# ---------------------------------------------------------------------- captures (offline)
CAPTURE_SOURCE = "vllm-attach"  # engine.analysis.remote_capture.SOURCE, without importing the store


def latest_capture(path: str | Path) -> Any:
    """The newest session of a database when it is a recorded attach (`attach --record`), else None.

    A database whose newest session is a chat opens as a chat, as before.
    """
    from engine.store.database import Store

    try:
        with Store(path) as store:
            sessions = [s for s in store.list_sessions()
                        if s.source_format == CAPTURE_SOURCE or (s.kind == "chat" and s.num_messages)]
    except Exception:  # noqa: BLE001 - not our database: the chat path reports it
        return None
    last = sessions[-1] if sessions else None
    return last if last is not None and last.source_format == CAPTURE_SOURCE else None


def open_capture(ctx: AppContext, path: str | Path, session_id: int | None = None) -> int:
    """Show a recorded attach offline: its events replayed into the views as a remote pool
    (tiers, ages, lifetimes, scrubbing); returns the number of events. InputError when the
    database holds no capture."""
    from app.runtime.context import Subject
    from engine.core.errors import InputError
    from engine.store.database import Store

    with Store(path) as store:
        if session_id is None:
            session = latest_capture(path)
            if session is None:
                raise InputError(f"{path} holds no recorded vLLM attach")
        else:
            session = store.get_session(session_id)
        runs = [r for r in store.runs(session.id) if r.kind == "attach"]
        if not runs:
            raise InputError(f"session {session.id} of {path} holds no recorded stream")
        events = store.events(runs[-1].id)
    settings = session.settings or {}
    endpoint = ", ".join(settings.get("endpoints") or []) or "vLLM"
    ctx.open_subject(Subject("server", f"{session.title} (recorded)", source=str(path)), ask=False)
    info = engine_info(block_size=session.block_size or 16, num_blocks=0, model=f"vLLM {endpoint} (recorded)")
    info.update(remote=True, endpoint=endpoint, hash_scheme=session.hash,
                data_parallel_size=int(settings.get("data_parallel_size") or 1), recorded=True)
    ctx.attach_events(EventBus(), info)
    ctx.bridge.push(events)
    ctx.bridge.flush(everything=True)
    return len(events)
