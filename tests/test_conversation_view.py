"""The conversation panel on the real default model: streaming, token strips, edit and re-run."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QPoint

from app.runtime.context import make_test_context
from app.views.chat.conversation_view import ConversationView, MessageCard
from app.ui.token_strip import StripData, TokenStrip

pytestmark = pytest.mark.model
MAX_NEW = 6


@pytest.fixture(scope="module")
def loaded():
    from engine.model.loader import load_model

    return load_model()


@pytest.fixture
def ctx(qtbot, tmp_path, loaded):
    from engine.core.events import EventBus
    from engine.model.runner import ModelRunner
    from engine.store.database import Store

    c = make_test_context(tmp_path, store=Store(tmp_path / "sessions.db"))
    c.set_runner(ModelRunner(loaded, num_blocks=64, block_size=16, seed=0, events=EventBus()))
    yield c
    c.shutdown()


@pytest.fixture
def view(qtbot, ctx):
    v = ConversationView(ctx)
    v.max_tokens.setValue(MAX_NEW)
    v.resize(520, 700)
    qtbot.addWidget(v)
    v.show()
    return v


def _wait_idle(qtbot, view):
    qtbot.waitUntil(lambda: not view.is_generating, timeout=120_000)
    view.ctx.bridge.flush(everything=True)


def test_send_streams_tokens_and_colours_the_strip(qtbot, view, ctx):
    streamed: list[str] = []
    view.chat.sigToken.connect(lambda tid, text: streamed.append(text))
    view.input.setPlainText("What is the capital of France?")
    with qtbot.waitSignal(view.sigTurnFinished, timeout=120_000) as turn:
        view.send_button.click()
    assert turn.args == [1]
    assert view.input.toPlainText() == ""  # view to model: the box was consumed
    user, reply = view.messages
    assert user.content == "What is the capital of France?" and reply.role == "assistant"
    r = reply.result
    assert 1 <= len(r.output_token_ids) <= MAX_NEW
    assert streamed and len(streamed) == len(r.output_token_ids)
    assert view.cards[1].text_label.text() == r.output_text
    # Model to view: the user's strip is the prompt the runner really saw, all computed (cold cache).
    strip = view.cards[0].strip.data
    assert strip.start == 0 and strip.token_ids == r.prompt_token_ids[:len(strip.token_ids)]
    assert set(strip.states) <= {"computed", "partial"}
    full_blocks = r.num_prompt_tokens // 16 * 16
    assert strip.states.count("partial") == sum(1 for p in range(len(strip.token_ids)) if p >= full_blocks)
    assert strip.miss_position == 0  # a cold cache misses from the first block
    gen = view.cards[1].strip.data
    assert gen.states.count("generated") == len(r.output_token_ids)
    # Persisted: the session holds both messages and the request.
    view.flush_store()  # writes go through the store's writer thread; wait for them
    msgs = ctx.store.messages(ctx.session_id)
    assert [(m.role, m.content) for m in msgs] == [("user", user.content), ("assistant", r.output_text)]
    # Through the bridge the state saw the request.
    assert ctx.state.projection.counters.num_requests == 1


def test_second_turn_reuses_the_first_and_edit_invalidates_from_the_edit(qtbot, view, ctx):
    view.send("Name a colour.")
    _wait_idle(qtbot, view)
    view.send("Name an animal that is that colour.")
    _wait_idle(qtbot, view)
    first, second = view.messages[1].result, view.messages[3].result
    assert second.num_cached_tokens >= 16 and second.num_cached_tokens % 16 == 0
    strips = [c.strip.data for c in view.cards]
    assert strips[0].states.count("cached") == 0  # turn 1 ran on a cold cache
    # A reply's strip is its whole request: the second one reused the history's full blocks.
    assert strips[3].token_ids == second.prompt_token_ids + second.output_token_ids
    assert strips[3].states.count("cached") == second.num_cached_tokens
    assert strips[3].states.count("generated") == len(second.output_token_ids)
    assert strips[1].states.count("cached") == first.num_cached_tokens == 0

    # Edit the first user message: both turns re-run; the first miss lands inside the edit.
    events: list = []
    ctx.bridge.sigEvents.connect(events.extend)
    assert view.edit_message(0, "Name a fruit.")
    assert view.messages[1].result is None and view.messages[3].stale  # turn 1 is already re-running
    _wait_idle(qtbot, view)
    ctx.bridge.flush(everything=True)
    assert not any(m.stale for m in view.messages)
    assert [m.content for m in view.messages if m.role == "user"] == ["Name a fruit.", "Name an animal that is that colour."]
    redo = view.messages[1].result
    strip = view.cards[0].strip.data
    assert strip.miss_position is not None and strip.miss_position == redo.num_cached_tokens
    assert strip.start <= strip.miss_position < strip.start + len(strip.token_ids)
    assert strip.states[strip.miss_position - strip.start] in ("computed", "partial")
    if strip.divergence_position is not None:
        assert strip.divergence_position >= strip.miss_position
    # The engine said so too: the re-run's lookup missed with new content at that block.
    lookups = [e for e in events if e.kind == "lookup"]
    assert len(lookups) == 2
    assert lookups[0].miss.reason == "new_content"
    assert lookups[0].num_cached_tokens == redo.num_cached_tokens < first.num_prompt_tokens
    # The store kept the edit history.
    view.flush_store()
    history = ctx.store.messages(ctx.session_id, include_history=True)
    assert [m.content for m in history if m.position == 0] == ["Name a colour.", "Name a fruit."]


def test_send_while_busy_queues_without_a_dialog(qtbot, view, ctx):
    assert view.send("Say hi.")
    assert view.send("And again.")  # queued behind the running turn
    assert ctx.errors == []
    _wait_idle(qtbot, view)
    assert [m.role for m in view.messages] == ["user", "assistant", "user", "assistant"]
    assert all(m.result is not None for m in view.messages if m.role == "assistant")


def test_a_message_sent_after_a_trace_runs_once(qtbot, view, ctx):
    """Sending points the bridge back at the model's engine, which emits sigRunnerChanged; the
    controller must not start the turn from that signal as well (it did: the second start
    popped an empty queue, IndexError in _run_next, seen by make_screenshots.py)."""
    from app.runtime.replays import TraceReplays
    from engine.resources import resource_path

    replays = TraceReplays(ctx)
    with qtbot.waitSignal(replays.sigShown, timeout=120_000):
        replays.start(resource_path("traces", "demo_tokens.jsonl"))
    assert ctx.bridge.bus is not ctx.runner.manager.events  # the views show the trace
    started: list[int] = []
    view.chat.sigTurnStarted.connect(started.append)
    assert view.send("Name a colour.")
    _wait_idle(qtbot, view)
    assert started == [1] and ctx.errors == []
    assert [m.role for m in view.messages] == ["user", "assistant"] and view.messages[1].result is not None
    assert ctx.bridge.bus is ctx.runner.manager.events  # the views follow the model again


def test_import_file_replays_recorded_turns(qtbot, view, ctx, tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Tell me a fact about bees."}]}))
    view.import_file(path)
    _wait_idle(qtbot, view)
    roles = [m.role for m in view.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert view.messages[1].content == "Hi! How can I help you today?"  # recorded reply kept
    assert view.messages[3].result is not None and view.messages[3].content  # missing reply generated
    assert view.messages[3].result.num_cached_tokens > 0  # turn 2 reused turn 1
    assert ctx.store.get_session(ctx.session_id).source_format == "openai"
    # One card per message: the cards of the first layout are gone, not painted underneath.
    assert len(view.findChildren(MessageCard)) == len(view.messages) == len(view.cards)


def test_token_strip_paints_blocks_and_answers_hover(qtbot):
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(200, 60)
    data = StripData(list(range(40)), [f"t{i}" for i in range(40)], ["cached"] * 16 + ["computed"] * 20 + ["partial"] * 4,
                     start=0, block_size=16, miss_position=16, divergence_position=18, miss_text="first missed block 1: new content")
    strip.set_data(data)
    strip.show()
    assert strip.count("cached") == 16 and strip.num_tokens == 40
    assert strip.heightForWidth(200) > strip.heightForWidth(2000)  # wraps
    r15, r16 = strip.cell_rect(15), strip.cell_rect(16)
    assert r16.left() - r15.right() > r15.left() - strip.cell_rect(14).right()  # a wider gap at the block border
    assert strip.cell_at(strip.cell_rect(18).center()) == 18
    text = strip.tooltip_text(18)
    assert "token 18 (block 1)" in text and "id 18" in text and "differs" in text
    assert strip.cell_at(QPoint(-5, -5)) is None
    img = strip.grab().toImage()
    assert img.pixelColor(strip.cell_rect(0).center()).name() != img.pixelColor(strip.cell_rect(20).center()).name()
    with pytest.raises(ValueError, match="unknown token states"):
        StripData([1], ["a"], ["hot"])


def test_window_loads_the_model_on_the_worker_and_a_chat_reaches_every_view(qtbot, tmp_path):
    from app.window.main_window import MainWindow

    ctx = make_test_context(tmp_path)
    progress: list[tuple[str, float]] = []
    ctx.worker.sigProgress.connect(lambda text, f: progress.append((text, f)))
    w = MainWindow(ctx, load_model=True, num_blocks=48)
    qtbot.addWidget(w)
    w.show()
    try:
        assert ctx.runner is None  # the window is up before the model
        with qtbot.waitSignal(ctx.sigRunnerChanged, timeout=120_000):
            pass
        assert progress and progress[-1][1] >= 0.9
        assert w.status_labels["model"].text() == ctx.runner.loaded.name
        assert "48 blocks" in w.status_labels["occupancy"].text() or ctx.state.projection.num_blocks == 48
        conv = w.panels["conversation"]
        conv.max_tokens.setValue(MAX_NEW)
        conv.input.setPlainText("Say one word.")
        with qtbot.waitSignal(conv.sigIdle, timeout=120_000):
            conv.send_button.click()
        ctx.bridge.flush(everything=True)
        result = conv.messages[1].result
        proj = ctx.state.projection
        assert proj.num_blocks == 48 and proj.counters.num_requests == 1
        assert proj.num_cached_free == ctx.runner.manager.snapshot().num_cached_blocks > 0
        assert w.panels["event_log"].model.rowCount() == len(ctx.state.log) > 5
        assert w.status_labels["hit_rate"].text() == "hit rate 0.0%"
        assert result.num_prompt_tokens == len(result.prompt_token_ids)
        assert ctx.errors == []
    finally:
        ctx.shutdown()
