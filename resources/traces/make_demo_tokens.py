"""Rebuild demo_tokens.jsonl: real MT-Bench conversations through SmolLM2-135M-Instruct.

Each two-turn question becomes two token-level requests (the second repeats the first turn
and the model's real greedy reply), alternating two tenants. Run from the project root:
`.venv/bin/python resources/traces/make_demo_tokens.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.model.loader import load_model

SOURCE = Path(__file__).resolve().parent.parent / "traces" / "mt_bench_question.jsonl"
OUT = Path(__file__).with_name("demo_tokens.jsonl")
NUM_QUESTIONS = 12
MAX_NEW_TOKENS = 48


def render(tok, messages, gen=True):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def main() -> None:
    loaded = load_model()
    tok, net = loaded.tokenizer, loaded.model
    rows = []
    questions = [json.loads(l) for l in SOURCE.read_text().splitlines() if l.strip()][:NUM_QUESTIONS]
    for qi, q in enumerate(questions):
        tenant = "alice" if qi % 3 else "bob"
        messages = []
        for ti, turn in enumerate(q["turns"]):
            messages.append({"role": "user", "content": turn})
            prompt = render(tok, messages)
            with torch.no_grad():
                out = net.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            output = out[0, len(prompt):].tolist()
            rows.append({"id": f"q{q['question_id']}-t{ti + 1}", "tenant": tenant, "tokens": prompt,
                         "output_tokens": output})
            messages.append({"role": "assistant", "content": tok.decode(output, skip_special_tokens=True)})
    OUT.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    print(f"{len(rows)} requests -> {OUT}")


if __name__ == "__main__":
    main()
