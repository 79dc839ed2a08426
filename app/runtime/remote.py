"""The app attached to a running vLLM server: its settings and the controller.

`AttachSettings` is what File > Attach to vLLM... asks for: the engine's `AttachOptions`
(how to reach the streams: one server, a list of servers, or a bound address every pod
connects to) plus the servers' names and how to read them (hash scheme, block size,
tokenizer), kept in QSettings. `RemoteController` runs the engine's one `Attachment` for
the whole fleet off the GUI thread and wires its event bus to the bridge, so every view
shows the remote pools exactly as it shows the embedded engine's; the fleet views read
the servers through `fleet_snapshot` and `with_fleet`. Health is the engine's
`StreamHealth`, summed for the status bar and per server for the fleet. Recorded attaches
open in `app.runtime.captures`; the dialog lives in `app.dialogs.attach_dialog`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QSettings, QTimer, Signal

from app.runtime.bridge import FRAME_MS, engine_info
from app.runtime.imports import BACKGROUND_IMPORTS
from app.runtime.jobs import collector_paused
from app.runtime.journal_feed import JournalFeed, take_journal_rows, untaken_rows
from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.core.hashing import SERVER_HASHES
from engine.remote.attachment import AttachOptions
from engine.remote.fleet import Fleet
from engine.remote.fleet_view import FleetSnapshot, snapshot
from engine.remote.subscriber import StreamHealth, total_health

if TYPE_CHECKING:
    from app.runtime.bridge import EngineBridge
    from app.runtime.state import PoolState

HEALTH_MS = 250
# The journal route's work per GUI tick: rows are taken while their append (log, overlay) is
# estimated to take at most this long; the rest wait for the next tick, so a burst at fleet
# rates never freezes the window and the log still gets every row, in order. A written block
# costs about 2 ms however few its rows (the log's, series' and overlay's passes), so a
# budget of 6 ms spent a third of the tick on that; 10 ms leaves a stall well under 50 ms.
TICK_BUDGET_S = 0.010
MIN_TICK_ROWS = 2048
# While rows wait for later ticks, the views hear of new ones at most this often (each
# redraw of the block table and the plots is a pass of the event loop the stream waits on).
VIEW_FRAME_S = 0.2
LOCK_WAIT_S = 0.002  # a tick waits this long for the attachment's lock, then leaves it to the next
# The attach's threads (subscribers, placer) run this many steps below the GUI thread (Linux,
# `engine.core.threads`): on a busy 2-core machine the window's passes waited for a core
# behind them (a pass's wall time was 2-5x its CPU time, most of it on a run queue).
BACKGROUND_NICE = 10
POLL_SKIPS = 4  # health polls that may go without the lock before one waits for it (a second)
SETTINGS_KEY = "attach/settings"
MAX_BLOCK_SIZE = 4096
# vLLM's defaults with the replay socket on the next port; the topic the docs suggest.
DEFAULT_OPTIONS = AttachOptions(("tcp://127.0.0.1:5557",), ("tcp://127.0.0.1:5558",), "kv-events")


FIRST_ROW_SECONDS = 2e-6  # the estimate of a written row's time before a tick has measured one


def tick_rows(row_seconds: float) -> int:
    """Rows a GUI tick writes: what TICK_BUDGET_S allows at `row_seconds` a row, at least
    MIN_TICK_ROWS (`RemoteController`'s ticks, and the headless route that times them)."""
    return max(MIN_TICK_ROWS, int(TICK_BUDGET_S / row_seconds))


def next_row_seconds(row_seconds: float, seconds: float, rows: int) -> float:
    """The running estimate of a written row's time after `rows` were written in `seconds`
    (`PoolState.journal_seconds`). It follows the machine's load: wall clock, not the GUI
    thread's CPU time (with that, a busy machine's ticks grew until a pass of the loop took
    43-50 ms of CPU, against 22-33 ms, for no measurable gain in rate)."""
    return 0.7 * row_seconds + 0.3 * max(seconds / rows, 1e-8)


@dataclass(slots=True, frozen=True)
class AttachSettings:
    """File > Attach's choices: `options` says where the streams are and names their servers
    (`options.servers[i]` is the server at `options.endpoints[i]`; in centralized mode the
    pod of each llm-d topic); `hash_scheme` (vLLM's --prefix-caching-hash-algo, or
    SGLang's page hash) and `block_size` are how the probes hash a prompt as the servers do;
    `tokenizer` is a local Hugging Face folder ("" = the default model's); with `record` the
    frames the servers send are kept as a session of the window's database until detach
    (`engine.analysis.remote_capture`, what `attach --record` keeps), to open later."""

    options: AttachOptions = DEFAULT_OPTIONS
    hash_scheme: str = "vllm-sha256"
    tokenizer: str = ""
    block_size: int = 16
    record: bool = False

    def __post_init__(self) -> None:
        if self.hash_scheme not in SERVER_HASHES:
            raise InputError(f"the hash scheme must be one of {', '.join(SERVER_HASHES)}, not {self.hash_scheme!r}")
        if not isinstance(self.block_size, int) or not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise InputError(f"the block size must be from 1 to {MAX_BLOCK_SIZE} tokens, not {self.block_size}")
        named = list(self.options.servers)
        if len(set(named)) != len(named):
            raise InputError(f"the server name {next(n for n in named if named.count(n) > 1)!r} is given twice")

    @property
    def endpoint(self) -> str:
        """How the window names what it attached to: the event endpoint of one server, the
        servers of a fleet ("fleet of 3: a, b, c")."""
        opts = self.options
        if len(opts.endpoints) == 1:
            return opts.endpoints[0]
        return f"fleet of {len(opts.endpoints)}: " + ", ".join(opts.server_of(i) for i in range(len(opts.endpoints)))

    def validated(self) -> AttachSettings:
        """These settings if the tokenizer folder holds a tokenizer; else InputError (one sentence)."""
        if self.tokenizer:
            folder = Path(self.tokenizer).expanduser()
            if not folder.is_dir():
                raise InputError(f"the tokenizer folder {folder} does not exist")
            if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
                raise InputError(f"{folder} holds no tokenizer (no tokenizer.json or tokenizer_config.json)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {**self.options.to_dict(), "hash_scheme": self.hash_scheme, "tokenizer": self.tokenizer,
                "block_size": self.block_size, "record": self.record}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttachSettings:
        """The inverse of `to_dict`; bad values raise InputError."""
        try:
            return cls(AttachOptions.from_dict(data), str(data.get("hash_scheme", "vllm-sha256")),
                       str(data.get("tokenizer", "")), data.get("block_size", 16), bool(data.get("record", False)))
        except (TypeError, AttributeError) as exc:
            raise InputError(f"attach settings are not valid ({exc})") from None

    def save(self, settings: QSettings) -> None:
        settings.setValue(SETTINGS_KEY, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, settings: QSettings) -> AttachSettings:
        """The settings last saved; the defaults when none were, or they no longer read."""
        raw = settings.value(SETTINGS_KEY, "")
        try:
            return cls.from_dict(json.loads(str(raw)))
        except (ValueError, TypeError):  # InputError and json's errors are ValueErrors
            return cls()


class RemoteHost(Protocol):
    """What the controller needs of the app context (`app.runtime.context.AppContext`)."""

    bridge: EngineBridge
    state: PoolState
    store: Any  # the session database (engine.store.database.Store), or None: where a recording goes
    sigSubjectChanged: Any  # a Signal(object) carrying the new Subject

    def attach_events(self, bus: EventBus, info: dict[str, Any]) -> None: ...


def duration_text(seconds: float, ms_below: float = 1.0) -> str:
    """A duration in the unit that reads: ms below `ms_below` seconds, then s, min, h, days
    (the status bar's lag, the Metrics tab's block lifetimes)."""
    if seconds < ms_below:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.1f} d"


