"""HTTP bootstrap registry on the prefill node, and the client side used by both roles.

Routes (JSON bodies):

* ``PUT /route`` - a prefill rank registers ``rank_ip``/``rank_port`` and its layout.
* ``GET /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`` -
  the server's parallel layout and page layout; 503 until every rank has registered.
* ``GET /route?prefill_dp_rank=d&prefill_cp_rank=c&target_tp_rank=t&target_pp_rank=p`` -
  ``{"rank_ip", "rank_port"}`` of one rank; 400 on a missing argument, 404 if unknown.
* ``GET /health`` - ``OK``.

Clients retry a bounded number of times with exponential backoff, then raise
:class:`BootstrapError` naming the address and the last error.

What a careless or malicious caller cannot do:

* send a body larger than :data:`MAX_BODY_BYTES` (413), or a PUT without a length (411);
* use any other path, a query with unknown, repeated or non-integer arguments, or a body
  that is not a JSON object (400);
* move a registered rank to another address: a second registration of the same rank with a
  different ``rank_ip``/``rank_port`` is refused (409); repeating the same one is harmless;
* with a shared secret set (``disagg.disaggregation_bootstrap_secret`` or
  ``SGLANG_HYDRA_DISAGG_BOOTSTRAP_SECRET``), make any call at all without the header
  ``X-Sglang-Hydra-Secret: <secret>`` (401; compared in constant time).
"""
from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

from .base import BaseKVBootstrapServer

logger = logging.getLogger("sglang_hydra.disagg.bootstrap")

MAX_BODY_BYTES = 64 * 1024
SECRET_HEADER = "X-Sglang-Hydra-Secret"

_RANK_KEYS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
_INFO_KEYS = ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype",
              "kv_item_lens", "transfer_backend", "prefill_http_port", "decode_allocation_policy", "kv_checksum")


