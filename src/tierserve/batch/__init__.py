"""The Batch API (`/v1/files`, `/v1/batches`) and `tierserve run-batch`: batch jobs as P2/P3 work
for the priority engine, durable in a database across restarts.

    config.py   BatchConfig (numbers and paths), completion windows, per-tenant limits
    schema.py   tables and versioned migrations (SQLAlchemy Core)
    store.py    BatchStore: files, batches, results (idempotent by batch + custom_id), lease
    files.py    file bodies on disk; JSONL validation of a batch input file
    objects.py  OpenAI's file and batch objects, output and error lines
    dispatch.py one line through the same handlers (and prepare/admit path) as HTTP requests
    feeder.py   the bounded window of in-flight lines, refusals and retries, the lease
    lifecycle.py  OpenAI's status machine: expiry, cancel, finalization, failure, at risk
    jobs.py     a batch being worked on; loading its lines, writing its output files
    metrics.py  the llm_batch* series
    service.py  what the routes call (database work off the event loop), start and stop
    routes.py   the HTTP routes
    runner.py   `tierserve run-batch -i in.jsonl -o out.jsonl` (vLLM's format)
"""
