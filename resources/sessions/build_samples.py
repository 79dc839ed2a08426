"""Rebuild the sample sessions from MT-bench questions (FastChat, Apache-2.0).

Each sample is a two-turn MT-bench question under a short system prompt, with replies
generated greedily by the bundled SmolLM2-135M-Instruct, saved as a session file.
Run: `.venv/bin/python resources/sessions/build_samples.py [MT_BENCH_JSONL]`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = {81: "mt_bench_81_writing", 101: "mt_bench_101_reasoning", 121: "mt_bench_121_coding"}
SYSTEM = "You are a helpful assistant. Answer clearly and concisely."
MAX_NEW_TOKENS = 160


def main(source: str = str(Path(__file__).resolve().parents[1] / "traces" / "mt_bench_question.jsonl")) -> None:
    from engine.model.loader import load_model
    from engine.model.runner import ModelRunner
    from engine.store.sessions import export_session
    from engine.store.database import Store

    questions = {q["question_id"]: q for q in map(json.loads, Path(source).read_text().splitlines()) if q}
    loaded = load_model()
    runner = ModelRunner(loaded, num_blocks=2048, seed=0)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "samples.db") as store:
        for qid, stem in QUESTIONS.items():
            q = questions[qid]
            sid = store.create_session(f"MT-bench {qid} ({q['category']})", "chat", source_path=Path(source).name,
                                       source_format="mt-bench", settings={"question_id": qid,
                                                                           "generated_by": loaded.name})
            chat = [{"role": "system", "content": SYSTEM}]
            store.add_message(sid, "system", SYSTEM)
            for turn in q["turns"]:
                chat.append({"role": "user", "content": turn})
                store.add_message(sid, "user", turn)
                reply = runner.chat(chat, max_new_tokens=MAX_NEW_TOKENS).output_text.strip()
                chat.append({"role": "assistant", "content": reply})
                store.add_message(sid, "assistant", reply)
            export_session(store, sid, HERE / f"{stem}.cachescope.json")
            print(f"wrote {stem}.cachescope.json", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
