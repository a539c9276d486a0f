"""The Batch API's parts that need no model: input-file validation (line numbers), completion
windows, the store (exactly-once results, pagination, the feeder lease), versioned migrations,
and the same store on PostgreSQL where a server can be started here."""

import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from sqlalchemy import column, create_engine, insert, inspect, select, table

from tests.server_utils import free_port
from tierserve.batch import schema
from tierserve.batch.config import parse_window
from tierserve.batch.files import FileFormatError, check_batch_input
from tierserve.batch.store import BatchStore, db_url


def line(cid="a", url="/v1/chat/completions", **kw):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body, **kw})


def check(text: str, max_line=1000, max_lines=100):
    return check_batch_input(io.BytesIO(text.encode()), max_line, max_lines)


def test_a_valid_file_is_counted():
    got = check("\n".join([line("a"), "", line("b", "/v1/completions")]) + "\n")
    assert got.lines == 2 and got.urls == {"/v1/chat/completions", "/v1/completions"}


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (line("a") + "\n{not json\n", 2, "not valid JSON"),
        (line("a") + "\n" + line("a"), 2, "used twice (first on line 1)"),
        ("[1, 2]", 1, "expected a JSON object"),
        (line("a", "/v1/embeddings"), 1, "unsupported url '/v1/embeddings'"),
        (line("a", method="GET").replace('"method": "POST", ', ""), 1, "method must be POST"),
        (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions"}), 1, "body"),
        (line("a")[:-1] + ', "extra": 1}', 1, "unknown field 'extra'"),
        (line("x" * 2000), 1, "more than 1500"),
    ],
)
def test_a_bad_line_is_named_by_its_number(text, where, what):
    with pytest.raises(FileFormatError) as e:
        check(text, max_line=1500)
    assert e.value.line == where and f"line {where}: " in str(e.value)
    assert what in str(e.value)


def test_empty_file_and_too_many_lines_are_refused():
    with pytest.raises(FileFormatError, match="no requests"):
        check("\n\n")
    with pytest.raises(FileFormatError, match="more than 2 requests"):
        check("\n".join(line(str(i)) for i in range(3)), max_lines=2)


def test_completion_windows():
    assert parse_window("24h") == 86400 and parse_window("90s") == 90
    assert parse_window("2d") == 172800
    for bad in ("", "24", "0h", "1w", "8d", "-1h", "1.5h"):
        with pytest.raises(ValueError, match="completion_window"):
            parse_window(bad)


# -- the store ---------------------------------------------------------------------------------


def batch_row(bid="batch_1", tenant="t", status="in_progress", created=1.0):
    return dict(
        id=bid, tenant=tenant, endpoint="/v1/completions", input_file_id="file-1",
        completion_window="24h", status=status, priority=2, est_tokens=10, total=3,
        completed=0, failed=0, created_at=created, expires_at=created + 86400, at_risk=False,
    )  # fmt: skip


def exercise_store(store: BatchStore) -> None:
    """What every backend must do: results once each, counters by what was new, tenants
    apart, pages in order, one lease holder."""
    store.add_batch(batch_row())
    rows = [("a", 1, True, {"x": 1}), ("b", 2, False, {"x": 2})]
    assert store.add_results("batch_1", rows) == 2
    # A rerun after a crash writes the same lines again: nothing is added or counted twice.
    assert store.add_results("batch_1", [*rows, ("c", 3, True, {"x": 3})]) == 1
    b = store.get_batch("batch_1")
    assert (b["completed"], b["failed"]) == (2, 1)
    assert [r[0] for r in store.results_of("batch_1")] == ["a", "b", "c"]
    assert store.done_ids("batch_1") == {"a", "b", "c"}
    assert store.get_batch("batch_1", tenant="other") is None
    for i in range(5):
        store.add_batch(batch_row(f"batch_p{i}", created=10.0 + i))
    first = store.list_batches("t", None, 2)
    second = store.list_batches("t", first[-1]["id"], 2)
    assert [r["id"] for r in first + second] == [f"batch_p{i}" for i in (4, 3, 2, 1)]
    assert store.update_batch("batch_1", ("in_progress",), status="cancelling")
    assert not store.update_batch("batch_1", ("in_progress",), status="completed")
    assert store.queued_tokens("t") == 60
    now = time.time()
    assert store.acquire_lease("host-a:1", now, 10)
    assert not store.acquire_lease("host-b:2", now + 1, 10)  # held, not expired
    assert store.acquire_lease("host-a:1", now + 2, 10)  # renewed
    assert store.acquire_lease("host-b:2", now + 13, 10)  # expired: taken over
    store.release_lease("host-b:2")
    assert store.acquire_lease("host-a:1", now + 14, 10)


