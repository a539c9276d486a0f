"""A batch job through tierserve's Batch API with the official `openai` client.

Start a server (the Batch API is on by default; its database and files live in the cache dir):

    tierserve serve --port 8000

then run:

    python examples/batch_example.py --base-url http://127.0.0.1:8000/v1

It uploads three chat requests as a JSONL file, creates a batch (its lines run as batch-class
work, P2, behind interactive traffic, due within the completion window), waits for it, and
prints each answer by its custom_id.
"""

from __future__ import annotations

import argparse
import json
import time

import openai

QUESTIONS = {
    "capital-fr": "What is the capital of France?",
    "capital-it": "What is the capital of Italy?",
    "sum": "What is 2 + 2?",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="none")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)

    lines = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 20,
                "temperature": 0,
            },
        }
        for cid, text in QUESTIONS.items()
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    f = client.files.create(file=("questions.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"example": "capitals"},
    )
    print(f"batch {batch.id}: {batch.status}")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
    counts = batch.request_counts
    print(f"{batch.status}: {counts.completed} of {counts.total} requests")
    if batch.output_file_id:
        for raw in client.files.content(batch.output_file_id).text.splitlines():
            result = json.loads(raw)
            answer = result["response"]["body"]["choices"][0]["message"]["content"]
            print(f"{result['custom_id']}: {answer!r}")
    if batch.error_file_id:
        print(client.files.content(batch.error_file_id).text)


if __name__ == "__main__":
    main()
