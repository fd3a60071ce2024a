"""What a job gets besides the record: where to write, and whether it is one of a sweep."""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union


@dataclass
class JobContext:
    output_dir: Optional[Path] = None     # Hydra's run/sweep job dir (None: create lazily)
    multirun: bool = False
    overrides: tuple = ()                 # the overrides that define this job (for summaries)
    hardware: Any = None                  # config.hardware.Hardware to size for (None: local)
    _made: bool = field(default=False, repr=False)

    def out_dir(self) -> Path:
        """The job's output directory, created on first use (Hydra's naming when unset)."""
        if self.output_dir is None:
            self.output_dir = Path("outputs") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
        if not self._made:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._made = True
        return self.output_dir

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write(self.out_dir() / name, text)


def atomic_write(path: Union[str, Path], data: Union[str, bytes]) -> Path:
    """Write via a temp file in the same directory and rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
