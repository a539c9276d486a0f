"""Who is asking: a route dependency on every `/v1` route and on `/tokenize` and `/detokenize`
(vLLM guards `/v1` only; the tokenizer routes run the chat template, so they are guarded too).
`/health`, `/ready`, `/metrics`, `/version` and `/openapi.json` are open, as in vLLM, for
probes and scrapers.

The key is checked before the body is validated (only an oversized or malformed body is refused
first), so a client without a key learns nothing about the fields but the 401. The tenant found
is kept on the request for the handler."""

from __future__ import annotations

from fastapi import Request as HTTPRequest

from tierserve.api.errors import APIError
from tierserve.api.tenancy import AuthError, Tenant


def request_tenant(state, http: HTTPRequest) -> Tenant:
    """The request's tenant, from the key (or, with authentication off, `x-tenant-id`)."""
    tenant = getattr(http.state, "tenant", None)
    if tenant is not None:
        return tenant
    try:
        tenant = state.tenants.authenticate(
            http.headers.get("authorization"), http.headers.get("x-tenant-id")
        )
    except AuthError as exc:
        raise APIError(401, str(exc), "authentication_error") from None
    http.state.tenant = tenant
    return tenant


async def authenticated(http: HTTPRequest) -> None:
    """FastAPI dependency: 401 unless the request carries a valid key (when keys are on)."""
    request_tenant(http.app.state.tierserve, http)
