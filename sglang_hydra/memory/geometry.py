"""KV geometry of one rank, read from a resolved record (pure Python, no torch).

The config layer and the plan printer use this to talk about bytes without allocating
anything.  Conventions: ``L`` layers held by this rank, ``H`` KV heads on this rank,
``D``/``Dv`` K/V head dims, MLA rows are ``kv_lora_rank + qk_rope_head_dim`` wide, and
``b`` is the byte width of the *stored* element (fp8 is stored as one byte).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .errors import setup_error

#: model ``dtype`` → element type name
_MODEL_DTYPES = {
    "auto": "bfloat16", "bfloat16": "bfloat16", "bf16": "bfloat16",
    "half": "float16", "float16": "float16", "fp16": "float16",
    "float": "float32", "float32": "float32", "fp32": "float32",
}
#: ``kv_cache_dtype`` → element type name (None: follow the model dtype)
_KV_DTYPES: Dict[str, Optional[str]] = {
    "auto": None, "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
}
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1}
#: types kept in a byte buffer and viewed back on read (indexed writes lack fp8 support)
BYTE_STORED = frozenset({"float8_e4m3fn", "float8_e5m2"})

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_first_kv_split")


def kv_dtype_name(kv_cache_dtype: str, model_dtype: str = "auto") -> str:
    """Element type name of the KV cache; unsupported choices are setup errors."""
    kv = (kv_cache_dtype or "auto").lower()
    if kv in ("fp4_e2m1", "nvfp4", "fp4_mx_block16", "mxfp8"):  # block-scaled types of the reference
        raise setup_error("kv_cache_dtype",
                          f"{kv} KV caches need a block-scaled pool (packed values plus scales), which "
                          "this build does not implement; use auto, bf16, fp8_e4m3 or fp8_e5m2")
    if kv not in _KV_DTYPES:
        raise setup_error("kv_cache_dtype", f"unknown KV cache dtype {kv_cache_dtype!r}")
    name = _KV_DTYPES[kv]
    if name is None:
        md = (model_dtype or "auto").lower()
        if md not in _MODEL_DTYPES:
            raise setup_error("dtype", f"unknown model dtype {model_dtype!r}")
        name = _MODEL_DTYPES[md]
    return name


@dataclass(frozen=True)
class KVGeometry:
    """Everything about one rank's KV rows that sizing and layouts need."""

    arch: str                 # 'mha' | 'mla'
    layers: int               # L (this pipeline stage)
    heads: int                # H (this TP rank); 1 for MLA
    head_dim: int             # D (MLA: kv_lora_rank + qk_rope_head_dim)
    v_head_dim: int           # Dv (MLA: 0, there is no V buffer)
    kv_lora_rank: int
    qk_rope_head_dim: int
    page_size: int
    dtype: str                # element type name, e.g. 'bfloat16', 'float8_e4m3fn'
    store_dtype: str          # what the buffers hold ('uint8' for fp8)
    itemsize: int             # bytes per stored element

    # ---- rows --------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.arch == "mla"

    @property
    def symmetric(self) -> bool:
        """K and V rows have the same shape (one allocation can hold both)."""
        return not self.is_mla and self.head_dim == self.v_head_dim

    @property
    def components(self) -> Tuple[Tuple[str, int, int], ...]:
        """(name, heads, dim) for every device buffer family."""
        if self.is_mla:
            return (("kv", 1, self.head_dim),)
        return (("k", self.heads, self.head_dim), ("v", self.heads, self.v_head_dim))

    @property
    def row_bytes(self) -> Dict[str, int]:
        """Bytes of one token of one layer, per component."""
        return {n: h * d * self.itemsize for n, h, d in self.components}

    @property
    def bytes_per_token(self) -> int:
        """One token, every layer, K and V (the reference's cell size / size_per_token)."""
        return sum(self.row_bytes.values()) * self.layers

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    def device_rows(self, tokens: int) -> int:
        """Rows of each device buffer: the pool plus one padding page."""
        return tokens + self.page_size

    def device_bytes(self, tokens: int) -> int:
        """Bytes of the device pool for ``tokens`` usable tokens (padding page included)."""
        return self.bytes_per_token * self.device_rows(tokens)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.update(bytes_per_token=self.bytes_per_token, bytes_per_page=self.bytes_per_page,
                 row_bytes=self.row_bytes)
        return d

    # ---- host layouts -------------------------------------------------------------------
    def host_shapes(self, layout: str, host_tokens: int) -> Dict[str, Tuple[int, ...]]:
        """Host buffer shape per component for ``layout`` (``host_tokens`` page aligned)."""
        L, ps = self.layers, self.page_size
        pages = host_tokens // ps
        if self.is_mla:
            dk = self.head_dim
            if layout == "layer_first":
                return {"kv": (L, host_tokens, 1, dk)}
            if layout == "page_first":
                return {"kv": (host_tokens, L, 1, dk)}
            if layout == "page_first_direct":
                return {"kv": (pages, L, ps, 1, dk)}
            if layout == "page_first_kv_split":
                return {"k": (pages, L, ps, 1, self.kv_lora_rank),
                        "v": (pages, L, ps, 1, self.qk_rope_head_dim)}
            raise setup_error("hicache_mem_layout",
                              f"layout {layout!r} is not available for MLA models; choose one of "
                              + ", ".join(MLA_LAYOUTS))
        if not self.symmetric and layout not in ("page_first", "page_first_direct"):
            raise setup_error("hicache_mem_layout",
                              f"layout {layout!r} needs head_dim == v_head_dim; models with different K "
                              "and V head dims support only page_first and page_first_direct")
        out = {}
        for name, H, D in self.components:
            if layout == "layer_first":
                out[name] = (L, host_tokens, H, D)
            elif layout == "page_first":
                out[name] = (host_tokens, L, H, D)
            elif layout == "page_first_direct":
                out[name] = (pages, L, ps, H, D)
            elif layout == "page_head":
                out[name] = (pages, H, ps, L, D)
            else:
                raise setup_error("hicache_mem_layout",
                                  f"layout {layout!r} is not available for MHA models "
                                  "(page_first_kv_split is MLA only); choose one of " + ", ".join(MHA_LAYOUTS))
        return out


