"""Writes the sample prompt datasets: prompts.jsonl, prompts.parquet, openai_batch.jsonl and reviews.csv.

    python sample_data/make_sample_prompts.py

The first three hold the same kind of rows in three input formats `gemma-batch run` reads;
reviews.csv holds 20 short reviews (written for this project) as a two-shot sentiment prompt each,
with the label a person gave them (`label`), for `jobs/label-reviews.toml`.
"""

from __future__ import annotations

import csv
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


REVIEWS = [
    ("positive", "Arrived a day early and works exactly as described."),
    ("negative", "The handle snapped off the second time I used it."),
    ("positive", "Best pizza in town, and the staff remembered our names."),
    ("negative", "Three hours on hold and nobody ever answered."),
    ("positive", "Comfortable shoes; I walked ten miles without a blister."),
    ("negative", "The room smelled of smoke and the sheets were stained."),
    ("positive", "A gripping story with characters I will miss."),
    ("negative", "The battery barely lasts the morning."),
    ("positive", "Setup took two minutes and the sound is wonderful."),
    ("negative", "It stopped charging after a week and the seller ignores my emails."),
    ("positive", "Fresh ingredients, generous portions, fair prices."),
    ("negative", "The film was two hours too long and the ending made no sense."),
    ("positive", "My daughter loves this puzzle and asks for it every night."),
    ("negative", "Cheap plastic that cracked in the cold."),
    ("positive", "The guide was funny and knew every corner of the old town."),
    ("negative", "Overpriced, bland, and we waited forty minutes for cold soup."),
    ("positive", "Not cheap, but worth every penny."),
    ("negative", "Looks nice in the photos; in person it is flimsy and smaller than described."),
    ("positive", "I was sceptical at first, yet it has become my favourite mug."),
    ("negative", "The app crashes every time I try to pay."),
]
SHOTS = ("Review: The food was cold and the waiter ignored us.\nSentiment: negative\n\n"
         "Review: I love this phone, the screen is gorgeous.\nSentiment: positive\n\n")


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
    with (HERE / "reviews.csv").open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "prompt", "label"])
        for i, (label, review) in enumerate(REVIEWS, 1):
            writer.writerow([f"r{i:02d}", f"{SHOTS}Review: {review}\nSentiment:", label])


if __name__ == "__main__":
    main()
