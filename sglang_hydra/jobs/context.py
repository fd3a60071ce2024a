"""What a job gets besides the record: where to write, and whether it is one of a sweep."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Optional, Union


@dataclass
class JobContext:
    output_dir: Optional[Path] = None     # Hydra's run/sweep job dir (None: create lazily)
    multirun: bool = False
    overrides: tuple = ()                 # the overrides that define this job (for summaries)
    # The composed config to save as .hydra/config.yaml when this context creates the
    # directory itself (Hydra saves its own on the @hydra.main path).
    config: Optional[Dict[str, Any]] = None
    hardware: Any = None                  # config.hardware.Hardware to size for (None: local)
    deploy: Any = None                    # the deploy.* settings (DeploySettings) of a deployment command
    _made: bool = field(default=False, repr=False)

    def out_dir(self) -> Path:
        """The job's output directory, created on first use.

        Without a directory from Hydra a new one is made under ``outputs/<date>/`` whose
        name carries the time to the microsecond and is created exclusively, so two runs
        started together never share it; the composed config and the overrides are saved
        in its ``.hydra/`` as Hydra apps do.
        """
        if self.output_dir is None:
            self.output_dir = unique_run_dir(Path("outputs"))
            self._made = True
            self._save_inputs()
        if not self._made:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._made = True
        return self.output_dir

    def _save_inputs(self) -> None:
        import yaml
        hydra_dir = self.output_dir / ".hydra"
        atomic_write(hydra_dir / "config.yaml",
                     yaml.safe_dump(self.config or {}, sort_keys=False, default_flow_style=False))
        atomic_write(hydra_dir / "overrides.yaml",
                     yaml.safe_dump(list(self.overrides), default_flow_style=False))

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write(self.out_dir() / name, text)


def unique_run_dir(root: Path, now: Optional[datetime] = None) -> Path:
    """``root/<YYYY-MM-DD>/<HH-MM-SS-ffffff>``, created here; a name already taken (another
    process in the same microsecond) gets a ``-1``, ``-2``... suffix instead of being shared."""
    now = now or datetime.now()
    day = root / now.strftime("%Y-%m-%d")
    day.mkdir(parents=True, exist_ok=True)
    base = now.strftime("%H-%M-%S-%f")
    n = 0
    while True:
        cand = day / (base if n == 0 else f"{base}-{n}")
        try:
            cand.mkdir()
            return cand
        except FileExistsError:
            n += 1


def composed_config(values: Dict[str, Any], job: Dict[str, Any]) -> Dict[str, Any]:
    """The composed (not yet resolved) settings in Hydra's nested layout: one mapping per
    namespace, then ``job`` - what ``.hydra/config.yaml`` holds on the @hydra.main path."""
    from ..config.record import FIELDS

    out: Dict[str, Any] = {}
    for name, fi in FIELDS.items():
        if fi.arg.no_cli:
            continue
        ns, _, key = fi.key.partition(".")
        out.setdefault(ns, {})[key] = _plain(values.get(name))
    out["job"] = {k: _plain(v) for k, v in (job or {}).items()}
    return out


def _plain(v: Any) -> Any:
    """A value YAML's safe dumper can write (enums and tuples become strings and lists)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(getattr(v, "value", v))


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
