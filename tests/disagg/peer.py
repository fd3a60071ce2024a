"""A prefill or decode peer run as a separate process by the fault tests.

    python tests/disagg/peer.py prefill --backend zmq --bootstrap-port 12345
    python tests/disagg/peer.py decode --backend zmq --prefill 127.0.0.1:12345 --rooms 1,2 --pages 4

It prints ``READY <json>`` once up, (prefill) ``META <room>`` when the first request's metadata
arrived, and (decode) ``RESULT <json>`` when done. This is a test-only entry module: the fault
injection of ``faults.py`` (``--transfer-delay``) is installed here, never in production code.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("prefill", "decode"))
    ap.add_argument("--backend", default="zmq")
    ap.add_argument("--bootstrap-port", type=int, default=0)
    ap.add_argument("--prefill", default=None)
    ap.add_argument("--rooms", default="")
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--checksum", action="store_true")
    ap.add_argument("--idle-timeout", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--transfer-delay", type=float, default=0.0, help="prefill: post no write before this")
    ap.add_argument("--secret", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"[{a.role}-peer] %(name)s: %(message)s")

    from sglang_hydra.config.testing import make_record
    from sglang_hydra.disagg.workers import DecodeWorker, PrefillWorker
    from tests.disagg.faults import with_faults

    rec = make_record(disaggregation_mode=a.role, disaggregation_transfer_backend=a.backend, page_size=16,
                      max_total_tokens=4096, disaggregation_enable_kv_checksum=a.checksum,
                      disaggregation_bootstrap_secret=a.secret, disaggregation_decode_retraction_backup="none")
    if a.role == "prefill":
        w = PrefillWorker(rec, bootstrap_port=a.bootstrap_port, classes=with_faults(a.backend, delay=a.transfer_delay))
        print("READY " + json.dumps({"bootstrap": w.bootstrap_addr}), flush=True)

        def announce_first_meta():
            while not w.mgr.transfer_infos:
                time.sleep(0.02)
            print(f"META {json.dumps(min(w.mgr.transfer_infos))}", flush=True)
        threading.Thread(target=announce_first_meta, daemon=True).start()
        try:
            w.serve(None, idle_timeout=a.idle_timeout)
        finally:
            w.close()
    else:
        w = DecodeWorker(rec)
        print("READY {}", flush=True)
        rooms = [int(r) for r in a.rooms.split(",") if r]
        try:
            res = w.fetch(a.prefill, rooms, a.pages, timeout=a.timeout)
            print("RESULT " + json.dumps(res.to_dict()), flush=True)
        finally:
            w.close()


if __name__ == "__main__":
    main()
