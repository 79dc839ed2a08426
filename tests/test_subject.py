"""One subject in every view, one numbering: the flows a user drives, in a real window.

A chat runs on a tiny random Llama with the real tokenizer (fast, same code path as the
default model); traces are the bundled ones replayed on the worker; demos run their real
scripts. Nothing here is timed.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from app.runtime.context import Subject, engine_info  # noqa: E402
from app.demos.runner import install_demos  # noqa: E402
from app.runtime.state import is_eviction  # noqa: E402
from app.views.pool.event_log_view import describe  # noqa: E402
from app.runtime.chat_messages import ChatMessage, reuse_reason  # noqa: E402
from app.ui.widgets import seq_of_link  # noqa: E402
from engine.core.hashing import BlockHasher  # noqa: E402
from engine.core.manager import PrefixCacheManager, Request  # noqa: E402
from engine.resources import resource_path  # noqa: E402

TRACE = resource_path("traces") / "demo_tokens.jsonl"
BIG_TRACE = resource_path("traces") / "mooncake_synthetic_trace.jsonl"
WAIT_MS = 300_000  # a shared, busy test machine


@pytest.fixture
def chat_window(window, tiny_model):
    from engine.core.events import EventBus
    from engine.model.runner import ModelRunner

    window.ctx.set_runner(ModelRunner(tiny_model, num_blocks=64, block_size=4, seed=0, events=EventBus()))
    conversation = window.panels["conversation"]
    conversation.max_tokens.setValue(3)
    return window


def _chat(qtbot, window, text):
    conversation = window.panels["conversation"]
    assert conversation.send(text)
    qtbot.waitUntil(lambda: not conversation.is_generating, timeout=WAIT_MS)
    window.ctx.bridge.flush(everything=True)
    return conversation


def _open_trace(qtbot, window, path=TRACE):
    done: list = []
    assert window.open_file(path, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    window.ctx.bridge.flush(everything=True)
    return done[0]


# ---------------------------------------------------------------------------- one subject
def test_opening_a_trace_asks_before_replacing_an_unsaved_chat(qtbot, chat_window):
    window, ctx = chat_window, chat_window.ctx
    conversation = _chat(qtbot, window, "Hello there")
    assert ctx.subject.kind == "session" and ctx.subject.unsaved  # no store: lost if replaced
    ctx.answer_replace = False
    assert not window.open_file(TRACE)  # the user said no: nothing changes
    assert ctx.subject.kind == "session" and len(conversation.messages) == 2
    ctx.answer_replace = True
    result = _open_trace(qtbot, window)
    assert result is not None and ctx.subject == Subject("trace", TRACE.name, source=str(TRACE))
    assert TRACE.name in window.windowTitle()
    # The chat does not sit beside the trace's pool: the panel says it does not apply.
    assert conversation.messages == [] and "does not apply" in conversation.placeholder.text()
    assert len(ctx.state.log) > 0 and ctx.errors == []
    # The status bar shows the final figures only once the views hold every event.
    assert ctx.bridge.num_pending == 0 and not window.progress.isVisible()


def test_a_demo_asks_first_and_the_next_subject_clears_what_it_filled(qtbot, window, default_model):
    ctx = window.ctx
    runner = install_demos(window, model=default_model)
    ctx.mark_unsaved(True)
    ctx.answer_replace = False
    assert not runner.run("default-system-prompt-diff") and runner.running is None
    ctx.answer_replace = True
    with qtbot.waitSignal(runner.sigFinished, timeout=WAIT_MS):
        assert runner.run("default-system-prompt-diff")
    diff = window.panels["diff"]
    assert ctx.subject.kind == "demo" and diff.source == ctx.subject.title
    qtbot.waitUntil(lambda: diff.result is not None, timeout=WAIT_MS)
    assert "does not apply" in window.panels["conversation"].placeholder.text()
    _open_trace(qtbot, window)
    assert diff.source is None and diff.edit_a.toPlainText() == "" and diff.result is None
    assert "Pick one from the Demos menu" in runner.guide.browser.toPlainText()


@pytest.mark.parametrize("name, panel", [("kv-memory-70b-128k", "kv_memory"),
                                         ("prompt-caching-bill", "billing"),
                                         ("semantic-false-positive", "semantic")])
def test_each_demo_fills_the_panel_its_story_is_about(qtbot, window, default_model, name, panel):
    runner = install_demos(window, model=default_model)
    with qtbot.waitSignal(runner.sigFinished, timeout=WAIT_MS) as finished:
        assert runner.run(name)
    findings = finished.args[0]["findings"]
    view = window.panels[panel]
    if panel == "kv_memory":
        assert view.preset_box.currentData() == "llama-3.1-70b"
        assert view.tokens_box.value() == findings["tokens"]
        assert "llama-3.1-70b" in view.what_if.text() and view.dtype_box.currentText() == "bfloat16"
        assert len(window.ctx.state.log) == 0  # no engine in this demo: the pool views are empty
    elif panel == "billing":
        assert view.source.text().endswith("billing_long_session.json")
        assert view.provider.currentText() == "anthropic"
    else:
        wrong = next(q for q in findings["queries"] if q["served_wrong_answer"])
        qtbot.waitUntil(lambda: view.result is not None, timeout=WAIT_MS)
        assert view.cache_source == finished.args[0]["title"]
        assert view.result.prompt == wrong["prompt"] and view.table.rowCount() > 0
        assert view.decision_label.text() != "no lookup yet"
    assert not window.docks[panel].isHidden()
    assert window.ctx.errors == []
    # The steps name their prompts and the findings are in words and units.
    text = runner.guide.browser.toPlainText()
    assert "{" not in text.split("Findings", 1)[1]
    if name == "semantic-false-positive":
        assert "cache the answer to:" in text and "cache an answer\n" not in text


def test_cancel_stops_a_trace_load(qtbot, window):
    ctx = window.ctx
    gate = threading.Event()
    ctx.worker.submit(gate.wait)  # the worker is busy: the load waits behind it
    done: list = []
    assert window.open_file(BIG_TRACE, on_done=done.append)
    assert window.cancel_button.isVisibleTo(window)
    assert ctx.cancel_job()
    gate.set()
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    assert done == [None] and ctx.errors == []  # cancelled is not an error
    assert "cancelled" in window.statusBar().currentMessage()
    assert not window.cancel_button.isVisibleTo(window) and ctx.job is None


# ---------------------------------------------------------------------------- back to live
def test_scrub_then_new_session_and_send_returns_to_live(qtbot, chat_window):
    window, ctx = chat_window, chat_window.ctx
    _chat(qtbot, window, "First question")
    log = window.panels["event_log"]
    log.table.selectRow(2)  # scrub through the log
    assert not ctx.state.is_live
    ctx.answer_replace = True
    assert window.panels["conversation"].new_session()
    assert ctx.state.is_live  # a new subject starts live
    log.table.selectRow(1)
    assert not ctx.state.is_live
    _chat(qtbot, window, "Second question")
    assert ctx.state.is_live and ctx.state.current_seq == ctx.state.log.last_seq
    grid = window.panels["block_table"]
    qtbot.waitUntil(lambda: grid._drawn_version == ctx.state.version, timeout=WAIT_MS)
    assert window.scrub_bar.live.isChecked()


# ---------------------------------------------------------------------------- one numbering
def test_one_numbering_and_request_name_across_views(qtbot, chat_window):
    window, ctx = chat_window, chat_window.ctx
    conversation = _chat(qtbot, window, "Name the planets")
    reply = conversation.messages[1].result
    rid = str(reply.request_id)
    # The chat names the request as the engine does; so do the pool's records and the log.
    assert rid in conversation.cards[1].stats.text()
    assert rid in {r.request_id for r in ctx.state.projection.request_records()}
    lookup = next(e for e in ctx.state.log.events if e.kind == "lookup")
    ctx.state.scrub_to(lookup.seq)
    assert f"event {lookup.seq}:" in window.scrub_bar.label.text()
    detail = window.panels["event_log"].detail.text()
    assert f"event:{lookup.seq}" in detail and f"request {rid}" in detail
    assert window.panels["event_log"].selected_event() == lookup  # a columnar log builds its events


def _evicting_engine(ctx):
    bus = ctx.new_event_bus(engine_info(block_size=2, num_blocks=4))
    mgr = PrefixCacheManager(4, 2, BlockHasher(seed=0), bus)
    for rid, tokens in (("a", [1, 2, 3, 4, 5]), ("b", [6, 7, 8, 9, 10]), ("a2", [1, 2, 3, 4, 5])):
        mgr.allocate(Request(rid, tokens))
        mgr.finish(rid)
    ctx.bridge.flush(everything=True)
    return mgr, bus


def test_an_eviction_link_scrubs_to_its_event(qtbot, window):
    ctx = window.ctx
    _evicting_engine(ctx)
    lookup = [e for e in ctx.state.log.events if e.kind == "lookup"][-1]
    assert lookup.miss.reason == "evicted"
    html = describe(lookup, ctx.state, rich=True)
    links = [seq_of_link(part.split("'")[0]) for part in html.split("href='")[1:]]
    assert links == [lookup.miss.evicted_by_seq]
    ctx.state.scrub_to(lookup.seq)
    log = window.panels["event_log"]
    assert log.detail.follow(f"event:{lookup.miss.evicted_by_seq}")
    assert ctx.state.current_seq == lookup.miss.evicted_by_seq
    assert ctx.state.log.event_at_seq(ctx.state.current_seq).kind == "block_evicted"
    # Next/previous eviction and miss in the time bar.
    bar = window.scrub_bar
    ctx.state.scrub_to(ctx.state.log.first_seq)
    first_eviction = next(e.seq for e in ctx.state.log.events if is_eviction(e))
    assert bar.jump(is_eviction, True) == first_eviction == ctx.state.current_seq
    assert bar.jump(is_eviction, False) is None  # none earlier: stays
    assert ctx.state.current_seq == first_eviction


def test_an_eviction_before_the_log_is_never_named_as_an_event(qtbot, window):
    ctx = window.ctx
    mgr, bus = _evicting_engine(ctx)
    ctx.attach_events(bus, engine_info(block_size=2, num_blocks=4))  # the views start over
    mgr.allocate(Request("b2", [6, 7, 8, 9, 10]))  # b was evicted before the views started over
    ctx.bridge.flush(everything=True)
    lookup = next(e for e in ctx.state.log.events if e.kind == "lookup")
    assert lookup.miss.reason == "evicted" and not ctx.state.contains(lookup.miss.evicted_by_seq)
    text = describe(lookup, ctx.state)
    assert "evicted before this log began" in text and f"event {lookup.miss.evicted_by_seq}" not in text


def test_play_steps_through_the_log(qtbot, window):
    ctx = window.ctx
    _evicting_engine(ctx)
    bar = window.scrub_bar
    bar.speed.setCurrentIndex(0)
    bar.play.setChecked(True)
    assert ctx.state.current_seq == ctx.state.log.first_seq  # playing starts from the beginning
    qtbot.waitUntil(lambda: ctx.state.current_seq is not None and ctx.state.current_seq > ctx.state.log.first_seq,
                    timeout=WAIT_MS)
    bar.play.setChecked(False)
    assert bar.play.text() == "Play" and not ctx.state.is_live


# ---------------------------------------------------------------------------- smaller things
def test_the_title_follows_an_edit_of_the_first_message(qtbot, chat_window):
    window = chat_window
    conversation = _chat(qtbot, window, "Original question")
    assert conversation.title_label.text() == "Original question"
    assert conversation.edit_message(0, "Edited question")
    qtbot.waitUntil(lambda: not conversation.is_generating, timeout=WAIT_MS)
    assert conversation.title_label.text() == "Edited question" == window.ctx.subject.title
    assert "Edited question" in window.windowTitle()


def test_a_bad_file_names_no_command_line_flag(qtbot, window, tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}\n')
    assert not window.open_file(bad)
    assert window.ctx.errors and "--format" not in window.ctx.errors[-1]


def test_the_event_log_filter_resets_on_a_new_subject(qtbot, window):
    log = window.panels["event_log"]
    log.set_filter(kind="block_evicted", text="something")
    _open_trace(qtbot, window)
    assert log.kind_box.currentData() == "" and log.text_edit.text() == ""


def test_reuse_reason_says_why_a_replayed_turn_reused_only_the_first_prompt():
    class R:
        def __init__(self, prompt, output, cached, miss=None):
            self.prompt_token_ids, self.output_token_ids = list(range(prompt)), list(range(output))
            self.num_prompt_tokens, self.num_cached_tokens, self.miss = prompt, cached, miss

    previous = ChatMessage("assistant", "recorded", result=R(61, 0, 0), forced=True)
    text = reuse_reason(R(284, 0, 48), previous, 16)
    assert "48 of 284" in text and "61 tokens" in text and "48 of them in full 16-token blocks" in text
    assert "recorded" in text
    assert reuse_reason(R(20, 0, 0), None, 16) == ""


def test_a_replayed_shipped_session_says_why_it_reused_what_it_did(qtbot, chat_window):
    window = chat_window
    conversation = window.panels["conversation"]
    assert window.open_file(resource_path("sessions") / "mt_bench_81_writing.cachescope.json")
    qtbot.waitUntil(lambda: not conversation.is_generating, timeout=WAIT_MS)
    replies = [c for c, m in zip(conversation.cards, conversation.messages) if m.role == "assistant"]
    assert len(replies) >= 2
    second = replies[1].stats.text()
    # The second turn reuses only what the first request ran: its recorded reply was read, not run.
    assert "Reused" in second and "recorded, not run" in second
    assert "not run yet (grey)" in conversation.legend.text()
