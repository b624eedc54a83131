"""The OpenAPI document a running Gateway serves is the committed ``docs/openapi.json``
(rewrite it with ``make openapi`` after an intended change of the HTTP API)."""

from __future__ import annotations

from support.contract import OPENAPI_FILE, difference, render_openapi
from support.gateway import RunningGateway


async def test_the_served_openapi_document_is_the_committed_one(gateway: RunningGateway) -> None:
    response = await gateway.operator("GET", "/openapi.json")
    assert response.status == 200
    served, committed = render_openapi(response.body), OPENAPI_FILE.read_text()
    assert served == committed, difference(committed, served, "docs/openapi.json", "openapi")
