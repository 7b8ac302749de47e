"""``GET /api/files/{token}``: an output file, by the URL a result gave (the API token or
a key; another key's file is unknown here)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ..core import services_of
from ..edge import FileStore, file_response, require_api_token

router = APIRouter(dependencies=[Depends(require_api_token)])


@router.get(
    "/api/files/{token}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the file"},
        206: {"description": "the requested byte range"},
        404: {"description": "unknown or expired file URL"},
        416: {"description": "range not satisfiable"},
    },
    tags=["files"],
)
async def get_file(token: str, request: Request) -> StreamingResponse:
    """An output file, by the URL a result gave; 404 once it expired.

    One ``Range: bytes=a-b`` (or ``a-``, ``-n``) is answered 206, so players can seek;
    an unsatisfiable one is 416; several ranges get the whole file.
    """
    # Always a download here (the API's contract); the front shows media inline.
    return file_response(services_of(request).get(FileStore), token, request, inline_media=False)
