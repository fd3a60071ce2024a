#!/usr/bin/env bash
# The SGLang 0.5.23 environment, one venv for two uses:
#   * the config oracle (the differential tests resolve flags with SGLang's own ServerArgs), and
#   * a real server on a CPU-only machine (`job=launch hardware=local model=tiny_llama`).
#
# Usage: scripts/install_engine_env.sh VENV_DIR
# Idempotent: an existing VENV_DIR is reused and each step only installs what is missing.
#
# Steps (why each is there):
#   1. torch 2.14.1 + torchvision 0.29.1 first, pinned, so pip takes the CPU wheels instead of
#      resolving a CUDA build through sglang's dependencies.
#   2. SGLang's light runtime dependencies (what config resolution and the cache classes import).
#   3. sglang==0.5.23 itself with --no-deps (its full dependency set pulls CUDA-only wheels).
#   4. The pure-Python packages the *server* process imports (HTTP server, tokenizer manager,
#      detokenizer, grammar backend, ...), under a constraints file that pins torch, numpy and
#      transformers to what steps 1-2 installed, so nothing is silently up- or downgraded.
#   5. sglang-router 0.3.2 (a self-contained Rust wheel) so the router runs from the same venv.
# SGLang's CPU kernel build (`sgl_kernel`, not on PyPI) is not installed here: job=launch puts the
# torch implementation shipped in sglang_hydra/engine_assets/ on the server's path when the server
# runs on a CPU.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
VENV="$1"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q)
t0=$(date +%s)

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi

have() {   # have DIST==VERSION ... : every distribution installed at that version
  "$PY" - "$@" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and got != want:
        sys.exit(1)
EOF
}

# 1. torch (CPU wheels)
if ! have torch==2.14.1 torchvision==0.29.1; then
  "${PIP[@]}" torch==2.14.1 torchvision==0.29.1
fi

# 2. the light dependencies of config resolution and the cache classes
LIGHT=(numpy msgspec orjson psutil pybase64 requests triton packaging pillow starlette pydantic pyzmq tqdm
       ipython aiohttp pyyaml transformers dill sentencepiece compressed-tensors gguf apache-tvm-ffi
       "openai==2.8.0" partial_json_parser)
if ! have numpy msgspec orjson psutil pybase64 requests triton packaging pillow starlette pydantic pyzmq tqdm \
     ipython aiohttp pyyaml transformers dill sentencepiece compressed-tensors gguf apache-tvm-ffi \
     openai==2.8.0 partial-json-parser; then
  "${PIP[@]}" "${LIGHT[@]}"
fi

# 3. sglang itself, without its (CUDA) dependency set
if ! have sglang==0.5.23; then
  "${PIP[@]}" --no-deps sglang==0.5.23
fi

# 4. what the server process imports, with torch / numpy / transformers pinned where they are
CONSTRAINTS="$VENV/engine-constraints.txt"
"$PY" - >"$CONSTRAINTS" <<'EOF'
from importlib.metadata import version
for name in ("torch", "torchvision", "numpy", "transformers"):
    print(f"{name}=={version(name)}")
EOF
SERVER=(fastapi uvicorn uvloop python-multipart prometheus-client setproctitle partial-json-parser
        "openai==2.8.0" anthropic interegular einops xxhash zstandard distro easydict tiktoken python-dateutil
        blobfile nvidia-ml-py watchfiles "openai-harmony==0.0.4" scipy jsonschema soundfile)
if ! have fastapi uvicorn uvloop python-multipart prometheus-client setproctitle anthropic interegular einops \
     xxhash zstandard distro easydict tiktoken python-dateutil blobfile nvidia-ml-py watchfiles \
     openai-harmony==0.0.4 scipy jsonschema soundfile; then
  "${PIP[@]}" -c "$CONSTRAINTS" "${SERVER[@]}"
fi
# xgrammar's own pins would pull a different torch/transformers: it only needs to import here
if ! have xgrammar==0.2.7; then
  "${PIP[@]}" --no-deps xgrammar==0.2.7
fi

# 5. the router (optional: a machine without the wheel still gets a working server venv)
if ! have sglang-router==0.3.2; then
  "${PIP[@]}" -c "$CONSTRAINTS" sglang-router==0.3.2 || echo "note: sglang-router==0.3.2 did not install" >&2
fi

# The two uses must import: the config oracle, and the server's entry modules on a CPU with the
# torch sgl_kernel that job=launch puts on a CPU server's path.
"$PY" -c "import sglang.srt.server_args, sglang.srt.mem_cache.unified_radix_cache"
PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)/sglang_hydra/engine_assets" SGLANG_USE_CPU_ENGINE=1 "$PY" -c \
  "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.managers.detokenizer_manager"
echo "engine env ready in $VENV ($(( $(date +%s) - t0 )) s)"
