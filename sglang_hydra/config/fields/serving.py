"""``serving``: network endpoints of the server."""
from __future__ import annotations


from ..schema_snapshot import build_namespace
from ..spec import arg


class _ServingRules:
    host: str = arg("127.0.0.1", "Address the HTTP server binds.")
    port: int = arg(30000, "Port of the HTTP server.", ge=1, le=65535)
    enable_streaming_session: bool = arg(False, "Keep streaming sessions open between requests.")
    enable_response_store: bool = arg(False, "Store responses for later retrieval.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Serving = build_namespace("serving", _ServingRules)
