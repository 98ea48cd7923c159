"""The outputs a run holds: its own run directory (named by its run id), --checkpoint-dir and
--trace, each locked against other runs; and its history file."""
from __future__ import annotations

import os

from pydtnn_lite.output_lock import lock_directory
from pydtnn_lite.run_config import RunConfig
from pydtnn_lite.training import History
from pydtnn_lite.training.checkpoint import remove_stale_temporaries

HISTORY_NAME = "history.jsonl"


def run_directory(config: RunConfig, run_id: str) -> str:
    """Where the run ``run_id`` keeps its history: one directory per run, the same when it is resumed."""
    return os.path.join(config.run_dir, f"{config.model}-{config.dataset}-{run_id}")


def open_outputs(config: RunConfig, run_id: str) -> tuple[History, list[str]]:
    """Lock the run's directory, --checkpoint-dir and --trace for this run (UserError naming the
    holder if another live run has one), remove the temporary files a killed run's checkpoint
    write left, and open the history. Returns the history and notes for the user."""
    directory = run_directory(config, run_id)
    notes = []
    outputs = ((directory, "--run-dir"), (config.checkpoint_dir, "--checkpoint-dir"), (config.trace, "--trace"))
    for path, flag in outputs:
        note = lock_directory(path, flag, run_id) if path else None
        if note:
            notes.append(note)
    if config.checkpoint_dir:
        stale = remove_stale_temporaries(config.checkpoint_dir)
        if stale:
            notes.append(f"removed {len(stale)} unfinished checkpoint write(s) from {config.checkpoint_dir}: "
                         f"{', '.join(stale)}")
    return History(os.path.join(directory, HISTORY_NAME), run_id), notes
