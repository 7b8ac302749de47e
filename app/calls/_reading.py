"""A call's request read for the routes that make calls (``/api/predict``, ``/api/jobs``):
its body (JSON or multipart) checked before its files are written, the output files'
rendering, and the OpenAPI form of that body."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from pool import Pool, UnknownSpace, get_pool

from ..core import context_of, services_of, settings_of
from ..edge import Boundary, FileOutput, FileStore, PredictRequest
from ._inputs import CheckedCall, identity_headers, read_call


def prepare(request: Request, body: PredictRequest) -> Pool:
    """The pool, after the checks the pool would answer less precisely."""
    pool = get_pool()
    if body.space is not None and body.space not in pool.spaces:
        raise UnknownSpace(body.space, sorted(pool.spaces))
    context_of(request).user = pool.hash_user(body.email)
    return pool


def file_output(request: Request, body: PredictRequest) -> FileOutput:
    """How this request's output files are rendered (URL, or inline when small)."""
    store = services_of(request).get(FileStore)
    limit = settings_of(request).file_inline_max_bytes
    return FileOutput(store, body.files, limit)


async def read_checked(request: Request) -> CheckedCall:
    """The body (JSON or multipart), checked by :func:`prepare`, then its files on disk."""
    settings = settings_of(request)
    boundary = services_of(request).get(Boundary)
    call = await read_call(request, settings, boundary, lambda body: prepare(request, body))
    call.headers = identity_headers(request, settings)
    return call


# The body is read by read_checked (JSON, or multipart with files): its OpenAPI form.
BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": PredictRequest.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["body"],
                    "properties": {
                        "body": {
                            **PredictRequest.model_json_schema(),
                            "description": "the JSON body; file arguments refer to parts"
                            ' as {"file": {"upload": "<part name>"}}',
                        }
                    },
                    "additionalProperties": {"type": "string", "format": "binary"},
                },
                "encoding": {"body": {"contentType": "application/json"}},
            },
        },
    }
}
