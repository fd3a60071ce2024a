"""How one SGLang server process is made on this machine: its interpreter, flags and environment.

``job=launch`` starts every server here, so "the target" is this machine and the record's own
``device`` (written, or detected when it was composed) says whether it has a GPU.  On a CPU
(``device: cpu``) SGLang 0.5.23 serves requests once it is told so and given what its CPU path
imports:

* ``SGLANG_USE_CPU_ENGINE=1`` (without it SGLang takes the CUDA paths);
* ``sgl_kernel``: SGLang's CPU kernel build is not on PyPI, so the torch implementation of the
  kernels a plain model reaches (``engine_assets/sgl_kernel``) goes on the server's
  ``PYTHONPATH``, and only there;
* the record's flags with the CPU settings the user left unset: ``device``,
  ``attention_backend`` (``torch_native``), ``disable_cuda_graph`` and ``sleep_on_idle`` (without
  it an idle scheduler spins a core).  They are record fields, spelled by the record's own flag
  table (``to_argv``), like every other flag.

Two more things reach the server process when the record needs them, on any device:

* a model preset shipped with a checkpoint directory (``model=tiny_llama``: a ``config.json``,
  dummy weights) is passed as that directory;
* a record whose eviction policy runs only through sglang-hydra's engine plugin gets the plugin
  as an overlay on ``PYTHONPATH`` when the interpreter does not have it installed: the plugin's
  two standard-library modules and the entry-point metadata SGLang's plugin loader reads.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional

#: what the servers of this machine are given (not a package of sglang-hydra: never imported here)
ENGINE_ASSETS = Path(__file__).resolve().parents[1] / "engine_assets"
#: the directory that holds the ``sgl_kernel`` package (goes on a CPU server's PYTHONPATH)
KERNEL_SHIM_DIR = ENGINE_ASSETS
#: shipped checkpoint directories (config.json only), by model preset name
SHIPPED_MODELS = ENGINE_ASSETS / "models"
#: the interpreter default when job.python is unset (scripts/install_engine_env.sh builds one)
ENGINE_PYTHON_ENV = "SGLANG_HYDRA_ENGINE_PYTHON"

#: record fields a CPU server needs, with the value used when the record leaves them unset
CPU_SETTINGS = {"attention_backend": "torch_native", "disable_cuda_graph": True, "sleep_on_idle": True}

_PLUGIN_MODULES = ("sglang_plugin.py", "hit_density_core.py")


def engine_python(job: Mapping) -> str:
    """``job.python``, else ``$SGLANG_HYDRA_ENGINE_PYTHON``, else this interpreter."""
    python = job.get("python") or os.environ.get(ENGINE_PYTHON_ENV) or sys.executable
    return os.path.expanduser(str(python))


def router_python(job: Mapping) -> str:
    return os.path.expanduser(str(job["router_python"])) if job.get("router_python") else engine_python(job)


def on_cpu(record) -> bool:
    """Whether this server runs on the CPU (the record's device, written or detected here)."""
    return str(getattr(record, "device", None) or "").split(":", 1)[0] == "cpu"


def shipped_model_dir(model_path: Optional[str]) -> Optional[Path]:
    """The shipped checkpoint directory a model preset names, unless a local path of that name exists."""
    if not model_path or os.sep in str(model_path) or Path(str(model_path)).exists():
        return None
    d = SHIPPED_MODELS / str(model_path)
    return d if (d / "config.json").is_file() else None


def server_flags(record, *, label: Optional[str] = None, adapt: bool = True) -> List[str]:
    """The flags of ``sglang.launch_server`` for this record on this machine.

    What ``job=resolve job.format=argv`` prints (the settings given), plus, on a CPU, the CPU
    settings the user left unset, ``--model-path`` pointing at a shipped checkpoint, and with
    ``label`` the server's name as its ``--weight-version`` (every response's ``meta_info``
    then says which server answered it) unless a weight version was written.  ``adapt=False``
    (a stand-in server module): the settings given, the label, nothing else."""
    from ..config.legacy import to_argv
    from ..config.record import collect_fields
    fields = collect_fields()
    defaults = {n: fi.default_value() for n, fi in fields.items()}
    values = dict(record.raw_input) or dict(record.to_dict())
    if adapt and on_cpu(record):
        values["device"] = "cpu"
        for name, value in CPU_SETTINGS.items():
            if not record.is_explicit(name):
                values[name] = getattr(record, name, None) or value
    shipped = shipped_model_dir(getattr(record, "model_path", None)) if adapt else None
    if shipped is not None:
        values["model_path"] = str(shipped)
    if label is not None and not record.is_explicit("weight_version"):
        values["weight_version"] = label
    return to_argv(values, defaults)


def server_env(record, *, plugin_overlay: Optional[Path] = None,
               pythonpath: Optional[str] = None) -> Dict[str, str]:
    """The variables a server process gets on top of this environment (``pythonpath``: the
    PYTHONPATH it would inherit, default this process's)."""
    env: Dict[str, str] = {}
    extra_path: List[str] = []
    if on_cpu(record):
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        extra_path.append(str(KERNEL_SHIM_DIR))
        if "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(record)
    if plugin_overlay is not None:
        extra_path.append(str(plugin_overlay))
    if extra_path:
        inherited = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
        env["PYTHONPATH"] = os.pathsep.join(extra_path + [p for p in inherited.split(os.pathsep) if p])
    return env


def cpu_threads_bind(record, cores: Optional[List[int]] = None) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for a CPU server: one core group per device id it uses.

    On a CPU SGLang takes each rank's device id (``base_gpu_id`` + k x ``gpu_id_step``) as a NUMA
    node index and refuses one past the machine's nodes (one here), so a second server of a
    deployment (``--base-gpu-id 1``) or ``dp_size=2`` would not start; with this list every id
    has an entry.  The groups split this process's cores evenly (cores are shared when there
    are more ids than cores)."""
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    ranks = 1
    for name in ("dp_size", "tp_size", "pp_size"):
        ranks *= max(1, int(getattr(record, name, 1) or 1))
    base = max(0, int(getattr(record, "base_gpu_id", 0) or 0))
    step = max(1, int(getattr(record, "gpu_id_step", 1) or 1))
    entries = base + (ranks - 1) * step + 1
    if entries <= len(cores):
        size = len(cores) // entries
        groups = [cores[i * size:(i + 1) * size] for i in range(entries)]
    else:
        groups = [[cores[i % len(cores)]] for i in range(entries)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def needs_plugin(record) -> bool:
    """Whether the record's eviction policy runs in SGLang only through sglang-hydra's plugin."""
    from ..config.choices import engine_policy_support
    support = engine_policy_support()
    return getattr(record, "radix_eviction_policy", None) in support.get("plugin", ())


def has_plugin(python: str) -> bool:
    """Whether ``python`` finds the engine plugin's entry point (sglang-hydra installed there)."""
    from ..config.choices import engine_policy_support
    probe = ("import importlib.metadata as m, sys; "
             "sys.exit(0 if any(e.name == sys.argv[1] for e in m.entry_points(group='sglang.srt.plugins')) else 3)")
    try:
        return subprocess.run([python, "-c", probe, engine_policy_support()["plugin_name"]], capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def write_plugin_overlay(target: Path) -> Path:
    """A directory that, on ``PYTHONPATH``, gives an interpreter the engine plugin and nothing else:
    ``sglang_hydra/cache/{sglang_plugin,hit_density_core}.py`` (standard library only) under empty
    package files, and a dist-info whose ``entry_points.txt`` SGLang's plugin loader reads."""
    from ..cache import sglang_plugin
    from ..config.choices import engine_policy_support
    src = Path(sglang_plugin.__file__).resolve().parent
    pkg = target / "sglang_hydra" / "cache"
    pkg.mkdir(parents=True, exist_ok=True)
    (target / "sglang_hydra" / "__init__.py").write_text('"""sglang-hydra\'s engine plugin only (job=launch)."""\n')
    (pkg / "__init__.py").write_text("")
    for name in _PLUGIN_MODULES:
        shutil.copyfile(src / name, pkg / name)
    info = target / "sglang_hydra_engine_plugin-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-hydra-engine-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{engine_policy_support()['plugin_name']} = "
                                           f"sglang_hydra.cache.sglang_plugin:register\n")
    return target


def import_check(python: str, module: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """None when ``python`` imports ``module`` (with ``env``), else why not (the error's last line)."""
    exe = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if exe is None:
        return f"{python!r} is not an executable Python interpreter"
    try:
        r = subprocess.run([exe, "-c", f"import {module}"], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=180, env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {exe} ({exc})"
    if r.returncode == 0:
        return None
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {r.returncode}"
