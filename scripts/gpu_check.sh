#!/usr/bin/env bash
# The one prepared GPU run: everything sglang-hydra can only check on a CUDA GPU, in one
# call of under 8 minutes on one H200, every result under $OUT.
#
#   1 transfer_cuda   pytest tests/memory/test_transfer_cuda.py (compiled Triton kernels,
#                     pinned host pools, bit-exact against the torch reference)
#   2 disagg_cuda     pytest tests/disagg -k cuda (GPU-only PD transfer tests)
#   3 bench_transfer  scripts/bench_transfer.py --device cuda --page-sizes 16,64,128: every
#                     layout x io backend against a pinned-host cudaMemcpy of the same bytes,
#                     backup and load (exits 1 on any round-trip mismatch)
#   4 setup_verify    sglang-hydra job=setup job.verify=true model=llama3_8b
#                     schedule.mem_fraction_static=0.5 memory=hicache: sizes the pools from the
#                     GPU's memory and round-trips random pages device -> host -> device
#                     through the kernel io backend (without memory=hicache there is no host
#                     pool and verify has nothing to do; hicache_size bounds the pinned host pool)
#   5 calibrate       sglang-hydra job=calibrate, when this checkout has that job
#
# Each step logs to $OUT/<step>.log; $OUT/summary.txt has one line per step (PASS, FAIL,
# TIMEOUT, NO-TESTS, SKIP) and env.log the versions and the GPU.  A failing step does not
# stop the others; the exit status is 1 when any step failed or timed out.  Every step has
# its own time limit (on the GPU they add up to 7m40s; a normal run takes far less).
#
# The device machine reaches no package registry, and its python3 already has torch and
# triton.  What sglang-hydra needs beyond that travels as wheels in .whl/ (ignored by git):
#
#   bash scripts/gpu_check.sh --prepare-wheels          # here, once: hydra-core, omegaconf,
#                                                       # antlr4 runtime, pyzmq for Python 3.12
#   device run:  command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 540
#
# (nixl-cu12 is 68 MB, over the 64 MiB a device call can carry, so NIXL tests skip there.)
# With GPU_CHECK_INSTALL=pip the script instead makes a venv with torch and `pip install -e
# .[nixl,test]` (for a GPU machine that does reach PyPI).
#
#   bash scripts/gpu_check.sh --rehearse                # or GPU_CHECK_REHEARSE=1
#
# runs the same script on a machine without a GPU: no install (the current python3 and
# PYTHONPATH), OUT defaults to a new temporary folder, the pytest steps run (their CUDA
# tests skip), and the GPU commands run on the CPU at toy sizes, so the one device call
# cannot fail on a typo.  GPU_CHECK_ONLY=step,step runs only the named steps (env always).
set -uo pipefail

REHEARSE=${GPU_CHECK_REHEARSE:-0}
PREPARE_WHEELS=0
for arg in "$@"; do
  case "$arg" in
    --rehearse) REHEARSE=1 ;;
    --prepare-wheels) PREPARE_WHEELS=1 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (allowed: --rehearse, --prepare-wheels, --help)" >&2; exit 2 ;;
  esac
done
case "$REHEARSE" in 1|true|yes|on) REHEARSE=1 ;; *) REHEARSE=0 ;; esac

cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
PY=${PYTHON:-python3}

# ------------------------------------------------------------------ wheels for the device
# Pure-Python ones are built here (antlr4's runtime ships only as an sdist); pyzmq is the
# CPython 3.12 manylinux wheel the device's python3 needs.
if [ "$PREPARE_WHEELS" = 1 ]; then
  mkdir -p .whl
  "$PY" -m pip wheel -q --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 || exit 1
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "pyzmq>=25" || exit 1
  ls -l .whl
  exit 0
fi

if [ -z "${OUT:-}" ]; then
  if [ "$REHEARSE" = 1 ]; then OUT=$(mktemp -d -t gpu_check.XXXXXX); else OUT=/tmp/gpu_check_out; fi
fi
mkdir -p "$OUT" || exit 2
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0
export PYTHONUNBUFFERED=1

want() {  # is step $1 selected by GPU_CHECK_ONLY?
  [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
  case ",$GPU_CHECK_ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

record() {  # record STEP STATUS SECONDS NOTE
  printf '%-15s %-8s %5ss  %s\n' "$1" "$2" "$3" "$4" >>"$SUMMARY"
  case "$2" in FAIL|TIMEOUT) FAILED=1 ;; esac
}

# run_step NAME LIMIT_S [--pytest] -- COMMAND...: log to $OUT/NAME.log, never stop the script
run_step() {
  local name=$1 limit=$2 pytest=0
  shift 2
  if [ "${1:-}" = "--pytest" ]; then pytest=1; shift; fi
  [ "${1:-}" = "--" ] && shift
  want "$name" || return 0
  local log=$OUT/$name.log start=$SECONDS rc status
  printf '$ %s\n' "$*" >"$log"
  timeout --kill-after=15 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=PASS
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=TIMEOUT
  elif [ $pytest = 1 ] && [ $rc -eq 5 ]; then status=NO-TESTS
  else status=FAIL
  fi
  local tail_line
  tail_line=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-110)
  record "$name" "$status" "$((SECONDS - start))" "rc=$rc; $tail_line"
}

skip_step() {
  want "$1" && record "$1" SKIP 0 "$2"
  return 0
}

