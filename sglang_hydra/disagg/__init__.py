"""Prefill/decode disaggregation: moving KV pages from a prefill process to a decode process.

Layout of the package:

* :mod:`.states`     ``KVPoll`` and the monotone status table;
* :mod:`.registry`   backend name -> manager / sender / receiver / bootstrap-server classes;
* :mod:`.bootstrap`  HTTP registry on ``disaggregation_bootstrap_port`` and its client;
* :mod:`.control`    ZMQ control messages;
* :mod:`.manager`    what both roles share (room table, control socket, session);
* :mod:`.prefill_side` / :mod:`.decode_side`  the sender and receiver roles;
* :mod:`.addressing` page indices -> byte ranges, contiguous-run merging;
* :mod:`.checksum`   Adler-32 over page ranges;
* :mod:`.buffers`    ``KVBufferSource`` protocol, torch buffers, page allocator, memory adapter;
* :mod:`.backends`   ``mooncake``, ``zmq``, ``fake`` (+ ``nixl`` when installed);
* :mod:`.workers`    the two roles as workers (the two-process harness is ``jobs.pd_pair_processes``).
"""
from .addressing import build_entries, group_contiguous_runs, split_batches
from .bootstrap import BootstrapError, BootstrapServer
from .buffers import KVArgs, KVBufferSource, PageAllocator, TensorKVBuffers, buffers_from_memory, kv_args_from_source
from .checksum import adler32_pages
from .registry import (BackendClasses, BackendUnavailableError, KVClassType, backend_available,
                       backend_classes, get_kv_class, register_backend, registered_backends,
                       resolve_backend_name)
from .states import KVPoll, KVTransferError, StatusTable

__all__ = [
    "KVPoll", "KVTransferError", "StatusTable", "KVClassType", "BackendClasses", "BackendUnavailableError",
    "register_backend", "registered_backends", "get_kv_class", "backend_classes", "backend_available",
    "resolve_backend_name", "BootstrapServer", "BootstrapError", "KVArgs", "KVBufferSource",
    "PageAllocator", "TensorKVBuffers", "buffers_from_memory", "kv_args_from_source", "adler32_pages",
    "group_contiguous_runs", "build_entries", "split_batches",
]
