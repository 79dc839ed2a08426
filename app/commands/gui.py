"""`cachescope gui`: open the desktop app (the default with no subcommand).

With `--screenshot DIR` it drives a workload offscreen (FILE, or the bundled demo trace),
saves one PNG per panel plus the whole window, and exits.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import sys
import time
from pathlib import Path

from app.commands._common import add_pool_size, non_negative_int, positive_int
from engine.core.errors import InputError, one_line
from engine.core.validation import check_regular_file
from engine.resources import resource_path

NAME = "gui"
HELP = "open the desktop app (optionally with a session, conversation or trace file)"
DEMO_TRACE = resource_path("traces", "demo_tokens.jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="a session database, conversation or trace to open")
    p.add_argument("--model", metavar="M", default=None, help="local HF folder, .gguf file or hub id (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--db", metavar="PATH", default=None, help="session database (default: the one in your user data folder)")
    p.add_argument("--screenshot", metavar="DIR", default=None, help="render every panel to PNGs in DIR offscreen, then exit")
    p.add_argument("--no-model", action="store_true", help="do not load a model (traces can still be opened)")
    add_pool_size(p, "blocks in the model's KV pool (default 256)", dest="num_blocks", flag="--num-blocks", default=256)
    p.add_argument("--block-size", type=positive_int, default=16, metavar="N", help="tokens per block (default 16)")
    p.add_argument("--theme", choices=("dark", "light"), default=None, help="colour theme (default: the last one used)")
    p.add_argument("--event", type=non_negative_int, default=None, metavar="N",
                   help="open FILE at event N (a deep link, as a bookmark points at it)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="open the Compare window on two runs (traces, session files, session:ID, run:ID)")


def run(args: argparse.Namespace) -> int:
    if args.file is not None:
        # Before Qt starts: a FIFO or a device would block or never end the first read.
        check_regular_file(args.file, "session, conversation or trace file")
    if args.screenshot is not None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    else:
        check_display()
    from PySide6.QtWidgets import QApplication

    if args.screenshot is not None:
        _quiet_offscreen_warnings()

    from app.runtime.context import AppContext, make_test_context
    from app.window.main_window import MainWindow, app_icon

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Cachescope")
    app.setOrganizationName("Cachescope")
    app.setWindowIcon(app_icon())
    # A database named on the command line is opened first, so a wrong one ends the command
    # (status 2) before a window shows; the default one once the window is up (below).
    store = _open_store(args.db) if args.db else None
    if args.screenshot is not None:
        # Screenshots never read or write the user's settings, so they always look the same.
        ctx = make_test_context(store=store)
        ctx.suppress_dialogs = True
    else:
        ctx = AppContext(store=store)
    target = Path(args.file) if args.file else DEMO_TRACE
    # Screenshots of a trace need no model; of a conversation or session they do.
    wants_model = not args.no_model and (args.screenshot is None or _classify(target) != "trace")
    window = MainWindow(ctx, model=args.model, load_model=wants_model,
                        num_blocks=args.num_blocks, block_size=args.block_size)
    if args.theme:
        window.apply_theme(args.theme)
    # The demos before the window shows (listing them imports no torch: ~0.01 s), so the
    # Demos menu is whole at the first paint and the saved layout, which places their dock,
    # is applied once; the default store (sqlite-utils) once the window is up, before the
    # panels that read it.
    _install_demos(window)
    if args.screenshot is None and not args.db:
        window.after_first_paint(lambda: _open_default_store(app, ctx))
    try:
        if args.screenshot is not None:
            return screenshot(app, window, Path(args.screenshot), target)
        window.show()
        window.after_first_paint(lambda: _open_at_start(window, args))
        return app.exec()
    finally:
        ctx.shutdown()
        _dispose(app, window)


def _classify(path: Path) -> str:
    """`app.runtime.jobs.classify_file`, imported here: it reads traces (msgspec), which a
    window that opens none does not need."""
    from app.runtime.jobs import classify_file

    return classify_file(path)


def _open_at_start(window, args: argparse.Namespace) -> None:
    """FILE, the event it links to and the Compare window, as the command line asked."""
    if args.file:
        window.open_file(args.file)
    if args.event is not None:
        from app.views.tools.bookmarks_view import EventLink

        EventLink(window.ctx, args.event)
    if args.compare:
        window.show_compare(*args.compare).run_compare()


def _quiet_offscreen_warnings() -> None:
    """Drop the offscreen platform's notes about window hints it cannot honour, which are
    not problems, so stderr carries only what the user must read."""
    from PySide6.QtCore import qInstallMessageHandler

    previous = None

    def handler(mode, context, message):
        if "does not support propagateSizeHints" in message:
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            sys.stderr.write(message + "\n")

    previous = qInstallMessageHandler(handler)


def _dispose(app, window) -> None:
    """Delete the window while Qt is still alive: left to interpreter shutdown, the order in
    which PySide6 frees widgets and plot items can crash the process on exit."""
    import gc

    window.close()
    window.deleteLater()
    app.processEvents()
    del window
    gc.collect()


# Libraries Qt 6's xcb platform plugin loads beyond libX11, with their Debian packages.
_XCB_LIBRARIES = (("xcb-cursor", "libxcb-cursor0"), ("xcb-icccm", "libxcb-icccm4"), ("xcb-keysyms", "libxcb-keysyms1"),
                  ("xcb-image", "libxcb-image0"), ("xcb-render-util", "libxcb-render-util0"),
                  ("xkbcommon-x11", "libxkbcommon-x11-0"))


def check_display() -> None:
    """Turn the cases where Qt would abort the process into one sentence (exit status 2)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        raise InputError("no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set); run "
                         "cachescope in a desktop session, or headless use `cachescope gui --screenshot DIR` "
                         "or the other subcommands")
    if not os.environ.get("WAYLAND_DISPLAY"):
        missing = [pkg for lib, pkg in _XCB_LIBRARIES if ctypes.util.find_library(lib) is None]
        if missing:
            raise InputError(f"Qt's X11 plugin needs system libraries that are not installed; install them "
                             f"(Debian/Ubuntu: sudo apt install {' '.join(missing)}) and start cachescope again")


