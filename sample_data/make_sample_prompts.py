"""Writes the sample prompt datasets: prompts.jsonl, prompts.parquet and openai_batch.jsonl.

    python sample_data/make_sample_prompts.py

The three hold the same kind of rows in the three input formats `gemma-batch run` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent

PROMPTS = [
    ("sea-1", "The sea was calm that morning, and", "story"),
    ("sea-2", "A lighthouse keeper counts the ships that", "story"),
    ("recipe-1", "To bake a simple loaf of bread, first", "howto"),
    ("recipe-2", "The secret of a good soup is", "howto"),
    ("review-1", "Review: the new phone's battery lasts two days. Sentiment:", "label"),
    ("review-2", "Review: the hotel room was cold and noisy. Sentiment:", "label"),
    ("fact-1", "The three primary colours are", "fact"),
    ("fact-2", "Water boils at sea level at a temperature of", "fact"),
    ("poem-1", "Roses are red, violets are blue,", "story"),
    ("letter-1", "Dear neighbour, I am writing to ask whether", "story"),
]

CHATS = [
    ("chat-1", [{"role": "user", "content": "Name three rivers in Europe."}]),
    ("chat-2", [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Is the review 'great value, fast delivery' positive or negative?"},
    ]),
]


def main() -> None:
    with (HERE / "prompts.jsonl").open("w", encoding="utf-8") as f:
        for row_id, prompt, topic in PROMPTS:
            f.write(json.dumps({"id": row_id, "prompt": prompt, "topic": topic}) + "\n")
        for row_id, messages in CHATS:
            f.write(json.dumps({"id": row_id, "messages": messages, "topic": "chat"}) + "\n")
    table = pa.table({
        "id": [r[0] for r in PROMPTS],
        "prompt": [r[1] for r in PROMPTS],
        "topic": [r[2] for r in PROMPTS],
        "max_tokens": [16 if r[2] == "label" else None for r in PROMPTS],
    })
    pq.write_table(table, HERE / "prompts.parquet")
    with (HERE / "openai_batch.jsonl").open("w", encoding="utf-8") as f:
        for row_id, messages in CHATS:
            body = {"model": "gemma-3", "messages": messages, "max_tokens": 32}
            f.write(json.dumps({"custom_id": row_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
        for row_id, prompt, _ in PROMPTS[:4]:
            body = {"model": "gemma-3", "prompt": prompt, "max_tokens": 32, "temperature": 0.7, "seed": 1}
            f.write(json.dumps({"custom_id": row_id, "method": "POST", "url": "/v1/completions", "body": body}) + "\n")


if __name__ == "__main__":
    main()
