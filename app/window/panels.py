"""The registry of dock panels: which views the main window shows, and where by default.

Each `PanelSpec` names a factory "module:Class" that takes the app context. Every panel
module ships with the app, so a panel that fails to import is a bug and raises;
`tests/test_gui_shell.py` builds them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

LEFT = Qt.DockWidgetArea.LeftDockWidgetArea
RIGHT = Qt.DockWidgetArea.RightDockWidgetArea
BOTTOM = Qt.DockWidgetArea.BottomDockWidgetArea
TOP = Qt.DockWidgetArea.TopDockWidgetArea


@dataclass(slots=True, frozen=True)
class PanelSpec:
    """One dock panel. `tab_with` names the object_name of a panel to share a tab stack with."""

    title: str
    object_name: str
    factory: str  # "package.module:ClassName", called as Class(ctx)
    area: Qt.DockWidgetArea
    tab_with: str | None = None
    shortcut: str | None = None
    lazy: bool = False  # built when first shown or asked for: keeps the window's start quick


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Conversation", "conversation", "app.views.chat.conversation_view:ConversationView", LEFT, None, "Ctrl+1"),
    # Tabbed behind the conversation; a click on a block brings it forward.
    PanelSpec("Block details", "block_details", "app.views.pool.block_details:BlockDetailsView", LEFT, "conversation"),
    PanelSpec("Block table", "block_table", "app.views.pool.block_table_view:BlockTableView", RIGHT, None, "Ctrl+2"),
    PanelSpec("Hash chains", "hash_chains", "app.views.pool.hash_chain_view:HashChainView", RIGHT, "block_table", "Ctrl+3"),
    PanelSpec("Ref counts and evictions", "timeline", "app.views.pool.timeline_view:TimelineView", BOTTOM, None, "Ctrl+4"),
    PanelSpec("Event log", "event_log", "app.views.pool.event_log_view:EventLogView", BOTTOM, "timeline", "Ctrl+5"),
    PanelSpec("Metrics", "metrics", "app.views.pool.metrics_view:MetricsView", BOTTOM, None, "Ctrl+6"),
    PanelSpec("KV memory", "kv_memory", "app.views.pool.kv_memory_view:KvMemoryView", BOTTOM, "metrics", "Ctrl+7"),
    # Panels driven by their own inputs, not the event stream, are built on first use.
    PanelSpec("Diff", "diff", "app.views.tools.diff_view:DiffView", RIGHT, "block_table", None, lazy=True),
    PanelSpec("Billing", "billing", "app.views.tools.billing_view:BillingView", BOTTOM, "metrics", None, lazy=True),
    PanelSpec("Sweep", "sweep", "app.views.tools.sweep_view:SweepView", BOTTOM, "metrics", None, lazy=True),
    PanelSpec("Traces", "traces", "app.views.tools.traces_view:TracesView", BOTTOM, "metrics", None, lazy=True),
    PanelSpec("Semantic cache", "semantic", "app.views.tools.semantic_view:SemanticView", RIGHT, "block_table", None),
    PanelSpec("vLLM probe", "remote_probe", "app.views.tools.probe_view:ProbeView", RIGHT, "block_table", None, lazy=True),
    # Many servers at once (an attach to a fleet, or a recorded one): built when first shown.
    PanelSpec("Fleet", "fleet", "app.views.fleet.fleet_view:FleetView", RIGHT, "block_table", "Ctrl+8", lazy=True),
    PanelSpec("Statistics", "statistics", "app.views.tools.statistics_view:StatisticsView", BOTTOM, "metrics", "Ctrl+9",
              lazy=True),
    # Not lazy: its keys (F2, Shift+F2, Ctrl+B) step and mark from anywhere in the window.
    PanelSpec("Bookmarks", "bookmarks", "app.views.tools.bookmarks_view:BookmarksView", RIGHT, "block_table", None),
)

SCRUB_BAR = "app.views.pool.scrub_bar:ScrubBar"


class PanelMap(Mapping[str, QWidget]):
    """Panels by object_name. A lazy panel is built the first time it is looked up (or its
    dock is shown, which looks it up); iterating names does not build anything.

    Given the context, it also hears the subject changes: a deferred panel built after one
    missed the `show_subject` the panels built before were given, so it is given it then,
    with the subject current at that moment. A panel built before any change is told
    nothing, as the panels built at start were not.
    """

    def __init__(self, build: Callable[[str], None], ctx: AppContext | None = None) -> None:
        self._built: dict[str, QWidget] = {}
        self._pending: dict[str, PanelSpec] = {}
        self._build = build
        self._ctx = ctx
        self.subject_changed = False  # a subject change was announced since the map was made
        if ctx is not None:
            ctx.sigSubjectChanged.connect(self._on_subject_changed)

    def _on_subject_changed(self, _subject: object) -> None:
        self.subject_changed = True

    def add(self, name: str, widget: QWidget) -> None:
        deferred = self._pending.pop(name, None) is not None
        self._built[name] = widget
        if deferred and self.subject_changed and isinstance(widget, PanelView):
            assert self._ctx is not None
            widget.show_subject(self._ctx.subject)

    def defer(self, spec: PanelSpec) -> None:
        self._pending[spec.object_name] = spec

    def pending(self, name: str) -> PanelSpec | None:
        return self._pending.get(name)

    def is_built(self, name: str) -> bool:
        return name in self._built

    def __getitem__(self, name: str) -> QWidget:
        if name in self._pending:
            self._build(name)
        return self._built[name]

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The panel (built if it was put off), or `default` if there is no such panel. Not
        Mapping's `get`: that would also return `default` when building the panel raised a
        KeyError, leaving it unbuilt without a word."""
        return self[name] if name in self else default

    def __contains__(self, name: object) -> bool:  # Mapping's default would build it
        return name in self._built or name in self._pending

    def __iter__(self) -> Iterator[str]:
        return iter([*self._built, *self._pending])

    def __len__(self) -> int:
        return len(self._built) + len(self._pending)


def load_factory(factory: str) -> Any:
    """Import "module:Class" and return the class; raises ImportError/AttributeError."""
    module_name, _, attr = factory.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def build_panel(spec_or_factory: PanelSpec | str, ctx: AppContext) -> QWidget:
    """Build one panel widget from its spec (or "module:Class" factory string); a panel
    that cannot be imported or built raises, so a broken panel is found at once."""
    factory = spec_or_factory.factory if isinstance(spec_or_factory, PanelSpec) else spec_or_factory
    cls = load_factory(factory)
    return cls(ctx)
