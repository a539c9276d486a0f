"""Bounded API fuzzing: schemathesis generates requests from the server's own `/openapi.json`,
valid ones and ones that break the schema, with a fixed seed and a capped number of examples.
Every answer must be a documented status with a documented content type, headers and body, and
never a 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server_utils import running_server, small_engine_args
from tierserve.api.settings import ServerSettings
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MAX_TOKENS = 3  # generation is the slow part: keep every valid request short


@pytest.fixture(scope="module")
def server():
    built = build_engine(small_engine_args())
    with running_server(built, ServerSettings(default_max_tokens=MAX_TOKENS)) as (url, state):
        yield url, state


def _short(case) -> None:
    """Cap the tokens a generated request may ask for (a valid max_tokens of 8,000 would take
    minutes on a CPU); everything else is left as generated."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)  # 826 or, as JSON Schema allows for an integer, 826.0
        if isinstance(v, int | float) and not isinstance(v, bool) and v > MAX_TOKENS:
            body[key] = MAX_TOKENS


@pytest.mark.parametrize(
    ("mode", "examples"), [(GenerationMode.POSITIVE, 100), (GenerationMode.NEGATIVE, 150)]
)
def test_fuzzed_requests_get_documented_answers_and_no_5xx(server, mode, examples):
    url, _ = server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    strategy = schema.as_strategy(generation_mode=mode)
    seen = []

    @settings(
        max_examples=examples,
        derandomize=True,  # a fixed seed: the same requests on every run
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case):
        _short(case)
        response = case.call(base_url=url, timeout=60)
        seen.append((case.method, case.path, response.status_code))
        case.validate_response(response, checks=CHECKS)

    run()
    # The run reached the completion routes, and each mode did its job: valid requests got
    # completions, schema-breaking ones were refused with a 400.
    paths = {p for _, p, _ in seen}
    assert {"/v1/chat/completions", "/v1/completions"} <= paths, paths
    statuses = {status for *_, status in seen}
    assert (200 if mode == GenerationMode.POSITIVE else 400) in statuses, statuses
