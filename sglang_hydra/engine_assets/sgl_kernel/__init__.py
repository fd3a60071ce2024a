"""The CPU kernels SGLang 0.5.23 reaches when it serves a plain model on a CPU, in torch.

SGLang's CPU path imports ``sgl_kernel`` (its CPU kernel build, which is not on PyPI).  For a
Llama-type model with ``--attention-backend torch_native`` only two of those kernels run:

* :func:`assign_req_to_token_pool_cpu`: on every KV allocation, writes each request's new slots
  into its row of the request-to-token table (``sglang/srt/mem_cache/allocation.py``);
* :func:`copy_all_layer_kv_cache_cpu`: moves KV rows between slots in every layer's buffer
  (``sglang/kernels/ops/kvcache/cache_move.py``).

The speculative-decoding helpers SGLang imports at module level are present so that import
works; calling one raises, because speculative decoding on CPU needs SGLang's real kernel build.
``torch.ops.sgl_kernel.convert_weight_packed`` is deliberately not registered: SGLang then treats
Intel AMX as unavailable and its layers (norm, activation, rotary, attention) run their plain
torch code.

``job=launch`` puts the directory above this package on ``PYTHONPATH`` of the servers it starts
on a machine without a GPU, and nowhere else: this is not a module of sglang-hydra itself.
"""
from __future__ import annotations

import ctypes

import torch

__all__ = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu"]
__version__ = "0.0.0+sglang-hydra-torch-cpu"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                  start_offset: torch.Tensor, end_offset: torch.Tensor,
                                  out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For request i: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` = its slice of
    ``out_cache_loc``; the slices lie back to back in request order (what the Triton kernel
    ``assign_req_to_token_pool`` does on a GPU)."""
    if req_to_token.dim() != 2 or req_to_token.shape[1] != pool_len:
        raise ValueError(f"req_to_token must be (rows, {pool_len}), got {tuple(req_to_token.shape)}")
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    if not len(rows) == len(starts) == len(ends):
        raise ValueError("req_pool_indices, start_offset and end_offset must have one entry per request")
    need = 0
    for row, start, end in zip(rows, starts, ends):
        if start < 0 or end < start or end > pool_len:
            raise ValueError(f"request row {row}: slots [{start}, {end}) do not fit a row of {pool_len}")
        need += end - start
    if need > out_cache_loc.numel():
        raise ValueError(f"out_cache_loc has {out_cache_loc.numel()} slots, the requests need {need}")
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        if end > start:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + end - start].to(req_to_token.dtype)
        offset += end - start


def _rows_view(address: int, row_bytes: int, rows: int) -> torch.Tensor:
    """A (rows, row_bytes) uint8 view of memory SGLang owns (one layer's K or V buffer)."""
    buf = (ctypes.c_uint8 * (row_bytes * rows)).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8).view(rows, row_bytes)


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """In every buffer ``b`` (address ``data_ptrs[b]``, ``strides[b]`` bytes per slot): slot
    ``tgt_loc[j]`` = slot ``src_loc[j]``, all sources read before any target is written (so
    overlapping moves are safe, as in SGLang's tiled Triton kernel)."""
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(f"tgt_loc has {tgt_loc.numel()} slots, src_loc {src_loc.numel()}")
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    if int(torch.minimum(tgt.min(), src.min())) < 0:
        raise ValueError("slot indices must be non-negative")
    rows = int(torch.maximum(tgt.max(), src.max())) + 1     # the view covers no more than the kernel touches
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        view = _rows_view(int(address) & 0xFFFFFFFFFFFFFFFF, int(row_bytes), rows)
        view[tgt] = view[src]        # advanced indexing gathers a copy first


def _needs_real_kernels(name: str):
    def unavailable(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding on CPU needs SGLang's CPU kernel build (sgl-kernel built "
            f"from source); sglang-hydra's torch stand-in provides only the KV allocation and copy kernels")
    unavailable.__name__ = name
    return unavailable


# Imported at module level by sglang/kernels/ops/speculative/*.py on CPU, called only when
# speculative decoding runs.
for _name in ("assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
              "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "rotate_input_ids_cpu",
              "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "build_draft_decode_metadata_cpu"):
    globals()[_name] = _needs_real_kernels(_name)
del _name
