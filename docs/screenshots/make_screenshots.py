"""The README's twelve panel pictures, taken after real flows in a real window offscreen.

Each flow is driven as a user would: a chat on the bundled model with its first message
edited, the edit's requests in Diff, the Mooncake trace opened, a sweep run on it, a guarded
lookup in the Semantic cache, a guided demo from the Demos menu. Run by `make screenshots`;
a flow that does not finish, or an error the app reports or raises, ends the run with status
2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
SWEEP_REQUESTS = 3000  # the first 3,000 requests: the whole trace's sweep takes minutes
CHAT = ("Give me three tips for writing clear Python code.",
        "Which of those matters most for beginners?",
        "And for testing it?")
EDITED_FIRST = "Give me three tips for writing clear Rust code."  # Python -> Rust: the re-run misses from block 1
MAX_NEW_TOKENS = 40
NEAR_MISS = "How do I not reverse a list in Python?"
FLOW_TIMEOUT_S = 900.0


class FlowFailed(Exception):
    """A flow did not finish, or the app reported an error during it."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder for the PNGs")
    p.add_argument("--size", default="1600x1000", help="window size WxH (default 1600x1000)")
    p.add_argument("--theme", choices=("dark", "light"), default="dark")
    args = p.parse_args(argv)
    try:
        args.width, args.height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        p.error(f"--size takes WxH, e.g. 1600x1000, not {args.size!r}")
    return args


class Shots:
    """One MainWindow, the flows run in it, and the PNGs saved from it."""

    def __init__(self, app, window, out: Path) -> None:
        self.app, self.window, self.ctx, self.out = app, window, window.ctx, out
        self.saved: list[Path] = []
        self.exceptions: list[str] = []  # raised in a slot: Qt goes on, so the run must not

        def hook(kind, value, tb) -> None:
            frames = traceback.extract_tb(tb)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            self.exceptions.append(f"{kind.__name__}: {value}{where}")

        sys.excepthook = hook

    # ------------------------------------------------------------------ waiting
    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.01)

    def wait_idle(self, flow: str) -> None:
        from app.commands.gui import wait_idle
        from engine.core.errors import InputError

        try:
            wait_idle(self.app, self.window, FLOW_TIMEOUT_S)
        except InputError as exc:
            raise FlowFailed(f"{flow}: {exc}") from None
        self.check(flow)

    def wait_until(self, flow: str, done, what: str) -> None:
        deadline = time.monotonic() + FLOW_TIMEOUT_S
        while not done():
            self.check(flow)
            if time.monotonic() > deadline:
                raise FlowFailed(f"{flow}: {what} did not happen within {FLOW_TIMEOUT_S:g} s")
            self.app.processEvents()
            time.sleep(0.01)
        self.wait_idle(flow)

    def check(self, flow: str) -> None:
        if self.exceptions:
            raise FlowFailed(f"{flow}: the app raised {self.exceptions[0]}")
        if self.ctx.errors:
            raise FlowFailed(f"{flow}: the app reported: {self.ctx.errors[-1]}")

    # ------------------------------------------------------------------ grabbing
    def show(self, dock_name: str):
        dock = self.window.docks[dock_name]
        dock.show()
        dock.raise_()
        self.app.processEvents()
        return dock

    def grab_panel(self, dock_name: str, file: str, flow: str, height: int | None = None) -> None:
        """Save the dock's widget. With `height`, the dock is first floated at its width and
        that height, as a user would undock a panel to read more of it, and docked back after."""
        dock = self.show(dock_name)
        self.wait_idle(flow)  # a panel shown now may compute on the worker (Billing)
        layout = self.window.saveState()
        if height is not None:
            width = dock.width()
            dock.setFloating(True)
            dock.resize(width, height)
        self.pump(0.4)
        self.save(dock.widget().grab(), file)
        if height is not None:
            self.window.restoreState(layout)
            self.pump(0.2)

    def save(self, pixmap, file: str) -> None:
        path = self.out / file
        if not pixmap.save(str(path)):
            raise FlowFailed(f"cannot write {path}")
        self.saved.append(path)

    # ------------------------------------------------------------------ flows
    def load_model(self) -> None:
        flow = "loading the bundled model"
        self.wait_until(flow, lambda: self.ctx.runner is not None or self.ctx.model_error is not None, "the model load")
        if self.ctx.runner is None:
            raise FlowFailed(f"{flow}: {self.ctx.model_error}")

    def trace(self) -> None:
        flow = "the Mooncake trace"
        if not self.window.open_file(MOONCAKE):
            raise FlowFailed(f"{flow}: {MOONCAKE} was not opened")
        self.wait_until(flow, lambda: self.window.last_replay is not None, "the replay")
        self.pump(1.2)  # the block table's "just evicted" flashes fade, as a person would see it
        for dock, file in (("block_table", "block_table.png"), ("hash_chains", "hash_chains.png"),
                           ("timeline", "timelines.png"), ("event_log", "event_log.png"),
                           ("metrics", "metrics.png")):
            self.grab_panel(dock, file, flow)
        billing = self.window.panels["billing"]
        self.show("billing")
        self.wait_until(flow + "'s bill", lambda: billing.result is not None, "the bill")
        self.grab_panel("billing", "billing.png", flow, height=560)

    def sweep(self) -> None:
        flow = "the sweep of the Mooncake trace"
        view = self.window.panels["sweep"]
        self.show("sweep")
        if Path(view.trace.text()) != MOONCAKE:
            raise FlowFailed(f"{flow}: the Sweep panel offers {view.trace.text()!r}, not the opened trace")
        view.limit.setValue(SWEEP_REQUESTS)
        view.run_button.click()
        self.wait_until(flow, lambda: view.result is not None and view.run_button.isEnabled(), "the sweep")
        self.grab_panel("sweep", "sweeps.png", flow, height=640)

    def chat(self) -> None:
        flow = "the chat"
        view = self.window.panels["conversation"]
        self.show("conversation")
        view.max_tokens.setValue(MAX_NEW_TOKENS)
        for i, text in enumerate(CHAT):
            view.input.setPlainText(text)
            view.send_button.click()
            self.wait_until(flow, lambda i=i: len(view.messages) == 2 * i + 2 and not view.is_generating
                            and view.messages[-1].result is not None, f"the reply to turn {i + 1}")
        before = [{"role": m.role, "content": m.content} for m in view.messages[:-1]]
        card = view.cards[0]
        card.edit_button.click()
        card.editor.setPlainText(EDITED_FIRST)
        card.rerun_button.click()
        self.wait_until(flow + "'s edit", lambda: not view.is_generating and not view.chat.num_queued
                        and all(m.result is not None and not m.stale for m in view.messages if m.role == "assistant"),
                        "the re-run after the edit")
        after = [{"role": m.role, "content": m.content} for m in view.messages[:-1]]
        view.scroll.verticalScrollBar().setValue(0)  # the edited message and where it first missed
        self.grab_panel("conversation", "conversation.png", flow, height=900)
        self.grab_panel("kv_memory", "kv_memory.png", flow)
        self.diff(before, after)

    def diff(self, before: list[dict[str, str]], after: list[dict[str, str]]) -> None:
        """The last request before the edit against the same request after it."""
        flow = "the edit's diff"
        view = self.window.panels["diff"]
        self.show("diff")
        view.edit_a.setPlainText(json.dumps(before, ensure_ascii=False))
        view.edit_b.setPlainText(json.dumps(after, ensure_ascii=False))
        self.wait_until(flow, lambda: view.result is not None, "the comparison")
        self.grab_panel("diff", "diff.png", flow, height=560)

    def run_demo(self, name: str) -> None:
        from engine.demos import get_demo

        title = get_demo(name).title
        flow = f"the demo {title!r}"
        runner = self.window.demo_runner
        action = next((a for a in self.window.demos_menu.actions() if a.text() == title), None)
        if action is None:
            raise FlowFailed(f"{flow}: not in the Demos menu")
        finished = []
        runner.sigFinished.connect(finished.append)
        action.trigger()
        self.wait_until(flow, lambda: finished and runner.running is None, "the demo")
        runner.sigFinished.disconnect(finished.append)

    def semantic(self) -> None:
        flow = "the semantic lookup"
        self.run_demo("semantic-false-positive")  # its cache of answers is the one looked in
        view = self.window.panels["semantic"]
        self.show("semantic")
        view.prompt.setText(NEAR_MISS)
        view.guard.setChecked(True)
        looked = []
        view.sigLookedUp.connect(looked.append)
        view.lookup_button.click()
        self.wait_until(flow, lambda: looked and looked[-1].prompt == NEAR_MISS and view.quality is not None,
                        "the lookup")
        self.grab_panel("semantic", "semantic.png", flow, height=700)

    def demo(self) -> None:
        for dock in ("block_table", "timeline"):  # the pool's views, not the last tool used
            self.show(dock)
        self.run_demo("multi-turn-reuse")
        self.pump(0.5)
        self.save(self.window.grab(), "demo.png")


