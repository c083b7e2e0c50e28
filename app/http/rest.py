"""What the FastAPI apps (the routes beside the verbs, the webhook's port) share: a JSON
answer, and the error handlers that give every 4xx the one shape
(``app.kube.errors.error_body``), routing errors (no such path, wrong method) included."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..kube.errors import BadRequest, error_body

__all__ = ["add_error_handlers", "json_response"]

JSON = "application/json"


def json_response(data: Any, status: int = 200, *,
                  headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    """A :class:`BadRequest` and a routing error answer in the same shape as every other
    4xx: the message and the field it names (``path``, ``method``)."""

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest) -> Response:
        return Response(error_body(exc.message, exc.fields), exc.status, media_type=JSON)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        field = {404: "path", 405: "method"}.get(exc.status_code, "request")
        return Response(error_body(str(exc.detail), [field]), exc.status_code,
                        media_type=JSON)
