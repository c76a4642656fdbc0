"""Reading the project's own JSON records (summaries, partition and download records), naming the file
when one is corrupt. Standard library only: training code, partitions and reports all read records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedrepro.errors import FedreproError


class CorruptFileError(FedreproError, ValueError):
    """A file of the project that cannot be parsed; the message names it."""


def read_json(path: str | Path) -> Any:
    """A JSON file's content; an unreadable or truncated file is an error that names it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptFileError(
            f"{path}: cannot be read as JSON ({type(err).__name__}: {err}); check the path, "
            f"or delete the file and rerun the step that writes it"
        ) from None