def _quiet_floating_raise() -> None:
    """A floated dock asks the offscreen platform to raise it, which it cannot and says; that
    note is not a problem, so it is dropped like the others `gui --screenshot` drops."""
    from PySide6.QtCore import qInstallMessageHandler

    previous = None

    def handler(mode, context, message):
        if "does not support raise()" not in message and previous is not None:
            previous(mode, context, message)

    previous = qInstallMessageHandler(handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from PySide6.QtWidgets import QApplication

    from app.commands.gui import _dispose, _install_demos, _quiet_offscreen_warnings
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow

    _quiet_offscreen_warnings()
    _quiet_floating_raise()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Cachescope")
    app.setOrganizationName("Cachescope")
    args.out.mkdir(parents=True, exist_ok=True)
    # As `cachescope gui --screenshot` builds it: the user's settings neither read nor written.
    ctx = make_test_context()
    ctx.suppress_dialogs = True
    window = MainWindow(ctx, load_model=True)
    window.apply_theme(args.theme, save=False)
    _install_demos(window)
    window.resize(args.width, args.height)
    window.show()
    app.processEvents()
    window.finish_startup()
    shots = Shots(app, window, args.out)
    try:
        shots.load_model()
        # The chat first, so its pictures show the model's pool (a message sent while a
        # trace is open raised in ChatController._run_next until 6509b0d fixed it)
        shots.chat()
        shots.trace()
        shots.sweep()
        shots.semantic()
        shots.demo()
        shots.check("the last flow")
    except FlowFailed as exc:
        sys.stderr.write(f"make_screenshots: {exc}\n")
        return 2
    except Exception as exc:  # noqa: BLE001 - any other failure is one line and status 2 too
        sys.stderr.write(f"make_screenshots: {type(exc).__name__}: {exc}\n")
        return 2
    finally:
        ctx.shutdown()
        _dispose(app, window)
    sys.stdout.write("".join(f"{p}\n" for p in shots.saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
