"""The one trust boundary both faces use: bearer tokens and API keys (docs/security.md),
the boundary's checks of values and files, the request and answer bodies, and the
output-file store."""

from __future__ import annotations

from ._auth import GATE, Gate, gate_of, is_admin, pass_gate, require_admin_token, require_api_token
from ._boundary import BadJson, Boundary, parse_json, upload_id, upload_token
from ._files import FileOutput, FileStore, run_sweeper
from ._schemas import (
    API_NAME_PATTERN,
    EMAIL_MAX_CHARS,
    EMAIL_PATTERN,
    ERROR_RESPONSES,
    FINAL_STAGES,
    MAX_DEPTH,
    SPACE_PATTERN,
    ErrorBody,
    JobCreated,
    JobView,
    PredictRequest,
    PredictResponse,
    Stage,
    is_email,
    is_file_form,
    to_jsonable,
)
from ._serving import file_response, inert_headers

__all__ = [
    "API_NAME_PATTERN",
    "EMAIL_MAX_CHARS",
    "EMAIL_PATTERN",
    "ERROR_RESPONSES",
    "FINAL_STAGES",
    "GATE",
    "MAX_DEPTH",
    "SPACE_PATTERN",
    "BadJson",
    "Boundary",
    "ErrorBody",
    "FileOutput",
    "FileStore",
    "Gate",
    "JobCreated",
    "JobView",
    "PredictRequest",
    "PredictResponse",
    "Stage",
    "file_response",
    "gate_of",
    "inert_headers",
    "is_admin",
    "is_email",
    "is_file_form",
    "parse_json",
    "pass_gate",
    "require_admin_token",
    "require_api_token",
    "run_sweeper",
    "to_jsonable",
    "upload_id",
    "upload_token",
]
