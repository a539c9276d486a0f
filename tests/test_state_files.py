"""A damaged state file never takes the server down (issue 46, item 4), through a real
`tierserve serve` process: a predictor state of invalid UTF-8 is one warning and a cold start
(the file moved aside for inspection); a batch database that is not SQLite leaves chat serving
and the Batch API answering 503 `batch_unavailable` naming the file, which is not written over;
no traceback."""

from __future__ import annotations

import os

import httpx
import pytest

from tierserve.loadgen.server import start_server, stop_server


@pytest.mark.model
def test_a_damaged_predictor_state_and_batch_database_do_not_stop_the_server(tmp_path):
    state = tmp_path / "lengths.json"
    state.write_bytes(b"\xff\xfe not utf-8 \x80")
    bad_db = tmp_path / "batch.db"
    junk = b"this is not an SQLite database\n" * 100
    bad_db.write_bytes(junk)
    log = tmp_path / "serve.log"
    env = {
        "TIERSERVE_PREDICTOR_STATE": str(state),
        "TIERSERVE_CACHE_DIR": os.environ.get("TIERSERVE_CACHE_DIR", str(tmp_path / "cache")),
    }
    args = ["--kv-cache-gib", "0.1", "--batch-db", str(bad_db)]
    proc, url = start_server(args, log=log, env=env, timeout_s=120)
    try:
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=60,
        )
        assert chat.status_code == 200, chat.text
        for method, path in (("GET", "/v1/batches"), ("POST", "/v1/files")):
            r = httpx.request(method, f"{url}{path}", timeout=10)
            assert r.status_code == 503, (path, r.text)
            err = r.json()["error"]
            assert err["code"] == "batch_unavailable" and str(bad_db) in err["message"]
    finally:
        stop_server(proc)  # SIGTERM, then SIGKILL after 60 s
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    (warn,) = [x for x in text.splitlines() if "predictor state" in x]
    assert "corrupt" in warn and "starting cold" in warn
    assert (tmp_path / "lengths.json.corrupt").read_bytes() == b"\xff\xfe not utf-8 \x80"
    assert len([x for x in text.splitlines() if "Batch API is unavailable" in x]) == 1
    assert bad_db.read_bytes() == junk  # never written over
