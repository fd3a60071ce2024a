"""A policy's hits must not depend on Python's per-process string hash seed (PYTHONHASHSEED)."""
import os
import subprocess
import sys


def same_output_under_two_hash_seeds(code: str) -> str:
    """Run ``code`` (it prints a number) in two interpreters with different hash seeds, from the
    repository root; assert both print the same number and return it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the repository (for ``tests.cache.<module>`` in ``code``) and this folder (the test modules'
    # own sibling imports, as pytest's rootdir-less import mode provides them)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (root, here, os.environ.get("PYTHONPATH")) if p)
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                           env={**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1, outs
    out = outs.pop().strip()
    assert out.isdigit(), out
    return out