def lag_text(seconds: float) -> str:
    """Now minus the last batch's server time: a recorded stream replayed days later, or a
    server whose clock is off, lags by hours ("45.5 h", not "163,962 s")."""
    return duration_text(seconds, ms_below=10.0)


def status_text(health: StreamHealth, full: bool = False) -> str:
    """The status bar's line for the summed health of every rank: batches, missed and lag
    always, refilled and malformed batches only when there are any (at 1280 px the line with
    both zeros left a transient message a sixth of the bar); `full`, every counter (its tooltip)."""
    lag = "lag —" if health.lag_s is None else f"lag {lag_text(health.lag_s)}"
    parts = [f"{health.batches:,} batches"]
    if full or health.refilled:
        parts.append(f"{health.refilled:,} refilled")
    parts.append(f"{health.missed:,} missed")
    if full or health.malformed:
        parts.append(f"{health.malformed:,} malformed")
    return " · ".join(["vLLM", *parts, lag])


class RemoteController(QObject):
    """Attaches the app to a vLLM server; the views follow the remote pool through the bridge.

    The context creates and owns it (`ctx.remote`). The engine's `Attachment` runs one
    subscriber thread per rank and numbers every converted event on one bus, which the
    bridge listens to like an embedded engine's. Signals (GUI thread):
    `sigAttached(AttachSettings)`, `sigDetached()`, `sigHealth(StreamHealth)` (every rank's,
    summed) every HEALTH_MS while attached, `sigMessage(str)` for what the user must read (a
    restart, a refill that timed out), `sigTokenizer(object)` when the chosen tokenizer has
    loaded, `sigFleet()` when the fleet the views read is another one (an attach, a recorded
    capture opened, another subject).

    One controller serves the whole fleet: the engine's `Attachment` already runs one
    stream per server, rank and (in centralized mode) llm-d topic, on one lock and one bus.
    """

    sigAttached = Signal(object)
    sigDetached = Signal()
    sigHealth = Signal(object)
    sigMessage = Signal(str)
    sigTokenizer = Signal(object)
    sigFleet = Signal()
    _sigLoaded = Signal(str, object)  # a tokenizer load done: (folder, tokenizer), from its thread
    # Every stream (each server and rank, a bound endpoint's pods) goes through the columnar
    # pools' journal into the live columnar log at each GUI tick; False (or
    # PoolState(columnar=False)) keeps the reference route: RemotePool's events through the bridge.
    journal = True
    # The journal's rows are placed on a thread of their own (`JournalFeed`); False places
    # them in the GUI tick.
    placing_thread = True

    def __init__(self, host: RemoteHost) -> None:
        super().__init__(host if isinstance(host, QObject) else None)
        self.host = host
        self.settings: AttachSettings | None = None
        self.attachment: Any = None  # engine.remote.Attachment, kept after detach (the last pools)
        self.tokenizer: Any = None  # the server's tokenizer once loaded; None: the model's
        # the tokenizers loaded, by folder ("": the default model's), for the next attach:
        # a load holds the GIL for 90-290 ms at a time (the window froze that long at each attach)
        self._tokenizers: dict[str, Any] = {}
        self.last_health = StreamHealth("vLLM")
        self._polls_skipped = 0  # health polls in a row that did not get the attachment's lock
        self.last_settings: AttachSettings | None = None  # the last attach's, kept after detach
        self.recorded_fleet: Fleet | None = None  # a recorded capture's pools, shown offline
        self.recorded_settings: AttachSettings | None = None
        self._timer = QTimer(self, interval=HEALTH_MS)
        self._timer.timeout.connect(self._poll)
        self._tick_timer = QTimer(self, interval=FRAME_MS)  # the journal's GUI tick
        self._tick_timer.timeout.connect(self._on_frame)
        self.journalling = False  # this attach runs the journal route
        self._num_ranks = 1
        self._taken: dict[int, int] = {}  # id(pool) -> its journal rows applied so far
        self._row_seconds = FIRST_ROW_SECONDS  # the journal append's time per row (a running estimate)
        self._last_notify = float("-inf")  # never told: the first burst tells at once (the clock may be young)
        self._again = False  # a tick for rows left waiting is queued
        self._feed: JournalFeed | None = None  # the placing thread of this attach's journal
        self.recorder: Any = None  # engine.analysis.remote_capture.Recorder while an attach records
        self._tell = False  # the views hear of the rows written at the next tick (its own loop pass)
        self._tokenizer_folder: str | None = None  # the folder the last attach chose
        self._sigLoaded.connect(self._on_loaded)
        # another subject (a trace, a chat) ends the attach
        host.sigSubjectChanged.connect(self._on_subject)

    @property
    def is_attached(self) -> bool:
        return self.settings is not None

    @property
    def num_streams(self) -> int:
        """Streams of the last attach (one per endpoint and rank)."""
        return 0 if self.attachment is None else len(self.attachment.subscribers)

    def _on_subject(self, subject: Any) -> None:
        if subject.kind != "server":
            self.detach()
            if self.recorded_fleet is not None or self.attachment is not None:
                self.recorded_fleet, self.recorded_settings = None, None
                self.attachment = self.last_settings = None
                self.sigFleet.emit()

    # ------------------------------------------------------------------ the fleet
    @property
    def reading_settings(self) -> AttachSettings | None:
        """How the fleet being shown is read (hash scheme, block size): the live attach's,
        else the recorded capture's."""
        return self.settings or self.recorded_settings or (self.last_settings if self.attachment else None)

    def with_fleet(self, read: Any, default: Any = None) -> Any:
        """`read(fleet)` on the fleet the views show (the live attach's, under its lock, or
        a recorded capture's); `default` when there is none. `read` must only read."""
        att = self.attachment
        if att is not None:
            from engine.remote.fleet_view import fleet_of_attachment

            with att.lock:
                return read(fleet_of_attachment(att))
        if self.recorded_fleet is not None:
            return read(self.recorded_fleet)
        return default

    def fleet_snapshot(self, max_rows: int | None = None) -> FleetSnapshot:
        """The servers, their blocks and what they share, read at once (empty: no fleet)."""
        health = self.attachment.health() if self.attachment is not None else []
        kw = {} if max_rows is None else {"max_rows": max_rows}
        return self.with_fleet(lambda fleet: snapshot(fleet, health, **kw), FleetSnapshot())

    def show_recorded_fleet(self, fleet: Fleet, settings: AttachSettings | None = None) -> None:
        """Show a recorded capture's pools offline (`app.runtime.captures`)."""
        self.detach()
        self.attachment = None
        self.recorded_fleet, self.recorded_settings = fleet, settings
        self.sigFleet.emit()

    # ------------------------------------------------------------------ attach / detach
    def attach(self, settings: AttachSettings) -> AttachSettings:
        """Subscribe to every rank; raises ValueError (one sentence) for bad settings or sockets."""
        from engine.remote.attachment import Attachment

        settings = settings.validated()
        self.detach()
        bus = EventBus()
        opts = settings.options
        journal = self.uses_journal(settings)
        if journal:
            attachment = Attachment(dataclasses.replace(opts, columnar=True), on_notice=self._on_notice, events=bus,
                                    journal=True, nice=BACKGROUND_NICE)
        else:
            attachment = Attachment(opts, on_notice=self._on_notice, events=bus, nice=BACKGROUND_NICE)
        self.journalling = journal
        self._taken = {}
        self._tell = False
        self._num_ranks = max(opts.data_parallel_size, max(opts.ranks, default=0) + 1)
        info = self._engine_info(settings)
        info["journal"] = journal
        recorder = self._recorder(settings, attachment) if settings.record else None
        # The views reset to an empty remote pool before the first batch can arrive.
        self.host.attach_events(bus, info)
        try:
            attachment.start()
        except Exception as exc:
            attachment.stop()
            self.host.bridge.detach()
            if recorder is not None:  # nothing came: no session is left behind
                recorder.discard()
            text = str(exc).rstrip(".")
            raise ValueError(f"Could not attach to {settings.endpoint}: {text}.") from None
        self.recorder = recorder
        self.attachment = attachment
        self.settings = settings
        self.last_settings = settings
        self.recorded_fleet, self.recorded_settings = None, None
        self._timer.start()
        if journal:
            if self.placing_thread:
                self._feed = JournalFeed(attachment, self.host.state.log, self._taken, self._limit, BACKGROUND_NICE)
                self._feed.start()
            self._tick_timer.start()
        self._load_tokenizer(settings.tokenizer)
        self.sigAttached.emit(settings)
        self.sigFleet.emit()
        return settings

    def detach(self) -> None:
        """Stop every subscriber; the views keep the pool as it was, now offline."""
        if self.settings is None:
            return
        self.attachment.stop()
        self._poll()
        self._timer.stop()
        self._tick_timer.stop()
        if self.journalling:
            self.tick(drain=True)  # what the pools journalled since the last tick
        self.host.bridge.flush(everything=True)
        self.host.bridge.detach()
        self.settings = None
        self.sigDetached.emit()
        if self.recorder is not None:
            self._finish_recording()

    def _recorder(self, settings: AttachSettings, attachment: Any) -> Any:
        """A recorder of `attachment`'s frames into the window's database (ValueError, one
        sentence, when none is open)."""
        from engine.analysis.remote_capture import Recorder

        store = getattr(self.host, "store", None)
        path = getattr(store, "path", None)
        if path is None:
            raise ValueError("Could not record the attach: no session database is open (File > Open a .db first).")
        return Recorder(str(path), settings.options, block_size=settings.block_size).start(attachment)

    def _finish_recording(self) -> None:
        """The recording's run closed with its pools' counts, and the user told where it is."""
        recorder, self.recorder = self.recorder, None
        att = self.attachment  # (a recorder is made only with an attachment, which stays after detach)
        try:
            with att.lock:
                streams = [{"stored": int(p.num_stored), "removed": int(p.num_removed)} for p in att.pools]
            recorder.finish({"streams": streams})
        except Exception as exc:  # noqa: BLE001 - a full disk, a removed file: said, never a crash
            self.sigMessage.emit(f"The recording could not be finished: {exc}")
            return
        self.sigMessage.emit(f"Recorded {recorder.num_frames:,} batches as session {recorder.session_id} "
                             f"of {Path(recorder.db).name}: open that file to see them again.")

    def uses_journal(self, settings: AttachSettings) -> bool:
        """True if an attach with `settings` goes through the pools' journal: any fleet (one
        server, several, its ranks, a bound endpoint its pods connect to), when the live log
        is columnar to take it."""
        return bool(self.journal and getattr(self.host.state, "columnar", False))

    def tick(self, drain: bool = False) -> int:
        """One GUI tick of the journal route. While the placing thread runs (`JournalFeed`,
        started by `attach`), the blocks it placed are written to the log, as many as
        TICK_BUDGET_S of writing allows, the rest left for the next tick. Without it (a
        drain at detach, after what it placed is written) each pool's journal rows not
        applied yet are taken under the attachment's lock (numpy views, with their batch
        times), within the same budget shared between the pools, and placed and written
        here. Either way the rows go to `PoolState.apply_prepared`, and the views hear of a
        burst at most every VIEW_FRAME_S and of its end at once. `drain` takes every row.
        Returns the number of events appended."""
        att = self.attachment
        if att is None or not self.journalling:
            return 0
        feed = self._feed
        if feed is not None and feed.error is not None:  # placing failed: the rest is placed here
            self.sigMessage.emit(f"The journal's placing thread stopped ({feed.error}); rows are placed on the "
                                 "window's thread instead.")
            feed.error = None
            drain = True
        if feed is not None and not drain:
            if self._tell:  # the views redraw in a pass of the event loop of their own
                self._tell = False
                self.host.state.notify()
                self._again_if(feed.num_ready > 0)
                return 0
            return self._commit_ready(feed)
        made = 0
        if feed is not None:  # what it placed goes first, in order
            feed.stop()
            self._feed = None
            made += self._commit_ready(feed, everything=True)
        while True:
            # a subscriber applying a burst holds the lock: the window does not wait for it
            # (the next tick takes the rows), except to drain at detach
            got = take_journal_rows(att, self._taken, self._limit(), -1 if drain else LOCK_WAIT_S)
            if got is None:
                return made
            takes, left = got
            state = self.host.state
            if not takes:
                state.notify()
                return made
            made += self._apply(state, [(h, p, int(p.rank), self._num_ranks, t) for h, p, t in takes])
            if self._due(left):
                state.notify()
            if not drain:
                self._again_if(left)
                return made

    def _limit(self) -> int:
        return tick_rows(self._row_seconds)

    def _apply(self, state: PoolState, takes: list, prepared: bool = False) -> int:
        got = state.apply_prepared(takes, notify=False) if prepared else state.apply_journal(takes, notify=False)
        if got:
            self._row_seconds = next_row_seconds(self._row_seconds, state.journal_seconds, got)
        return got

    def _due(self, left: bool) -> bool:
        """True if the views are to hear of the rows written now: a burst's end, or a frame
        since they last heard."""
        now = time.monotonic()
        if not left or now - self._last_notify >= VIEW_FRAME_S:
            self._last_notify = now
            return True
        return False

    def _on_frame(self) -> None:
        if not self._again:  # a tick already queued for rows left waiting does this frame's work
            self.tick()

    def _commit_ready(self, feed: JournalFeed, everything: bool = False) -> int:
        """Write the blocks `feed` placed, within the tick's budget (all: `everything`)."""
        blocks = feed.pop_blocks(None if everything else self._limit())
        state = self.host.state
        if not blocks:
            if state.unnotified and self._due(self._streaming(feed)):
                state.notify()
            return 0
        got = self._apply(state, blocks, prepared=True)
        if everything:
            state.notify()
        elif self._due(self._streaming(feed)):
            self._tell = True
            self._again_if(True)
        else:
            self._again_if(feed.num_ready > 0)
        return got

    def _streaming(self, feed: JournalFeed) -> bool:
        """True while rows are still on their way: taken and not written, or journalled by
        the pools and not taken (a subscriber holding the lock is applying some). A stream
        at fleet rates keeps the pools ahead of the feed's bites, so the views redraw at
        VIEW_FRAME_S, not after every bite as if each were a burst's end (one redraw of the
        block table and plots and its paint was ~6 ms of the GUI thread every 50 ms)."""
        if feed.pending > 0:
            return True
        att = self.attachment
        if not att.lock.acquire(blocking=False):
            return True
        try:
            return untaken_rows(att, self._taken) > 0
        finally:
            att.lock.release()

    def _again_if(self, left: bool) -> None:
        if left and not self._again:  # more waiting: the next bite once the loop has run
            # a timer, not a posted call: Qt runs every posted call of a pass, new ones too,
            # so a chain of posted ticks would hold one pass of the loop for the whole burst
            self._again = True
            QTimer.singleShot(1, self, self._tick_again)

    def _tick_again(self) -> None:
        self._again = False
        self.tick()

    def pending_rows(self) -> int:
        """Journal rows the pools hold that no tick has applied yet."""
        att = self.attachment
        if att is None or not self.journalling:
            return 0
        with att.lock:
            return untaken_rows(att, self._taken) + (self._feed.pending if self._feed is not None else 0)

    def _engine_info(self, settings: AttachSettings) -> dict[str, Any]:
        opts = settings.options
        endpoint = ", ".join(opts.endpoints)
        ranks = f" ×{opts.data_parallel_size} ranks" if opts.data_parallel_size > 1 else ""
        named = ", ".join(opts.server_of(i) for i in range(len(opts.endpoints)))
        label = f"fleet of {len(opts.endpoints)}: {named}" if len(opts.endpoints) > 1 else endpoint
        if opts.bind:
            label = f"{label} (bound)"
        info = engine_info(block_size=settings.block_size, num_blocks=0, model=f"vLLM {label}{ranks}")
        info.update(remote=True, endpoint=endpoint, hash_scheme=settings.hash_scheme,
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
    def health(self, timeout: float = -1) -> StreamHealth | None:
        """Every stream's health, summed (`engine.remote.total_health`); None if the
        attachment's lock was not had within `timeout` seconds (-1: wait)."""
        if self.attachment is None:
            return StreamHealth("vLLM")
        streams = self.attachment.health(timeout)
        return None if streams is None else total_health(streams, "vLLM")

    def _poll(self) -> None:
        """The streams' health for the status bar, every HEALTH_MS. It waits for the
        attachment's lock at most LOCK_WAIT_S, as a tick does (a GUI pass waited on it while a
        subscriber applied a run of frames, tens of ms): the last health stays until the next
        poll, and after POLL_SKIPS polls in a row without the lock, one waits for it."""
        got = self.health(-1 if self._polls_skipped >= POLL_SKIPS else LOCK_WAIT_S)
        if got is None:
            self._polls_skipped += 1
            return
        self._polls_skipped = 0
        self.last_health = got
        self.sigHealth.emit(got)

    # ------------------------------------------------------------------ tokenizer
    def _load_tokenizer(self, folder: str) -> None:
        """Load the chosen tokenizer on a thread of its own (the model worker may be busy),
        once per folder: a later attach with the same one takes it as loaded, at the next
        pass of the event loop (as a load's signal comes). Loading it holds the GIL for up
        to 290 ms at a time (transformers' and the Rust tokenizer's set-up), a freeze of the
        window that each attach had."""
        from engine.model.loader import load_tokenizer

        self.tokenizer = None
        self._tokenizer_folder = folder
        loaded = self._tokenizers.get(folder)
        if loaded is None and not folder:  # the default model's: the window's model's, if that is the one loaded
            loaded = _default_model_tokenizer(getattr(self.host, "runner", None))
        if loaded is not None:
            self._tokenizers[folder] = loaded
            QTimer.singleShot(0, self, lambda: self._on_loaded(folder, loaded))
            return

        def run() -> None:
            try:
                # no collection on this thread (see app.runtime.jobs); its imports (transformers'
                # lazy submodules) not at the same moment as a model load's (app.runtime.imports)
                with collector_paused(), BACKGROUND_IMPORTS:
                    tok = load_tokenizer(folder or None)
                self._tokenizers[folder] = tok
            except Exception as exc:  # noqa: BLE001 - shown as a message; ids still show
                try:
                    self.sigMessage.emit(f"The tokenizer could not be loaded ({exc}); token ids are shown instead of text.")
                except RuntimeError:  # the window closed meanwhile
                    pass
                return
            try:
                self._sigLoaded.emit(folder, tok)
            except RuntimeError:  # the window closed while it loaded
                pass

        threading.Thread(target=run, name="attach-tokenizer", daemon=True).start()

    def _on_loaded(self, folder: str, tok: Any) -> None:
        """A tokenizer loaded: the views decode with it, unless a later attach chose another
        folder meanwhile (an earlier attach's load that finished last is not taken for it)."""
        if folder != self._tokenizer_folder:
            return
        self.tokenizer = tok
        self.host.state.touch()  # views redraw their text with it
        self.sigTokenizer.emit(tok)

    def stop(self) -> None:
        self.detach()


def _default_model_tokenizer(runner: Any) -> Any:
    """The tokenizer of `runner`'s model if that is the default model (`resolve_model(None)`), else None."""
    from engine.model.loader import model_identity, resolve_model

    loaded = getattr(runner, "loaded", None)
    if loaded is None:
        return None
    try:
        return loaded.tokenizer if loaded.model_id == model_identity(resolve_model(None)) else None
    except (InputError, OSError):  # no default model to compare with: loaded on the thread as before
        return None


class TokenizerHost(Protocol):
    """What `view_tokenizer` reads of the app context."""

    state: PoolState
    runner: Any
    remote: RemoteController


def view_tokenizer(ctx: TokenizerHost) -> Any:
    """The tokenizer views decode token ids with: the attached server's, else the model's."""
    if ctx.state.remote is not None and ctx.remote.tokenizer is not None:
        return ctx.remote.tokenizer
    return getattr(ctx.runner, "tokenizer", None)


def decode_tokens(ctx: TokenizerHost, token_ids: Any, limit: int = 48) -> str | None:
    """Token ids as text with the view tokenizer, or None when there is none."""
    tok = view_tokenizer(ctx)
    if tok is None:
        return None
    try:
        return tok.decode(list(token_ids)[:limit])
    except Exception:  # noqa: BLE001 - ids from another model
        return None
