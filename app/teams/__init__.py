"""Teams: API keys (consumers with limits) and the usage metered per key and user."""

from __future__ import annotations

from ._keys import KEY_PREFIX, KeyChange, KeyCreate, KeyRecord, Keys
from ._usage import METER, OPEN_KEY, TOKEN_KEY, Meter, Usage, as_csv

__all__ = [
    "KEY_PREFIX",
    "METER",
    "OPEN_KEY",
    "TOKEN_KEY",
    "KeyChange",
    "KeyCreate",
    "KeyRecord",
    "Keys",
    "Meter",
    "Usage",
    "as_csv",
]
