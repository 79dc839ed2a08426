"""The main window: menus, toolbar, status bar and one dock per registered panel.

It is up before the model: loading runs on the model worker with a progress bar in the
status bar. Whatever is opened becomes the one current subject (`AppContext.open_subject`),
which asks before it replaces unsaved work. Opening files is `app.window.files`, trace
replays `app.runtime.replays`, the model load `app.runtime.model_load`; panels live in `app.views`.
Before the first paint the window builds only its frame (menus, toolbars with the scrub bar,
empty docks, status bar): the context's runtime (numpy, the remote engine), the panels and the
model load come after it, or at their first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QByteArray, QEvent, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (QApplication, QDialog, QDockWidget, QFrame, QLabel, QMainWindow, QMessageBox,
                               QProgressBar, QPushButton, QScrollArea, QTabBar, QToolBar, QWidget)

from app.ui import theme
from app.runtime import collector
from app.runtime.context import AppContext, Subject
from app.window.panels import BOTTOM, PANELS, SCRUB_BAR, PanelMap, PanelSpec, build_panel
from app.window.files import FileOpener
from app.window.recent import RecentFiles
from engine.resources import resource_path

# Imported at first use, not here: the first paint needs none of them. The compare window
# pulls in pyqtgraph; the replays, the model load and the remote controller numpy, the trace
# readers (msgspec) and the remote engine (app.runtime.jobs, app.runtime.remote).
if TYPE_CHECKING:
    from app.dialogs.model_load_dialog import ModelLoadMonitor
    from app.runtime.model_load import ModelLoad
    from app.runtime.remote import AttachSettings, RemoteController
    from app.runtime.replays import TraceReplays
    from app.views.compare.compare_window import CompareWindow
    from engine.remote.subscriber import StreamHealth

ICON_DIR = resource_path("icons")
DEFAULT_SIZE = QSize(1480, 920)
# Layout version: bump when PANELS changes so an old saved dock state is not restored
# onto a different set of docks.
LAYOUT_VERSION = 3
# The splits between docks a resize keeps as they were shared (`MainWindow._keep_shares`):
# (orientation, the area on one side, the area on the other)
SPLITS = ((Qt.Orientation.Horizontal, Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea),
          (Qt.Orientation.Vertical, Qt.DockWidgetArea.RightDockWidgetArea, BOTTOM))
# Panels built before the first paint, in the constructor. None since PlotStack stopped
# restyling itself on palette changes (6507006): every panel waits for the first paint.
EAGER_PANELS: frozenset[str] = frozenset()


def fit_rect(wanted: QRect, available: QRect) -> QRect:
    """`wanted` shrunk to fit `available` (a screen's area without panels) and moved inside it."""
    width = min(wanted.width(), available.width())
    height = min(wanted.height(), available.height())
    x = min(max(wanted.x(), available.x()), available.x() + available.width() - width)
    y = min(max(wanted.y(), available.y()), available.y() + available.height() - height)
    return QRect(x, y, width, height)


def app_icon() -> QIcon:
    icon = QIcon()
    for size in (16, 32, 48, 64, 128, 256):
        png = ICON_DIR / f"cachescope-{size}.png"
        if png.exists():
            icon.addFile(str(png), QSize(size, size))
    svg = ICON_DIR / "cachescope.svg"
    if icon.isNull() and svg.exists():
        icon.addFile(str(svg))
    return icon


def _ignore_args(fn: Callable[[], Any]) -> Callable[..., None]:
    """A slot that drops the signal's arguments (`triggered(bool)`) and calls `fn()`."""

    def slot(*_args: Any) -> None:
        fn()

    return slot


class MainWindow(QMainWindow):
    """The Cachescope window. `docks` maps a panel's object_name to its QDockWidget."""

    def __init__(self, ctx: AppContext, model: str | None = None, load_model: bool = True,
                 num_blocks: int = 256, block_size: int = 16) -> None:
        super().__init__()
        collector.install(self)  # cycles are collected on this thread only: see app.runtime.collector
        self.ctx = ctx
        ctx.ask_dialog = self._ask
        ctx.error_dialog = lambda title, text: QMessageBox.warning(self, title, text)
        ctx.model_name = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.trace_num_blocks: int | None = None  # a pool size the user chose for trace replays
        self.docks: dict[str, QDockWidget] = {}
        # per orientation, the second dock's share of the split (`_keep_shares`; None till laid out)
        self._shares: dict[Qt.Orientation, float | None] = {o: None for o, _, _ in SPLITS}
        self.panels = PanelMap(self._build_deferred_panel, ctx)
        # The panels the window shows at once are built right after its first paint, one
        # per turn of the event loop (any lookup before that builds its panel at once), so
        # the window is up before pyqtgraph and the views are; see `finish_startup`.
        self._startup: list[str] = []
        self.first_painted = False
        self.recent = RecentFiles(ctx.settings)
        self.files = FileOpener(ctx, self, self.recent, self.panels, self.docks, self.replay_trace)
        self._replays: TraceReplays | None = None
        self._loader: ModelLoad | None = None
        self._model_load: ModelLoadMonitor | None = None
        self._load_model_at_paint = load_model
        self._at_first_paint: list[Callable[[], Any]] = []  # see `after_first_paint`
        self._at_startup_done: list[Callable[[], Any]] = []  # see `after_startup`
        self._up = False  # what waited for the first paint is done
        self._demo_actions: list[QAction] = []
        self.remote_messages: list[str] = []  # what the remote pool told the user (restarts)
        self._build_frame()
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._build_docks()
        self._build_status_bar()
        self._default_state = self.saveState(LAYOUT_VERSION)
        self._restore_settings()
        self._status_timer = QTimer(self, singleShot=True, interval=100, timeout=self._update_status)
        self._connect()

    def _connect(self) -> None:
        ctx = self.ctx
        ctx.worker.sigProgress.connect(self._on_progress)
        ctx.sigSubjectChanged.connect(self._on_subject_changed)
        ctx.sigJobChanged.connect(self._on_job_changed)
        if ctx.runtime_ready:
            self._connect_runtime()
        else:  # at its first use, whoever reads it first (the first paint at the latest)
            ctx.sigRuntimeReady.connect(self._connect_runtime)

    def _connect_runtime(self) -> None:
        """Listen to the context's bridge, pool state and remote controller, once built."""
        ctx = self.ctx
        ctx.bridge.sigEngineChanged.connect(self._on_engine_changed)
        ctx.state.sigChanged.connect(self._schedule_status)
        remote = ctx.remote
        remote.sigHealth.connect(self._on_remote_health)
        remote.sigMessage.connect(self._on_remote_message)
        remote.sigAttached.connect(lambda _o: self._on_remote_attached(True))
        remote.sigDetached.connect(lambda: self._on_remote_attached(False))

    @property
    def remote(self) -> RemoteController:
        return self.ctx.remote

    @property
    def replays(self) -> TraceReplays:
        """Trace replays on the worker (built at the first one)."""
        if self._replays is None:
            from app.runtime.replays import TraceReplays

            replays = TraceReplays(self.ctx, self)
            replays.sigProgress.connect(self._on_progress)
            replays.sigShown.connect(self._on_replay_shown)
            replays.sigCancelled.connect(self._on_replay_cancelled)
            replays.sigFailed.connect(self._on_replay_failed)
            self._replays = replays
        return self._replays

    @property
    def loader(self) -> ModelLoad:
        """The model load on the worker (built at the first one)."""
        if self._loader is None:
            from app.runtime.model_load import ModelLoad

            loader = ModelLoad(self.ctx, self)
            loader.sigLoaded.connect(self._on_model_loaded)
            loader.sigFailed.connect(self._on_model_failed)
            self._loader = loader
        return self._loader

    @property
    def model_load(self) -> ModelLoadMonitor:
        """The first-start conversion dialog, with Cancel (built at the first model load)."""
        if self._model_load is None:
            from app.dialogs.model_load_dialog import ModelLoadMonitor

            self._model_load = ModelLoadMonitor(self)
        return self._model_load

    def _ask(self, title: str, text: str) -> bool:
        buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel
        return QMessageBox.question(self, title, text, buttons, QMessageBox.StandardButton.Cancel) \
            == QMessageBox.StandardButton.Yes

    # ------------------------------------------------------------------ construction
    def _build_frame(self) -> None:
        self.setObjectName("MainWindow")
        self.setWindowTitle("Cachescope")
        self.setWindowIcon(app_icon())
        self.setDockNestingEnabled(True)
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowTabbedDocks
                            | QMainWindow.DockOption.AllowNestedDocks)
        self.resize(DEFAULT_SIZE)

    def _action(self, text: str, slot: Callable[[], Any], shortcut: Any = None, tip: str = "",
                checkable: bool = False) -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        act.setStatusTip(tip)
        act.setToolTip(f"{text.replace('&', '').rstrip('.')}  ({QKeySequence(shortcut).toString()})" if shortcut else tip or text)
        act.setCheckable(checkable)
        act.triggered.connect(_ignore_args(slot))
        self.addAction(act)
        return act

    def _build_actions(self) -> None:
        a, files = self._action, self.files
        self.act_new = a("&New session", self.new_session, QKeySequence.StandardKey.New, "start an empty chat session")
        self.act_open = a("&Open…", files.open_dialog, QKeySequence.StandardKey.Open, "open a trace, conversation or session file")
        self.act_import = a("&Import conversation…", files.import_dialog, "Ctrl+I", "import OpenAI/ShareGPT/Anthropic conversations")
        self.act_export = a("&Export…", files.export_dialog, "Ctrl+E", "save the conversation and event log")
        self.act_attach = a("&Attach to vLLM…", self.attach_dialog, "Ctrl+Shift+A",
                            "show a running vLLM server's prefix cache (its KV-event stream)")
        self.act_detach = a("&Detach from vLLM", self.detach_remote, None, "stop following the vLLM server")
        self.act_detach.setEnabled(False)
        self.act_quit = a("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.act_theme = a("&Light theme", self.toggle_theme, "Ctrl+T", "switch between dark and light")
        self.act_reset_layout = a("&Reset layout", self.reset_layout, "Ctrl+Shift+R", "put every panel back in place")
        self.act_live = a("Follow &live", self.follow_live, "End", "stop scrubbing and follow the live engine")
        self.act_reset_cache = a("Reset &cache", self.reset_cache, "Ctrl+Shift+Backspace", "drop every cached block (only when idle)")
        self.act_load_model = a("&Load model", self.start_model_load, "Ctrl+L", "load the model again")
        self.act_pool_size = a("&Pool size…", self.pool_size_dialog, None,
                               "blocks and block size of the pool (a vLLM server's num_gpu_blocks accepted)")
        self.act_about = a("&About Cachescope", self.show_about)
        self.act_shortcuts = a("&Keyboard shortcuts", self.show_shortcuts, QKeySequence.StandardKey.HelpContents)
        self.act_glossary = a("&Glossary", self.show_glossary, tip="the words the views use, explained")

    def _build_menus(self) -> None:
        mb = self.menuBar()
        m = mb.addMenu("&File")
        for act in (self.act_new, self.act_open, self.act_import):
            m.addAction(act)
        m.addAction("Open &folder…", self.files.open_folder_dialog).setToolTip(
            "a folder of kv-cache-tester traces, replayed as concurrent users")
        self.recent_menu = m.addMenu("Open &recent")
        self.recent_menu.aboutToShow.connect(lambda: self.recent.fill_menu(self.recent_menu, self.open_file))
        m.addAction(self.act_export)
        m.addAction("&Compare…", lambda: self.show_compare()).setToolTip("two runs side by side on one request axis")
        m.addSeparator()
        m.addAction(self.act_attach)
        m.addAction(self.act_detach)
        m.addSeparator()
        m.addAction(self.act_quit)
        self.view_menu = mb.addMenu("&View")
        eng = mb.addMenu("&Engine")
        for act in (self.act_load_model, self.act_pool_size, self.act_reset_cache, self.act_live):
            eng.addAction(act)
        self.demos_menu = mb.addMenu("&Demos")
        self._no_demos = self.demos_menu.addAction("No demos installed")
        self._no_demos.setEnabled(False)
        h = mb.addMenu("&Help")
        h.addAction(self.act_shortcuts)
        h.addAction(self.act_glossary)
        h.addAction(self.act_about)

    def show_compare(self, a: str | None = None, b: str | None = None) -> CompareWindow:
        """File > Compare...: the Compare window (one per main window), filled with `a` and `b` if given."""
        if getattr(self, "compare_window", None) is None:
            from app.views.compare.compare_window import CompareWindow

            theme.apply_plot_defaults()
            self.compare_window = CompareWindow(self.ctx)
        if a and b:
            self.compare_window.set_sides(a, b)
        self.compare_window.show()
        self.compare_window.raise_()
        return self.compare_window

    def _build_toolbar(self) -> None:
        tb = QToolBar("Main", self)
        tb.setObjectName("main_toolbar")
        tb.setMovable(False)
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        for act in (self.act_new, self.act_open, self.act_import):
            tb.addAction(act)
        tb.addSeparator()
        for act in (self.act_live, self.act_reset_cache):
            tb.addAction(act)
        tb.addSeparator()
        tb.addAction(self.act_theme)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, tb)
        self.toolbar = tb
        # The scrub bar is in the first paint (built before the docks, so that it takes the
        # first keyboard focus at show, as it always did); it follows the pool state once the
        # runtime is built after that paint (`ScrubBar`, sigRuntimeReady).
        bar = QToolBar("Time", self)
        bar.setObjectName("scrub_toolbar")
        bar.setMovable(False)
        self.scrub_bar = build_panel(SCRUB_BAR, self.ctx)
        bar.addWidget(self.scrub_bar)
        self.addToolBar(Qt.ToolBarArea.BottomToolBarArea, bar)
        self.scrub_toolbar = bar

    def _build_docks(self) -> None:
        built = [(spec, build_panel(spec, self.ctx) if spec.object_name in EAGER_PANELS else QWidget())
                 for spec in PANELS]
        docks = {spec.object_name: self._make_dock(spec, w) for spec, w in built}
        primaries = [spec for spec, _ in built if not spec.tab_with or spec.tab_with not in docks]
        first_in_area: dict[Qt.DockWidgetArea, QDockWidget] = {}
        for spec in primaries:
            dock = docks[spec.object_name]
            self.addDockWidget(spec.area, dock)
            if spec.area in first_in_area:  # side by side with the first panel of its area
                orientation = Qt.Orientation.Horizontal if spec.area == BOTTOM else Qt.Orientation.Vertical
                self.splitDockWidget(first_in_area[spec.area], dock, orientation)
            first_in_area.setdefault(spec.area, dock)
        for spec, _ in built:
            if spec not in primaries:
                self.tabifyDockWidget(docks[spec.tab_with], docks[spec.object_name])
        for name in ("conversation", "block_table", "timeline", "metrics"):
            if name in self.docks:
                self.docks[name].raise_()
        if "block_details" in self.docks:
            self.ctx.selection.sigBlockSelected.connect(self._show_block_details)
        self._size_docks()
        self.view_menu.addAction(self.scrub_toolbar.toggleViewAction())
        self.view_menu.addSeparator()
        self.view_menu.addAction(self.act_theme)
        self.view_menu.addAction(self.act_reset_layout)

    def _make_dock(self, spec: PanelSpec, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(spec.title, self)
        dock.setObjectName(spec.object_name)
        # A scroll area lets a dock shrink below its panel's minimum width (a legend row, a
        # wide table) so the window still fits a laptop screen; it scrolls instead.
        holder = QScrollArea(dock)
        holder.setObjectName(f"{spec.object_name}_holder")
        holder.setWidgetResizable(True)
        holder.setFrameShape(QFrame.Shape.NoFrame)
        holder.setWidget(widget)
        dock.setWidget(holder)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetClosable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        toggle = dock.toggleViewAction()
        if spec.shortcut:
            toggle.setShortcut(QKeySequence(spec.shortcut))
        self.view_menu.addAction(toggle)
        self.docks[spec.object_name] = dock
        if spec.object_name in EAGER_PANELS:
            self.panels.add(spec.object_name, widget)
            return dock
        self.panels.defer(spec)
        if spec.lazy:
            dock.visibilityChanged.connect(lambda visible, name=spec.object_name: visible and self.panels.get(name))
        else:
            self._startup.append(spec.object_name)
        return dock

    def event(self, event: QEvent) -> bool:  # noqa: N802 - Qt override
        handled = super().event(event)
        if event.type() == QEvent.Type.MouseButtonRelease:  # the end of a drag of a separator, say
            self._note_shares()
        if event.type() == QEvent.Type.UpdateRequest and not self.first_painted:
            # The backing store has just been painted and flushed: the window is up.
            self.first_painted = True
            QTimer.singleShot(0, self, self._after_first_paint)
        return handled

    def after_first_paint(self, fn: Callable[[], Any]) -> None:
        """Call `fn()` once the window is up, before the start-up panels are built (at once
        if they are being built already): `cachescope gui` opens the store and the file so."""
        if self._up:
            fn()
        else:
            self._at_first_paint.append(fn)

    def after_startup(self, fn: Callable[[], Any]) -> None:
        """Call `fn()` once the start-up panels are built (at once if they are)."""
        if self._up and not self._startup:
            fn()
        else:
            self._at_startup_done.append(fn)

    def _after_first_paint(self) -> None:
        """What the first paint did not need, then the start-up panels one per turn of the
        event loop."""
        self._bring_up()
        QTimer.singleShot(0, self, self._build_next_startup_panel)

    def _bring_up(self) -> None:
        """The runtime (the scrub bar follows it), the model load started, the `after_first_paint` calls."""
        if self._up:
            return
        self.ctx.build_runtime()
        if self._load_model_at_paint:
            self._load_model_at_paint = False
            self.start_model_load()
        _run_all(self._at_first_paint)
        self._up = True

    def _build_next_startup_panel(self) -> None:
        """Build the next start-up panel and post the one after it. A panel that raises is
        not taken for built: the error goes up (`build_panel`), the rest are still built
        and the panel is built when first shown; `startup_done` waits for it no longer."""
        while self._startup and self.panels.is_built(self._startup[0]):
            self._startup.pop(0)
        if not self._startup:
            _run_all(self._at_startup_done)
            return
        try:
            self.panels[self._startup.pop(0)]
        finally:
            if self._startup:
                QTimer.singleShot(0, self, self._build_next_startup_panel)
            else:
                _run_all(self._at_startup_done)

    @property
    def startup_done(self) -> bool:
        """True once every panel shown at start is built (not the lazy ones)."""
        return all(self.panels.is_built(name) for name in self._startup)

    def finish_startup(self) -> None:
        """Build at once the start-up panels not built yet (tests, screenshots, benches), with
        what waits for the first paint or for them (`after_first_paint`, `after_startup`)."""
        self._bring_up()
        while self._startup:
            self.panels[self._startup.pop(0)]
        _run_all(self._at_startup_done)

    def _build_deferred_panel(self, name: str) -> None:
        """Build a lazy panel in place of its placeholder (first shown, or first asked for)."""
        spec = self.panels.pending(name)
        if spec is None:
            return
        theme.apply_plot_defaults()  # the first plot may be in this panel
        widget = build_panel(spec, self.ctx)
        holder = self.docks[name].widget()
        holder.setWidget(widget)  # the placeholder is deleted by the scroll area
        self.panels.add(name, widget)

    def _size_docks(self) -> None:
        left = [d for n, d in self.docks.items() if self.dockWidgetArea(d) == Qt.DockWidgetArea.LeftDockWidgetArea]
        right = [d for n, d in self.docks.items() if self.dockWidgetArea(d) == Qt.DockWidgetArea.RightDockWidgetArea]
        if left and right:
            self.resizeDocks([left[0], right[0]], [460, 1000], Qt.Orientation.Horizontal)
        bottom = [d for d in self.docks.values() if self.dockWidgetArea(d) == Qt.DockWidgetArea.BottomDockWidgetArea]
        if bottom and right:
            # Proportions, not pixels: the bottom plots keep room for their rows (45% of the
            # height, 40% below 900 px so that a 1280x800 chat still shows a few turns; plot
            # rows step out when short).
            height = max(self.height(), 600)
            bottom_share = 0.45 if height >= 900 else 0.40
            self.resizeDocks([right[0], bottom[0]], [int(height * (1 - bottom_share)), int(height * bottom_share)],
                             Qt.Orientation.Vertical)
            self._note_shares_when_laid_out()
        side_by_side = [self.docks[n] for n in ("timeline", "metrics") if n in self.docks]
        if len(side_by_side) == 2:
            self.resizeDocks(side_by_side, [1, 1], Qt.Orientation.Horizontal)

    def hide_stale_tab_bars(self) -> int:
        """Hide dock tab bars left over from an earlier layout; returns how many.

        After docks are re-tabified (the demo guide joins later) or a saved layout is
        restored, QMainWindow can leave an old tab bar visible at its old place, drawn over
        a dock. A live tab bar sits beside its docks, never on top of one.
        """
        docks = [d.geometry() for d in self.docks.values() if d.isVisible() and not d.isFloating()]
        bars = [b for b in self.findChildren(QTabBar) if b.parent() is self and b.isVisible()]

        def tabs(bar: QTabBar) -> tuple[str, ...]:
            return tuple(bar.tabText(i) for i in range(bar.count()))

        def overlaps(bar: QTabBar) -> bool:
            return any(bar.geometry().intersects(g) for g in docks)

        # A bar is stale when a live bar (beside its docks) holds all of its tabs and it
        # either lies over a dock or holds fewer tabs than that live bar.
        live = [set(tabs(b)) for b in bars if not overlaps(b)]
        hidden = 0
        for bar in bars:
            mine = set(tabs(bar))
            if any(mine <= other and (overlaps(bar) or mine != other) for other in live):
                bar.hide()
                hidden += 1
        return hidden

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        QTimer.singleShot(0, self, self._note_shares)
        collector.install(self)  # again after a close
        QTimer.singleShot(0, self.hide_stale_tab_bars)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        old, new = event.oldSize(), event.size()
        self._keep_shares([o for o, was, now in ((Qt.Orientation.Horizontal, old.width(), new.width()),
                                                 (Qt.Orientation.Vertical, old.height(), new.height()))
                           if 0 < was != now])
        QTimer.singleShot(0, self.hide_stale_tab_bars)

    # A larger or smaller window shares its new size between the docks as they were shared
    # before, as a user set them by dragging a separator or the layout left them (`SPLITS`):
    # its width between the left column (the conversation) and the right one (the block
    # table), its height between the right area's row and the bottom row (timelines,
    # metrics). QMainWindow gave each whole change to one side: maximized from 1280x800 to
    # 1920x1200, the block table kept its 342 px of height (the plots went from 253 to 653)
    # and the conversation took the 640 px of new width (378 -> 960, the block table 900 -> 960).

    def _split_docks(self, orientation: Qt.Orientation) -> tuple[QDockWidget, QDockWidget] | None:
        """The docks shown on either side of the split of `orientation` (`SPLITS`)."""
        def shown(area: Qt.DockWidgetArea) -> QDockWidget | None:
            # (a tab not raised is moved out of sight, not hidden: its visible region is empty)
            return next((d for d in self.docks.values() if self.dockWidgetArea(d) == area and not d.isFloating()
                         and not d.visibleRegion().isEmpty()), None)

        first, second = next((shown(a), shown(b)) for o, a, b in SPLITS if o == orientation)
        return None if first is None or second is None else (first, second)

    def _note_shares(self) -> None:
        """Each split's second share of the two docks' size as laid out now (None while either
        side shows no dock)."""
        for orientation in self._shares:
            docks = self._split_docks(orientation)
            sizes = [_extent(d, orientation) for d in docks] if docks else [0]
            self._shares[orientation] = sizes[1] / sum(sizes) if sum(sizes) > 0 else None

    def _note_shares_when_laid_out(self) -> None:
        """The shares unknown (a resize keeps none) until the layout set now is laid out."""
        self._shares = dict.fromkeys(self._shares)
        QTimer.singleShot(0, self, self._note_shares)

    def _keep_shares(self, orientations: list[Qt.Orientation]) -> None:
        """Each split of `orientations` shared again as it was noted."""
        for orientation in orientations:
            docks, share = self._split_docks(orientation), self._shares[orientation]
            if docks is None or share is None:
                continue
            total = sum(_extent(d, orientation) for d in docks)
            self.resizeDocks(list(docks), [total - round(total * share), round(total * share)], orientation)

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.status_labels: dict[str, QLabel] = {}
        for key, text in (("model", "no model"), ("block_size", "block —"), ("occupancy", "pool —"),
                          ("hit_rate", "hit rate —")):
            label = QLabel(text, self)
            label.setObjectName("statusValue")
            sb.addPermanentWidget(label)
            self.status_labels[key] = label
        self.remote_label = QLabel("", self)
        self.remote_label.setObjectName("statusRemote")
        self.remote_label.hide()
        sb.insertPermanentWidget(0, self.remote_label)
        self.progress = QProgressBar(self)
        self.progress.setFixedWidth(200)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.hide()
        sb.insertPermanentWidget(0, self.progress)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setObjectName("cancel_job")
        self.cancel_button.setToolTip("stop the trace load or demo that is running")
        self.cancel_button.clicked.connect(lambda _checked=False: self.ctx.cancel_job())
        self.cancel_button.hide()
        sb.insertPermanentWidget(1, self.cancel_button)

    # ------------------------------------------------------------------ settings
    def _restore_settings(self) -> None:
        s = self.ctx.settings
        name = str(s.value("ui/theme", "dark"))
        self.apply_theme(name if name in theme.THEME_NAMES else "dark", save=False)
        geometry = s.value("window/geometry")
        if isinstance(geometry, (QByteArray, bytes)):
            self.restoreGeometry(QByteArray(geometry))
        size = s.value("window/size")
        # Some platforms (offscreen, some Wayland compositors) ignore the size in the
        # geometry blob; the plain size is restored on every platform.
        if isinstance(size, QSize) and size.isValid() and not self.isMaximized():
            self.resize(size)
        state = s.value("window/state")
        if isinstance(state, (QByteArray, bytes)):
            self._restore_layout(QByteArray(state))
        self.fit_to_screen()

    def fit_to_screen(self) -> None:
        """Keep the whole window on its screen: the default size, or a remembered geometry from
        a larger screen, would put the status bar and the scrubber out of reach on a laptop.
        The offscreen platform has no real screen (800x600): tests and screenshots keep their size."""
        screen = self.screen()
        if screen is None or QApplication.platformName() == "offscreen" or self.isMaximized():
            return
        area = screen.availableGeometry()
        frame = self.frameGeometry()
        extra = QSize(frame.width() - self.width(), frame.height() - self.height())  # title bar, borders
        wanted = QRect(frame.topLeft(), self.size() + extra)
        fitted = fit_rect(wanted, area)
        self.resize(fitted.size() - extra)
        self.move(fitted.topLeft())

    def adopt_extra_docks(self) -> None:
        """Call after another module added docks (the demos' guide): the default layout and
        the saved one are taken again so that those docks are reset and remembered too."""
        if "conversation" in self.docks:
            self.docks["conversation"].raise_()
        self._size_docks()
        self._default_state = self.saveState(LAYOUT_VERSION)
        state = self.ctx.settings.value("window/state")
        if isinstance(state, (QByteArray, bytes)):
            self._restore_layout(QByteArray(state))

    def _restore_layout(self, state: QByteArray) -> None:
        """A saved layout back; its splits' shares are read from it once it is laid out."""
        self.restoreState(state, LAYOUT_VERSION)
        self._note_shares_when_laid_out()

    def save_settings(self) -> None:
        s = self.ctx.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/size", self.size())
        s.setValue("window/state", self.saveState(LAYOUT_VERSION))
        s.setValue("ui/theme", theme.current_theme())
        s.sync()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        if self.ctx.runtime_ready:  # else nothing was ever attached
            self.remote.detach()
        self.save_settings()
        super().closeEvent(event)
        if event.isAccepted():
            collector.release(self)

    def reset_layout(self) -> None:
        self._restore_layout(self._default_state)
        for dock in self.docks.values():
            dock.setFloating(False)
            dock.show()
        self.resize(DEFAULT_SIZE)
        self.fit_to_screen()

    # ------------------------------------------------------------------ theme
    def apply_theme(self, name: str, save: bool = True) -> None:
        app = QApplication.instance()
        theme.apply_theme(app, name)
        # The button names the theme a click switches to, not the one in use.
        other = "Light" if name == "dark" else "Dark"
        self.act_theme.setText(f"&{other} theme")
        self.act_theme.setToolTip(f"switch to the {other.lower()} theme  (Ctrl+T)")
        if save:
            self.ctx.settings.setValue("ui/theme", name)
        # The status bar is as tall as its tallest widget in this style, the hidden Cancel
        # button too, but only from its next layout pass, which came after the first paint
        # (27 -> 33 px: the docks and the scrub bar moved up a turn later); laid out now.
        QApplication.sendEvent(self.statusBar(), QEvent(QEvent.Type.LayoutRequest))
        self.ctx.sigThemeChanged.emit(name)

    def toggle_theme(self) -> None:
        self.apply_theme("light" if theme.current_theme() == "dark" else "dark")

    # ------------------------------------------------------------------ demos hook
    def add_demo_action(self, name: str, description: str, callback: Callable[[], Any]) -> QAction:
        """Add a Demos menu entry (used by the demos module); returns the action."""
        if self._no_demos is not None:
            self.demos_menu.removeAction(self._no_demos)
            self._no_demos = None
        act = QAction(name, self)
        act.setStatusTip(description)
        act.setToolTip(description)
        act.triggered.connect(_ignore_args(callback))
        self.demos_menu.addAction(act)
        self._demo_actions.append(act)
        return act

    # ------------------------------------------------------------------ model
    def start_model_load(self) -> None:
        if self.ctx.worker.is_busy and self.ctx.runner is None and self.progress.isVisible():
            return  # already loading
        self._on_progress("loading model", 0.0)
        self.status_labels["model"].setText("loading model…")
        self.loader.start(self.num_blocks, self.block_size, self.model_load.progress_callback(self.ctx.model_name))

    def _on_model_loaded(self, runner: Any) -> None:
        self.progress.hide()
        # A trace or demo opened while the model was loading keeps the views; the model's
        # engine takes over at the first chat message.
        showing_other = not self.ctx.subject.is_chat
        self.ctx.set_runner(runner, activate=not showing_other)
        if showing_other:
            self.status_labels["model"].setText(f"{runner_name(runner)} ready · views show {self.ctx.subject.kind}")
        self.statusBar().showMessage(f"model {runner_name(runner)} ready", 4000)

    def _on_model_failed(self, sentence: str) -> None:
        self.progress.hide()
        self.status_labels["model"].setText("no model")
        self.statusBar().showMessage("no model: traces still replay; chats show their recorded turns")
        self.ctx.show_error(sentence)
        if "conversation" in self.panels:  # turns waiting for the model are shown as recorded
            self.panels["conversation"].model_unavailable()

    def _on_progress(self, text: str, fraction: float) -> None:
        self.progress.show()
        if fraction < 0:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        self.progress.setToolTip(text)
        self.statusBar().showMessage(text)
        if fraction >= 1.0:
            QTimer.singleShot(600, self.progress.hide)

    # ------------------------------------------------------------------ files
    def open_file(self, path: str | Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Open a trace (replayed on the worker), a session database or a conversation file."""
        return self.files.open_file(path, on_done=on_done)

    def replay_trace(self, path: Path, on_done: Callable[[Any], None] | None = None) -> None:
        self.replays.start(path, self.trace_num_blocks, on_done=on_done)

    @property
    def last_replay(self) -> dict | None:
        return self.replays.last_result

    def _on_replay_shown(self, summary: str) -> None:
        self.progress.hide()
        self._update_status()
        self.statusBar().showMessage(summary, 8000)

    def _on_replay_cancelled(self, text: str) -> None:
        self.progress.hide()
        self.statusBar().showMessage(text, 8000)

    def _on_replay_failed(self, sentence: str) -> None:
        self.progress.hide()
        self.ctx.show_error(sentence)

    def recent_files(self) -> list[str]:
        return self.recent.files()

    def new_session(self) -> None:
        conversation = self.panels.get("conversation")
        if conversation is not None and conversation.new_session():
            self.docks["conversation"].raise_()

    # ------------------------------------------------------------------ engine
    def follow_live(self) -> None:
        self.ctx.state.scrub_to(None)

    def _on_subject_changed(self, subject: Subject) -> None:
        self.setWindowTitle(f"{subject.title} \u2014 Cachescope")

    def _on_job_changed(self, name: str) -> None:
        self.cancel_button.setVisible(bool(name))
        if name:
            self.cancel_button.setToolTip(f"stop {name}")

    def pool_size_dialog(self) -> None:
        from app.dialogs.pool_size_dialog import PoolSize, PoolSizeDialog

        dlg = PoolSizeDialog(PoolSize(self.num_blocks, self.block_size, self.trace_num_blocks is not None), self)
        if dlg.exec() == QDialog.DialogCode.Accepted:
            self.set_pool_size(dlg.pool_size())

    def set_pool_size(self, size: Any) -> None:
        """Use `size` (a `PoolSize`) from now on: the model's engine is rebuilt on a fresh pool
        (its cache starts empty; sessions are kept), and traces replay in it if asked."""
        self.trace_num_blocks = size.num_blocks if size.for_traces else None
        if (size.num_blocks, size.block_size) == (self.num_blocks, self.block_size):
            return
        runner = self.ctx.runner
        if runner is not None and self.ctx.worker.is_busy:
            self.ctx.show_error("The pool cannot be resized while the model is working; try again when it is idle.")
            return
        self.num_blocks, self.block_size = size.num_blocks, size.block_size
        if runner is None:
            return

        def done(new_runner: Any) -> None:
            self.ctx.set_runner(new_runner, activate=self.ctx.subject.is_chat)
            self.statusBar().showMessage(f"pool of {size.num_blocks:,} blocks × {size.block_size} tokens", 4000)

        from app.runtime.jobs import error_sentence, resize_pool_job

        def failed(exc: BaseException) -> None:
            self.ctx.show_error(error_sentence(exc, "The pool could not be resized"))

        self.ctx.worker.submit(resize_pool_job, runner, size.num_blocks, size.block_size, on_done=done, on_error=failed)

    def reset_cache(self) -> None:
        runner = self.ctx.runner
        if runner is None:
            self.ctx.show_error("There is no model engine to reset; load a model first.")
            return

        from app.runtime.jobs import error_sentence

        def failed(exc: BaseException) -> None:
            self.ctx.show_error(error_sentence(exc, "The cache could not be reset"))

        self.ctx.worker.submit(runner.manager.reset, on_error=failed)

    def _on_engine_changed(self, info: dict) -> None:
        self.status_labels["model"].setText(info.get("model") or f"no model ({self.ctx.subject.kind})")
        self.status_labels["block_size"].setText(f"block {info.get('block_size', '—')} tokens")
        self._update_status()

    def _schedule_status(self) -> None:
        if not self._status_timer.isActive():
            self._status_timer.start()

    def _update_status(self) -> None:
        state = self.ctx.state
        proj = state.projection
        remote = state.remote is not None
        # A vLLM pool publishes no requests and no pool size: its cached blocks, no hit rate.
        self.status_labels["hit_rate"].setVisible(not remote)
        if remote:
            self.status_labels["occupancy"].setText(f"vLLM pool {proj.num_hashed:,} cached blocks")
            return
        total = max(proj.num_blocks, 1)
        self.status_labels["occupancy"].setText(
            f"pool {proj.num_in_use} in use · {proj.num_cached_free} cached · {proj.num_blocks} blocks "
            f"({(proj.num_in_use + proj.num_cached_free) / total:.0%})")
        c = proj.counters
        self.status_labels["hit_rate"].setText(f"hit rate {c.hit_rate:.1%}" if c.num_prompt_tokens else "hit rate —")

    # ------------------------------------------------------------------ vLLM
    def attach_dialog(self) -> None:
        """Ask for a server (remembered), attach; a failure is shown in the dialog, which stays."""
        from app.dialogs.attach_dialog import AttachDialog
        from app.runtime.remote import AttachSettings

        dlg = AttachDialog(AttachSettings.load(self.ctx.settings), self)
        while dlg.exec() == QDialog.DialogCode.Accepted:
            opts = dlg.options()
            try:
                self.attach_remote(opts)
                return
            except ValueError as exc:
                dlg.show_error(str(exc))

    def attach_remote(self, settings: AttachSettings) -> AttachSettings | None:
        """Attach to a vLLM server (raises ValueError with a sentence); the settings are remembered.
        None when the user kept the current subject (unsaved work) instead."""
        settings = settings.validated()
        if not self.ctx.open_subject(Subject("server", f"vLLM {settings.endpoint}", source=settings.endpoint)):
            return None
        settings = self.remote.attach(settings)
        settings.save(self.ctx.settings)
        self.statusBar().showMessage(f"attached to {settings.endpoint}", 4000)
        if (len(settings.options.endpoints) > 1 or settings.options.bind) and "fleet" in self.docks:
            # Built before it is raised: built inside the dock's own visibilityChanged (its
            # lazy hook), adding its tabs deadlocked in Qt's style inheritance now and then.
            self.panels.get("fleet")
            self.docks["fleet"].show()  # many servers (or pods to come): the fleet panel comes forward
            self.docks["fleet"].raise_()
        return settings

    def detach_remote(self) -> None:
        self.remote.detach()

    def _on_remote_attached(self, attached: bool) -> None:
        self.act_detach.setEnabled(attached)
        self.remote_label.setVisible(attached or bool(self.remote_label.text()))
        if not attached and self.remote_label.text():
            self.remote_label.setText(self.remote_label.text().replace("vLLM ·", "vLLM (detached) ·", 1))
            self.statusBar().showMessage("Detached; the views keep the last pool", 6000)

    def _on_remote_health(self, health: StreamHealth) -> None:  # every rank's, summed
        from app.runtime.remote import status_text

        self.remote_label.setText(status_text(health))
        tip = f"{status_text(health, full=True)}\n{self.remote.num_streams} rank(s) · {health.restarts} restart(s)"
        if health.last_error:
            tip += f"\nlast malformed frame: {health.last_error}"
        self.remote_label.setToolTip(tip)
        self.remote_label.show()

    def _on_remote_message(self, text: str) -> None:
        self.remote_messages.append(text)
        self.statusBar().showMessage(text, 10000)

    # ------------------------------------------------------------------ help
    def show_about(self) -> None:
        from app.dialogs.about_dialog import AboutDialog

        AboutDialog(self.ctx, self).exec()

    def shortcut_rows(self) -> list[tuple[str, str]]:
        from app.dialogs.shortcuts_dialog import shortcut_rows

        return shortcut_rows(self)

    def _show_block_details(self, block_id: Any) -> None:
        dock = self.docks["block_details"]
        if block_id is not None and not dock.isHidden():
            dock.raise_()

    def show_glossary(self) -> None:
        from app.dialogs.glossary import GlossaryDialog

        dlg = self.findChild(GlossaryDialog)
        if dlg is None:
            dlg = GlossaryDialog(self)
        dlg.show()
        dlg.raise_()

    def show_shortcuts(self) -> None:
        from app.dialogs.shortcuts_dialog import ShortcutsDialog

        ShortcutsDialog(self.shortcut_rows(), self).exec()


def _extent(dock: QDockWidget, orientation: Qt.Orientation) -> int:
    """A dock's size along a split of `orientation`: its width across a horizontal one."""
    return dock.width() if orientation == Qt.Orientation.Horizontal else dock.height()


def _run_all(calls: list[Callable[[], Any]]) -> None:
    """Call and remove each of `calls`, in order (one may add more)."""
    while calls:
        calls.pop(0)()


def runner_name(runner: Any) -> str:
    loaded = getattr(runner, "loaded", None)
    return getattr(loaded, "name", None) or "model"