class BootstrapError(RuntimeError):
    """The bootstrap server could not be reached or answered with an error."""


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # route access logs to logging at debug level
        logger.debug("bootstrap %s - " + fmt, self.address_string(), *args)

    def _reply(self, code: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout) first
            self.close_connection = True

    def _authorised(self) -> bool:
        """With a secret set, every call must carry it; answers 401 and returns False otherwise."""
        secret = self.server.owner.secret
        if not secret:
            return True
        given = self.headers.get(SECRET_HEADER, "")
        if hmac.compare_digest(given.encode(), secret.encode()):
            return True
        self.close_connection = True
        self._reply(401, "Unauthorized: missing or wrong bootstrap secret")
        return False

    def do_GET(self):  # noqa: N802
        if not self._authorised():
            return None
        url = urllib.parse.urlparse(self.path)
        if url.path == "/health" and not url.query:
            return self._reply(200, "OK")
        if url.path != "/route":
            return self._reply(404, "Not found")
        try:
            q = urllib.parse.parse_qs(url.query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            return self._reply(400, "Malformed query string")
        if set(q) != set(_RANK_KEYS) or any(len(v) != 1 for v in q.values()):
            return self._reply(400, "Missing or invalid query arguments: exactly one each of " + ", ".join(_RANK_KEYS))
        try:
            ranks = tuple(int(q[k][0]) for k in _RANK_KEYS)
        except ValueError:
            return self._reply(400, "Missing or invalid query arguments: " + ", ".join(_RANK_KEYS))
        code, body = self.server.owner.lookup(*ranks)
        return self._reply(code, body)

    def do_PUT(self):  # noqa: N802
        if not self._authorised():
            return None
        url = urllib.parse.urlparse(self.path)
        if url.path != "/route" or url.query:
            return self._reply(404, "Not found")
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            return self._reply(411, "Content-Length required")
        try:
            n = int(raw)
            if n < 0:
                raise ValueError(raw)
        except ValueError:
            self.close_connection = True
            return self._reply(400, "Invalid Content-Length")
        if n > MAX_BODY_BYTES:
            self.close_connection = True   # the body is not read: the connection cannot be reused
            return self._reply(413, f"Request body larger than {MAX_BODY_BYTES} bytes")
        try:
            payload = json.loads(self.rfile.read(n) or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            return self._reply(400, f"Invalid JSON: {e}")
        if not isinstance(payload, dict):
            return self._reply(400, "Registration must be a JSON object")
        code, body = self.server.owner.register(payload)
        return self._reply(code, body)

    def do_POST(self):  # noqa: N802
        self.close_connection = True
        self._reply(405, "Method not allowed")

    do_DELETE = do_POST


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: "BootstrapServer"


class BootstrapServer(BaseKVBootstrapServer):
    """The registry, served from a daemon thread; ``secret``, when set, is required on every call.

    ``handler`` is the request handler class (tests pass a slowed-down subclass)."""

    handler_class = _Handler

    def __init__(self, host: str, port: int, *, secret: Optional[str] = None):
        self.host = host
        self.secret = secret or None
        self._lock = threading.Lock()
        self._table: Dict[Tuple[int, int, int, int], Dict[str, Any]] = {}
        self._info: Optional[Dict[str, Any]] = None
        self._httpd = _Server((host, port), self.handler_class)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="disagg-bootstrap",
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        logger.info("bootstrap server listening on http://%s:%d", host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def expected_ranks(self) -> int:
        if self._info is None:
            return 1
        i = self._info
        return int(i["dp_size"]) * int(i["attn_cp_size"]) * int(i["attn_tp_size"]) * int(i["pp_size"])

    def register(self, p: Dict[str, Any]) -> Tuple[int, Any]:
        try:
            info = {
                "attn_tp_size": int(p.get("attn_tp_size", 1)), "attn_cp_size": int(p.get("attn_cp_size", 1)),
                "dp_size": int(p.get("attn_dp_size", 1)), "pp_size": int(p.get("pp_size", 1)),
                "page_size": int(p["page_size"]), "kv_cache_dtype": str(p.get("kv_cache_dtype", "auto")),
                "kv_item_lens": [int(x) for x in p.get("kv_item_lens", [])],
                "transfer_backend": str(p.get("transfer_backend", "")),
                "prefill_http_port": p.get("prefill_http_port"),
                "decode_allocation_policy": str(p.get("decode_allocation_policy", "early")),
                "kv_checksum": bool(p.get("kv_checksum", False)),
            }
            key = (int(p.get("attn_dp_rank", 0)), int(p.get("attn_cp_rank", 0)),
                   int(p.get("attn_tp_rank", 0)), int(p.get("pp_rank", 0)))
            rank = {"rank_ip": str(p["rank_ip"]), "rank_port": int(p["rank_port"])}
        except (KeyError, TypeError, ValueError) as e:
            return 400, f"Invalid registration: {e!r}"
        if not 0 < rank["rank_port"] < 65536 or not rank["rank_ip"] or len(rank["rank_ip"]) > 255:
            return 400, f"Invalid registration: rank address {rank['rank_ip']!r}:{rank['rank_port']}"
        with self._lock:
            if self._info is not None and (self._info["decode_allocation_policy"]
                                           != info["decode_allocation_policy"]):
                return 400, "decode_allocation_policy differs between prefill ranks"
            known = self._table.get(key)
            if known is not None and known != rank:
                logger.warning("bootstrap: refused to move prefill rank %s from %s:%d to %s:%d", key,
                               known["rank_ip"], known["rank_port"], rank["rank_ip"], rank["rank_port"])
                return 409, (f"prefill rank {key} is already registered at {known['rank_ip']}:{known['rank_port']}; "
                             "a rank's address cannot be replaced")
            if self._info is None:
                self._info = info
            self._table[key] = rank
        logger.info("bootstrap: prefill rank %s registered at %s:%d", key, rank["rank_ip"], rank["rank_port"])
        return 200, "OK"

    def lookup(self, dp: int, cp: int, tp: int, pp: int) -> Tuple[int, Any]:
        with self._lock:
            n = len(self._table)
            if self._info is None or n < self.expected_ranks():
                return 503, f"Prefill server not fully registered yet ({n} workers registered)."
            if (dp, cp, tp, pp) == (-1, -1, -1, -1):
                return 200, {k: self._info[k] for k in _INFO_KEYS}
            rank = self._table.get((dp, cp, tp, pp))
        if rank is None:
            return 404, f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
        return 200, dict(rank)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2)


def _http(method: str, url: str, body: Optional[dict], timeout: float,
          secret: Optional[str] = None) -> Tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if secret:
        headers[SECRET_HEADER] = secret
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def request_with_retries(method: str, url: str, body: Optional[dict] = None, *, retries: int = 5,
                         timeout: float = 5.0, backoff: float = 0.25, max_backoff: float = 2.0,
                         retry_on: Tuple[int, ...] = (503,), secret: Optional[str] = None) -> str:
    """One HTTP call retried up to ``retries`` times; raise :class:`BootstrapError` at the end.

    Connection errors, timeouts and the status codes in ``retry_on`` are retried; other HTTP
    errors fail at once. The total time is bounded by ``retries * (timeout + max_backoff)``.
    """
    last = "no attempt made"
    delay = backoff
    for attempt in range(1, retries + 1):
        try:
            code, text = _http(method, url, body, timeout, secret)
            if code == 200:
                return text
            last = f"HTTP {code}: {text.strip()}"
            if code not in retry_on:
                break
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            last = f"{type(reason).__name__}: {reason}"
        if attempt < retries:
            time.sleep(delay)
            delay = min(delay * 2, max_backoff)
    raise BootstrapError(f"bootstrap server {method} {url} failed after {attempt} attempt(s): {last}")


def bootstrap_url(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    return f"http://{host}:{int(port)}"


def register_rank(addr: str, payload: Dict[str, Any], **kw) -> None:
    request_with_retries("PUT", bootstrap_url(addr) + "/route", payload, **kw)


def fetch_server_info(addr: str, **kw) -> Dict[str, Any]:
    q = urllib.parse.urlencode({k: -1 for k in _RANK_KEYS})
    return json.loads(request_with_retries("GET", f"{bootstrap_url(addr)}/route?{q}", **kw))


def fetch_rank(addr: str, dp: int = 0, cp: int = 0, tp: int = 0, pp: int = 0, **kw) -> Dict[str, Any]:
    q = urllib.parse.urlencode(dict(zip(_RANK_KEYS, (dp, cp, tp, pp))))
    return json.loads(request_with_retries("GET", f"{bootstrap_url(addr)}/route?{q}", **kw))


def check_health(addr: str, timeout: float = 2.0, secret: Optional[str] = None) -> bool:
    try:
        code, _ = _http("GET", bootstrap_url(addr) + "/health", None, timeout, secret)
        return code == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False