def test_sqlite_store(tmp_path):
    store = BatchStore(db_url(str(tmp_path / "sub" / "b.db")))
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    exercise_store(store)


def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path):
    store = BatchStore(db_url(str(tmp_path / "b.db")))
    proc = subprocess.Popen(["true"])
    proc.wait()  # a pid that no longer runs
    dead = f"{os.uname().nodename}:{proc.pid}"
    assert store.acquire_lease(dead, time.time(), 60)
    assert store.acquire_lease(f"{os.uname().nodename}:{os.getpid()}", time.time(), 60)


def test_migrations_are_versioned_and_keep_data(tmp_path):
    url = db_url(str(tmp_path / "old.db"))
    engine = create_engine(url)
    assert schema.migrate(engine, upto=1) == 0  # a database as the first release made it
    row = {k: v for k, v in batch_row().items() if k != "at_risk"}
    with engine.begin() as c:  # the first release's columns only
        c.execute(insert(table("batches", *map(column, row))).values(**row))
        assert "lease" not in inspect(c).get_table_names()
    engine.dispose()
    store = BatchStore(url)  # opening it migrates it to the latest version
    with store.engine.connect() as c:
        assert schema.current_version(c) == schema.LATEST
        assert c.execute(select(schema.version.c.version)).scalar() == schema.LATEST
    b = store.get_batch("batch_1")
    assert b["status"] == "in_progress" and b["at_risk"] is False and b["outcome"] is None
    with store.engine.begin() as c:  # a database from a newer tierserve is refused
        c.execute(schema.version.update().values(version=schema.LATEST + 1))
    with pytest.raises(ValueError, match="newer than this tierserve"):
        BatchStore(url)


# -- PostgreSQL, where a server can be started -------------------------------------------------


def _pg_command_prefix(folder: str) -> list[str]:
    """PostgreSQL refuses to run as root: then run it as the `postgres` user."""
    if os.geteuid() != 0:
        return []
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
    if shutil.which("runuser") is None:
        pytest.skip("running as root and no runuser to run PostgreSQL as 'postgres'")
    os.chown(folder, user.pw_uid, user.pw_gid)
    return ["runuser", "-u", "postgres", "--"]


@pytest.fixture(scope="module")
def pg_url():
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server here (initdb and pg_ctl are not on PATH)")
    pytest.importorskip("psycopg", reason="no PostgreSQL driver (psycopg) installed")
    folder = tempfile.mkdtemp(prefix="tierserve-pg-")
    prefix = _pg_command_prefix(folder)
    data, port = f"{folder}/data", free_port()
    run = dict(check=True, capture_output=True, timeout=120)
    subprocess.run([*prefix, initdb, "-D", data, "-U", "tierserve", "--auth=trust"], **run)
    opts = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        [*prefix, pg_ctl, "-D", data, "-o", opts, "-l", f"{folder}/log", "-w", "start"], **run
    )
    try:
        yield f"postgresql+psycopg://tierserve@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", data, "-m", "immediate", "stop"], timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def test_postgresql_store_through_an_sqlalchemy_url(pg_url):
    store = BatchStore(pg_url)
    assert store.dialect == "postgresql"
    exercise_store(store)
    again = BatchStore(pg_url)  # a second server on the same database: migrated already
    assert again.get_batch("batch_1")["completed"] == 2


# -- the command line ----------------------------------------------------------------------------


def serve_settings(*flags):
    from tierserve.cli import build_parser
    from tierserve.cli.serve import build_configs, merged_options

    return build_configs(merged_options(build_parser().parse_args(["serve", *flags])))[1]


def test_batch_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    s = serve_settings()
    assert s.batch_db == str(tmp_path / "batch" / "batch.db") and s.files_dir is None
    s = serve_settings("--batch-db", "postgresql+psycopg://u@h/db", "--files-dir", "/x")
    assert (s.batch_db, s.files_dir) == ("postgresql+psycopg://u@h/db", "/x")
    assert serve_settings("--batch-db", "off").batch_db is None
    assert serve_settings("--batch-window", "8").batch_window == 8
    with pytest.raises(ValueError, match="--batch-window must be at least 1"):
        serve_settings("--batch-window", "0")


def test_run_batch_names_the_bad_line_before_loading_a_model(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(line("a") + "\n" + line("a") + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tierserve", "run-batch", "-i", str(src), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "in.jsonl: line 2: custom_id 'a' is used twice (first on line 1)" in proc.stderr
    assert not (tmp_path / "o").exists()
