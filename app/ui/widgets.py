"""Widgets and wiring every view shares: the `PanelView` base class and event links.

A view built on `PanelView` gets a typed `AppContext`, restyles on a theme change and
hears when the subject changes, without probing the context with `hasattr`. An "event N"
anywhere in the app is written by `event_link` and scrubs every view to N when clicked.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from app.ui import theme

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject
    from app.runtime.state import PoolState

LINK_SCHEME = "event:"


def event_link(seq: int | None, state: PoolState | None, text: str | None = None) -> str:
    """HTML for "event N": a link that scrubs to N when N is in the log, plain text otherwise."""
    if seq is None:
        return html.escape(text or "an unknown event")
    label = html.escape(text or f"event {seq:,}")
    if state is not None and state.contains(seq):
        # The theme's accent, not Qt's default link blue, which is unreadable on the dark theme.
        return f"<a href='{LINK_SCHEME}{int(seq)}' style='color:{theme.color('accent').name()}'>{label}</a>"
    return label


def eviction_phrase(seq: int | None, state: PoolState | None) -> str:
    """HTML saying where a block was lost: "evicted at event N" (a link) or, when the engine
    lost it before the log the views hold began, exactly that, never a seq the log lacks."""
    if seq is None:
        return "evicted earlier"
    if state is not None and state.contains(seq):
        event = state.log.event_at_seq(int(seq))
        verb = "cleared by the cache reset at" if event is not None and event.kind == "cache_reset" else "evicted at"
        return f"{verb} {event_link(seq, state)}"
    return "evicted before this log began"


def seq_of_link(href: str) -> int | None:
    """The seq an event link points at, or None for any other link."""
    if not href.startswith(LINK_SCHEME):
        return None
    try:
        return int(href[len(LINK_SCHEME):])
    except ValueError:
        return None


def follow_link(state: PoolState, href: str) -> bool:
    """Scrub `state` to the event `href` names; False if it names none."""
    seq = seq_of_link(href)
    if seq is None or not state.contains(seq):
        return False
    state.scrub_to(seq)
    return True


class EventLinkLabel(QLabel):
    """A rich-text label whose "event N" links scrub the views to N."""

    def __init__(self, state: PoolState, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.state = state
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.setOpenExternalLinks(False)
        self.linkActivated.connect(self.follow)

    def follow(self, href: str) -> bool:
        return follow_link(self.state, href)


class PanelView(QWidget):
    """Base of a dock panel: `ctx` (typed), `state`, and two hooks a view overrides.

    `apply_theme(name)` runs after the style sheet changed (restyle plots and painters);
    `show_subject(subject)` runs when another subject replaced the last one (clear what
    belonged to the old one, or say that this view does not apply to the new one).
    """

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        ctx.sigThemeChanged.connect(self.apply_theme)
        ctx.sigSubjectChanged.connect(self.show_subject)

    def apply_theme(self, name: str) -> None:
        """Restyle what the style sheet cannot reach; the base has nothing to do."""

    def show_subject(self, subject: Subject) -> None:
        """Forget the previous subject's content; the base has nothing to forget."""