def local_layers(num_hidden_layers: int, pp_size: int = 1) -> int:
    """Layers one pipeline stage holds (the largest stage, so sizing is never short)."""
    pp = max(1, int(pp_size or 1))
    return -(-int(num_hidden_layers) // pp)


def kv_heads_per_rank(num_kv_heads: int, tp_size: int = 1, dcp_size: int = 1) -> int:
    """KV heads on one rank: heads split over the attention TP group (TP ÷ DCP), at least 1."""
    tp = max(1, int(tp_size or 1))
    dcp = max(1, int(dcp_size or 1))
    return max(1, int(num_kv_heads) // max(1, tp // dcp))


#: geometry fields; any of them set explicitly (or by a chosen model preset) states the geometry
GEOMETRY_FIELDS = ("num_hidden_layers", "num_key_value_heads", "head_dim", "attention_arch", "kv_lora_rank")


def model_presets() -> Tuple[str, ...]:
    from ..config.presets import group_options
    return tuple(group_options("model"))


def check_geometry_known(record: Any) -> None:
    """Refuse a ``model_path`` whose KV geometry nobody stated.

    The geometry comes from a model preset, from ``config.json`` in a checkpoint directory,
    or from geometry fields set explicitly (``model=llama3_8b model.model_path=<any name>``
    keeps the preset's).  Anything else would silently fall back to the tiny defaults, so
    jobs that size or move KV (setup, replay, PD, plan) stop here; ``job=resolve`` does not.
    A ``model_path`` that merely spells a preset's name or checkpoint id
    (``--model-path llama3_8b``) is refused too unless the record has that preset's geometry.
    """
    path = str(getattr(record, "model_path", "") or "")
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():
        return
    is_explicit = getattr(record, "is_explicit", None)
    if callable(is_explicit) and any(is_explicit(f) for f in GEOMETRY_FIELDS):
        return
    from ..config.rules.model_facts import presets_named_by
    presets = presets_named_by(path)
    if any(all(getattr(record, f, None) == data[f] for f in GEOMETRY_FIELDS if f in data) for _, data in presets):
        return      # the preset's own geometry (the default tiny model, say)
    if presets:
        name = presets[0][0]
        raise setup_error("model_path",
                          f"{path!r} is the model of preset {name!r}, but the record does not have its KV "
                          f"geometry (no preset was selected); add model={name}")
    raise setup_error("model_path",
                      f"{path!r} is neither a model preset nor a local directory with a config.json, so its KV "
                      f"geometry is unknown; choose a preset with model=<name> ({', '.join(model_presets())}), or "
                      "point model.model_path at a checkpoint directory that holds config.json")


def kv_geometry(record: Any, *, require_known: bool = False) -> KVGeometry:
    """The rank-local KV geometry the record describes (``require_known``: see
    :func:`check_geometry_known`)."""
    if require_known:
        check_geometry_known(record)
    g = lambda name, default=None: getattr(record, name, default)  # noqa: E731
    arch = (g("attention_arch", "mha") or "mha").lower()
    page_size = int(g("page_size", 1) or 1)
    if page_size < 1:
        raise setup_error("page_size", "page_size must be at least 1")
    dtype = kv_dtype_name(g("kv_cache_dtype", "auto"), g("dtype", "auto"))
    store = "uint8" if dtype in BYTE_STORED else dtype
    layers = local_layers(g("num_hidden_layers", 1), g("pp_size", 1))
    if arch == "mla":
        rank, rope = int(g("kv_lora_rank", 0) or 0), int(g("qk_rope_head_dim", 0) or 0)
        if rank + rope <= 0:
            raise setup_error("kv_lora_rank", "an MLA model needs kv_lora_rank + qk_rope_head_dim > 0")
        return KVGeometry("mla", layers, 1, rank + rope, 0, rank, rope, page_size, dtype, store,
                          ITEMSIZE[store])
    if arch != "mha":
        raise setup_error("attention_arch", f"unknown attention architecture {arch!r} (mha or mla)")
    heads = kv_heads_per_rank(g("num_key_value_heads", 1), g("tp_size", 1), g("dcp_size", 1))
    d = int(g("head_dim"))
    dv = int(g("v_head_dim") or d)
    return KVGeometry("mha", layers, heads, d, dv, 0, 0, page_size, dtype, store, ITEMSIZE[store])


__all__ = ["KVGeometry", "kv_geometry", "check_geometry_known", "model_presets", "GEOMETRY_FIELDS", "kv_dtype_name", "local_layers", "kv_heads_per_rank",
           "MHA_LAYOUTS", "MLA_LAYOUTS", "ITEMSIZE", "BYTE_STORED"]
