"""Control-plane messages exchanged over ZMQ PUSH/PULL sockets.

Every message is a multipart message whose first frame names its kind:

* ``REGISTER``  decode -> prefill, once per prefill: ``[b"REGISTER", session, json]`` where the
  JSON carries the decode endpoint and its buffer pointers, lengths and per-page sizes (plus
  backend extras such as the Mooncake session id).
* ``META``      decode -> prefill, once per request: ``[b"META", room, session, int32 pages, json]``.
* ``ABORT``     decode -> prefill: ``[b"ABORT", room, session]``.
* ``KV_STATUS`` prefill -> decode: ``[b"KV_STATUS", room, status, reason, digest, signature, settled]``;
  ``settled`` (``1``/``0``, optional: a 6-frame message means settled) says that prefill will never
  write into this room's destination pages again. A terminal status whose writes may still be in
  flight (an engine timeout) carries ``0``: decode then keeps the pages until its release timeout.
* ``ABORT_ACK`` prefill -> decode: ``[b"ABORT_ACK", room, prefill_session]``: the answer to ``ABORT``
  once no write of that room can still land (none was posted, or all posted ones have settled).
* ``REG_ACK``   prefill -> decode: ``[b"REG_ACK", prefill_session, json]`` once a registration was
  accepted; the JSON carries the prefill's control endpoint and backend extras (e.g. its Mooncake
  session, which decode may probe to tell a dead prefill from a slow one).
* ``KV_DATA``   prefill -> decode (zmq backend only):
  ``[b"KV_DATA", room, <dst_addr:u64, len:u64, flags:u32>, bytes]``; flag 1 marks the last entry.
* ``KV_ACK``    decode -> prefill (zmq backend only): ``[b"KV_ACK", room, ok, reason]`` once the last
  entry of a request has landed (or was refused).

Integers travel as ASCII, page indices as little-endian int32.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence


REGISTER = b"REGISTER"
META = b"META"
ABORT = b"ABORT"
KV_STATUS = b"KV_STATUS"
KV_DATA = b"KV_DATA"
KV_ACK = b"KV_ACK"
ABORT_ACK = b"ABORT_ACK"
REG_ACK = b"REG_ACK"
_DATA_HEADER = struct.Struct("<QQI")
DATA_LAST = 1


class ProtocolError(ValueError):
    pass


@dataclass
class Registration:
    session: str
    ip: str
    port: int
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    page_size: int
    kv_cache_dtype: str = "auto"
    engine_rank: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)

    def encode(self) -> List[bytes]:
        body = {k: getattr(self, k) for k in ("ip", "port", "kv_data_ptrs", "kv_data_lens",
                                             "kv_item_lens", "page_size", "kv_cache_dtype",
                                             "engine_rank", "extra")}
        return [REGISTER, self.session.encode(), json.dumps(body).encode()]

    @classmethod
    def decode(cls, frames: Sequence[bytes]) -> "Registration":
        if len(frames) != 3 or frames[0] != REGISTER:
            raise ProtocolError(f"bad REGISTER message ({len(frames)} frames)")
        body = json.loads(frames[2])
        return cls(session=frames[1].decode(), **body)

    def regions(self):
        return list(zip(self.kv_data_ptrs, self.kv_data_lens))


@dataclass
class TransferInfo:
    room: int
    session: str
    dst_pages: List[int]
    extra: Dict[str, Any] = field(default_factory=dict)

    def encode(self) -> List[bytes]:
        return [META, str(self.room).encode(), self.session.encode(),
                struct.pack(f"<{len(self.dst_pages)}i", *self.dst_pages), json.dumps(self.extra).encode()]

    @classmethod
    def decode(cls, frames: Sequence[bytes]) -> "TransferInfo":
        if len(frames) != 5 or frames[0] != META:
            raise ProtocolError(f"bad META message ({len(frames)} frames)")
        if len(frames[3]) % 4:
            raise ProtocolError("META page list is not a whole number of int32")
        pages = list(struct.unpack(f"<{len(frames[3]) // 4}i", frames[3]))
        return cls(room=int(frames[1]), session=frames[2].decode(), dst_pages=pages,
                   extra=json.loads(frames[4] or b"{}"))


@dataclass
class StatusMessage:
    room: int
    status: int
    reason: str = ""
    digest: int = 0
    signature: int = 0
    settled: bool = True

    def encode(self) -> List[bytes]:
        return [KV_STATUS, str(self.room).encode(), str(int(self.status)).encode(),
                self.reason.encode(), str(self.digest).encode(), str(self.signature).encode(),
                b"1" if self.settled else b"0"]

    @classmethod
    def decode(cls, frames: Sequence[bytes]) -> "StatusMessage":
        if len(frames) not in (6, 7) or frames[0] != KV_STATUS:
            raise ProtocolError(f"bad KV_STATUS message ({len(frames)} frames)")
        return cls(room=int(frames[1]), status=int(frames[2]), reason=frames[3].decode(errors="replace"),
                   digest=int(frames[4]), signature=int(frames[5]),
                   settled=len(frames) == 6 or frames[6] != b"0")


def encode_abort(room: int, session: str) -> List[bytes]:
    return [ABORT, str(room).encode(), session.encode()]


def decode_abort(frames: Sequence[bytes]):
    if len(frames) != 3 or frames[0] != ABORT:
        raise ProtocolError(f"bad ABORT message ({len(frames)} frames)")
    return int(frames[1]), frames[2].decode()


def encode_abort_ack(room: int, session: str) -> List[bytes]:
    return [ABORT_ACK, str(room).encode(), session.encode()]


def decode_abort_ack(frames: Sequence[bytes]):
    if len(frames) != 3 or frames[0] != ABORT_ACK:
        raise ProtocolError(f"bad ABORT_ACK message ({len(frames)} frames)")
    return int(frames[1]), frames[2].decode()


def encode_reg_ack(session: str, body: Dict[str, Any]) -> List[bytes]:
    return [REG_ACK, session.encode(), json.dumps(body).encode()]


def decode_reg_ack(frames: Sequence[bytes]):
    if len(frames) != 3 or frames[0] != REG_ACK:
        raise ProtocolError(f"bad REG_ACK message ({len(frames)} frames)")
    return frames[1].decode(), json.loads(frames[2] or b"{}")


def encode_data_header(dst_addr: int, nbytes: int, flags: int = 0) -> bytes:
    return _DATA_HEADER.pack(dst_addr, nbytes, flags)


def decode_data_header(b: bytes):
    if len(b) != _DATA_HEADER.size:
        raise ProtocolError("bad KV_DATA header")
    return _DATA_HEADER.unpack(b)


def encode_ack(room: int, ok: bool, reason: str = "") -> List[bytes]:
    return [KV_ACK, str(room).encode(), b"1" if ok else b"0", reason.encode()]


def decode_ack(frames: Sequence[bytes]):
    if len(frames) != 4 or frames[0] != KV_ACK:
        raise ProtocolError(f"bad KV_ACK message ({len(frames)} frames)")
    return int(frames[1]), frames[2] == b"1", frames[3].decode(errors="replace")
