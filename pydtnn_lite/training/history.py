"""The run's history: one JSON object per line, one line per epoch, flushed as it is written;
each line carries the run's id."""
from __future__ import annotations

import json
import os
from typing import Any


class History:
    """Appends records to ``path`` (created with its directory); a resumed run keeps appending."""

    def __init__(self, path: str, run_id: str | None = None) -> None:
        self.path, self.run_id = path, run_id
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record if self.run_id is None else {"run_id": self.run_id, **record}) + "\n")