def _install_demos(window) -> None:
    """Fill the Demos menu and add the demo guide dock."""
    from app.demos.runner import install_demos

    install_demos(window)
    window.adopt_extra_docks()


def _open_default_store(app, ctx) -> None:
    """The user's database into `ctx`; one that cannot be opened is said, and ends the app
    with status 2, as before a window showed."""
    try:
        ctx.store = _open_store(None)
    except InputError as exc:
        ctx.show_error(one_line(str(exc)))
        app.exit(2)


def _open_store(path: str | None):
    try:
        from engine.store.database import Store
    except ImportError:
        return None
    return Store(path)


def wait_idle(app, window, timeout_s: float = 600.0) -> None:
    """Process events until the worker has no job and the bridge has nothing buffered."""
    ctx = window.ctx
    deadline = time.monotonic() + timeout_s
    idle_since = None
    while time.monotonic() < deadline:
        app.processEvents()
        busy = ctx.worker.is_busy or ctx.bridge.num_pending or getattr(window.panels.get("conversation"), "is_generating", False)
        if busy:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 0.3:
            return
        time.sleep(0.005)
    raise InputError(f"the workload did not finish within {timeout_s:.0f} s")


def screenshot(app, window, folder: Path, file: Path) -> int:
    """Run `file` through the app offscreen and save every panel and the window as PNGs."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {folder}: {exc.strerror}") from None
    window.resize(1600, 1000)
    window.show()
    app.processEvents()
    window.finish_startup()  # the store, every start-up panel and the demos, before the file
    # Errors were already written to stderr, one line each, by `show_error` (no dialogs here).
    if not window.open_file(file):
        if not window.ctx.errors:
            raise InputError(f"{file} could not be opened")
        return 2
    wait_idle(app, window)
    # A model that fails to load was reported and the app went on without it; only a
    # file that cannot be shown ends the run.
    if any(e != window.ctx.model_error for e in window.ctx.errors):
        return 2
    # Let the block table's "just evicted" flashes fade, as a person would see it.
    settle = time.monotonic() + 1.2
    while time.monotonic() < settle:
        app.processEvents()
        time.sleep(0.01)
    saved = []
    for name, dock in window.docks.items():
        dock.show()
        dock.raise_()
        app.processEvents()
        # A panel built or shown now may compute on the worker (Statistics, Billing,
        # Sweep): grab what it shows once that is done, not its "computing" state, and
        # leave no job running when the window closes.
        wait_idle(app, window)
        widget = dock.widget()
        if widget.width() < 200 or widget.height() < 150:
            widget.resize(max(widget.width(), 640), max(widget.height(), 400))
        path = folder / f"{name}.png"
        if not dock.grab().save(str(path)):
            raise InputError(f"cannot write {path}")
        saved.append(path)
    for name in ("conversation", "block_table", "timeline", "metrics"):
        if name in window.docks:
            window.docks[name].raise_()
    app.processEvents()
    path = folder / "main_window.png"
    window.grab().save(str(path))
    saved.append(path)
    sys.stdout.write("".join(f"{p}\n" for p in saved))
    return 0
