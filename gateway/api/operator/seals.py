"""The operator API: seals."""

from __future__ import annotations

from aiohttp import web

from leasehold.domain.errors import Conflict
from leasehold.gateway.api.http import RouteTable, ok
from leasehold.gateway.api.operator.common import TAGS, _services
from leasehold.gateway.api.operator_models import Seal
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.keys import SEALER

routes = RouteTable()


@routes.route("POST", "/v1/seals",
              summary="Write a signed seal now and publish it to the digest sink (administrator; 409 when "
                      "no seal key is configured)",
              auth="operator", response=Seal, statuses=(201,), tags=TAGS)
async def seal_now(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operator.require_admin()
    sealer = request.app.get(SEALER)
    if sealer is None:
        raise Conflict("sealing is not configured (set seal_key_file and digest_dir)")
    async with _services(request).db.connection() as conn:
        record = await sealer.seal(conn)
    return ok(Seal.model_validate(record), status=201)
