"""The run's history: one JSON object per line, one line per epoch, flushed as it is written."""
from __future__ import annotations

import json
import os
from typing import Any


class History:
    """Appends records to ``path`` (created with its directory); a resumed run keeps appending."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")