# ------------------------------------------------------------------------ environment
ENV_LOG=$OUT/env.log
{
  echo "gpu_check $(date -u +%FT%TZ) rehearse=$REHEARSE repo=$REPO"
  git -C "$REPO" log -1 --format='commit %H %s' 2>/dev/null || true
} >"$ENV_LOG"
env_start=$SECONDS
INSTALL=${GPU_CHECK_INSTALL:-auto}
if [ "$REHEARSE" = 1 ]; then
  INSTALL=none
elif [ "$INSTALL" = auto ]; then
  if compgen -G ".whl/*.whl" >/dev/null; then INSTALL=wheels; else INSTALL=none; fi
fi
install_ok=1
case "$INSTALL" in
  wheels)
    SITE=/tmp/gpu_check_site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      >>"$ENV_LOG" 2>&1 || install_ok=0
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    ;;
  pip)
    { "$PY" -m venv /tmp/gpu_check_venv && . /tmp/gpu_check_venv/bin/activate \
        && python -m pip install -q torch && python -m pip install -q -e ".[nixl,test]"; } >>"$ENV_LOG" 2>&1 || install_ok=0
    PY=python
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    ;;
  none)
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    ;;
  *) echo "gpu_check.sh: GPU_CHECK_INSTALL must be auto, wheels, pip or none, got '$INSTALL'" >&2; exit 2 ;;
esac
"$PY" - >>"$ENV_LOG" 2>&1 <<'EOF'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "triton", "hydra", "omegaconf", "zmq", "numpy", "sglang_hydra"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')} {getattr(mod, '__file__', '')}")
    except Exception as exc:  # report every missing piece, not only the first
        print(f"{name} MISSING: {exc}")
import torch
print("cuda available", torch.cuda.is_available(), "torch cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi >>"$ENV_LOG" 2>&1
if ! "$PY" -c "import sglang_hydra.config.compose, hydra, torch" >>"$ENV_LOG" 2>&1; then install_ok=0; fi
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ $install_ok = 1 ]; then
  record env PASS $((SECONDS - env_start)) "install=$INSTALL cuda=$CUDA"
else
  record env FAIL $((SECONDS - env_start)) "install=$INSTALL: see env.log"
fi
if [ "$REHEARSE" = 0 ] && [ "$CUDA" != 1 ]; then
  record env FAIL 0 "no CUDA GPU visible to torch: the GPU steps below cannot show anything"
fi

# -------------------------------------------------------------------------------- steps
CLI=("$PY" -m sglang_hydra)

# 1: the compiled-kernel transfer matrix, and the disagg GPU tests
run_step transfer_cuda 120 --pytest -- "$PY" -m pytest -q -p no:cacheprovider tests/memory/test_transfer_cuda.py
if [ -d tests/disagg ]; then
  run_step disagg_cuda 75 --pytest -- "$PY" -m pytest -q -p no:cacheprovider tests/disagg -k cuda
else
  skip_step disagg_cuda "no tests/disagg in this checkout"
fi

# 2: transfer benchmark against pinned-host cudaMemcpy, both directions
if [ "$REHEARSE" = 1 ]; then
  run_step bench_transfer 120 -- "$PY" scripts/bench_transfer.py --device cpu --page-sizes 16 --pages 8 --layers 2 \
    --kv-heads 2 --head-dim 64 --reps 1 --layouts page_first,page_head --io direct
else
  run_step bench_transfer 90 -- "$PY" scripts/bench_transfer.py --device cuda --page-sizes 16,64,128 --reps 5
fi

# 3: memory plan sized from the GPU, allocated and verified through the kernel io backend
SETUP=(job=setup job.verify=true job.progress=false model=llama3_8b schedule.mem_fraction_static=0.5
       memory=hicache memory.hicache_io_backend=kernel)
SETUP_GPU=("${SETUP[@]}" device.device=cuda memory.hicache_size=8)
if [ "$REHEARSE" = 1 ]; then
  # the GPU command line composed and checked (record and job settings) without running it,
  # then the same job on the CPU at toy size (max_total_tokens wins over the fraction)
  run_step setup_keys 60 -- "$PY" -c 'import sys; from sglang_hydra.config.compose import compose
rec, job = compose(overrides=sys.argv[1:]); print(job.job_name, job.job, rec.device, rec.mem_fraction_static)' \
    "${SETUP_GPU[@]}"
  run_step setup_verify 120 -- "${CLI[@]}" "${SETUP[@]}" device.device=cpu schedule.max_total_tokens=256 \
    memory.hicache_ratio=2
else
  run_step setup_verify 100 -- "${CLI[@]}" "${SETUP_GPU[@]}"
fi

# 4: calibration, when this checkout has the job
if "$PY" -c "import sys, sglang_hydra.config.registry as r; sys.exit(0 if 'calibrate' in r.job_schemas() else 1)" \
    2>/dev/null; then
  if [ "$REHEARSE" = 1 ]; then
    run_step calibrate 90 -- "${CLI[@]}" job=calibrate device.device=cpu
  else
    run_step calibrate 75 -- "${CLI[@]}" job=calibrate
  fi
else
  skip_step calibrate "job=calibrate is not in this checkout"
fi

echo "gpu_check: results in $OUT (rehearse=$REHEARSE)"
cat "$SUMMARY"
exit $FAILED
