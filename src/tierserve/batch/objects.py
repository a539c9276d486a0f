"""OpenAI's shapes: the file and batch objects, list pages, and the output and error lines."""

from __future__ import annotations

import json
import uuid

from tierserve.priority import Priority

STAMPS = (
    "in_progress",
    "expires",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
)
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed: the batch was cancelled."


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _ts(v: float | None) -> int | None:
    return None if v is None else int(v)


def file_object(row: dict) -> dict:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": int(row["created_at"]),
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_object(row: dict) -> dict:
    out = {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": json.loads(row["errors"]) if row["errors"] else None,
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": int(row["created_at"]),
        **{f"{s}_at": _ts(row[f"{s}_at"]) for s in STAMPS},
        "request_counts": {
            "total": row["total"],
            "completed": row["completed"],
            "failed": row["failed"],
        },
        "metadata": json.loads(row["metadata"]) if row["metadata"] else None,
        "model": None,
        "usage": None,
        # tierserve's: the class its lines run in, and whether it is predicted to miss its window
        "tier": Priority(row["priority"]).tier,
        "at_risk": bool(row["at_risk"]),
    }
    return out


def page(items: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def errors_list(code: str, message: str, line: int | None = None, param: str | None = None):
    return {
        "object": "list",
        "data": [{"code": code, "message": message, "param": param, "line": line}],
    }


def response_line(custom_id: str, status: int, body: dict) -> dict:
    """An output line (2xx) or an error-file line (a 4xx/5xx answer) for one request."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": body.get("id") or new_id("req_"),
            "body": body,
        },
        "error": None,
    }


def error_line(custom_id: str, code: str, message: str) -> dict:
    """An error-file line for a request that got no answer (expired, cancelled, failed)."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
