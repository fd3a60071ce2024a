"""``disagg``: splitting prefill and decode (and encoders) across servers.

The role of this server, how KV pages travel between roles, and the knobs of the
decode side that receives them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..spec import arg


@dataclass
class Disagg:
    decoupled_spec_bind_endpoint: Optional[str] = arg(
        None, "Endpoint this server binds for decoupled speculative decoding.")
    decoupled_spec_connect_endpoints: Optional[List[str]] = arg(
        None, "JSON list of peer endpoints for decoupled speculative decoding.", parser="json_list")
    decoupled_spec_rank: Optional[int] = arg(
        None, "This server's rank among the decoupled speculative decoding peers.")
    decoupled_spec_role: str = arg(
        "null", "Role in decoupled speculative decoding.", choices=("null", "verifier", "drafter"))
    disaggregation_mode: str = arg(
        "null", "Serve both phases ('null'), or only prefill or only decode of a PD pair.",
        choices=("null", "prefill", "decode"))
    disaggregation_decode_allocation_policy: str = arg(
        "early", "When the decode side reserves KV pages for a request: as soon as it is "
        "queued (early) or once its prefill has finished (prefill_complete).",
        choices=("early", "prefill_complete"))
    disaggregation_transfer_backend: str = arg(
        "mooncake", "Library that moves KV pages from prefill to decode. 'mooncake_tcp' is "
        "Mooncake forced onto TCP.", choices="DISAGG_TRANSFER_BACKEND")
    disaggregation_enable_kv_checksum: bool = arg(
        False, "Checksum every transferred page range on both sides and fail requests "
        "whose bytes differ.")
    disaggregation_bootstrap_secret: Optional[str] = arg(
        None, "Shared secret every call to the prefill's bootstrap server must carry (sglang-hydra's "
        "own; unset: SGLANG_HYDRA_DISAGG_BOOTSTRAP_SECRET, else no secret). Set the same value on "
        "prefill and decode.", hydra_only=True)
    disaggregation_bootstrap_port: int = arg(
        8998, "Port of the prefill server's bootstrap registry, where decode servers look "
        "up prefill ranks.")
    disaggregation_ib_device: Optional[str] = arg(
        None, "RDMA devices for the transfer: a comma list shared by all GPUs, or a JSON "
        "object (or .json file) mapping GPU id to devices. Unset keeps the backend's own "
        "device choice.")
    disaggregation_decode_enable_radix_cache: bool = arg(
        False, "Keep a radix cache on the decode server (experimental). Refused with the fake "
        "transfer backend, with HiSparse, and with any speculative algorithm except EAGLE, EAGLE3 or DSPARK.")
    disaggregation_decode_enable_offload_kvcache: bool = arg(
        False, "Let the decode server offload finished KV to the HiCache storage tier.")
    disaggregation_decode_retraction_backup: Optional[str] = arg(
        None, "Where a retracted decode request's KV is kept: a CPU tensor, the host pool, "
        "or nowhere ('none': the request is aborted with 503 and the client retries).",
        choices=("cpu_tensor", "host_pool", "none"))
    num_reserved_decode_tokens: int = arg(
        512, "Tokens reserved per request for decoding when admitting transferred requests.")
    disaggregation_decode_extra_slots: Optional[int] = arg(
        None, "Extra request slots on the decode server for requests still in transfer. "
        "Unset: derived from --max-running-requests.")
    disaggregation_decode_polling_interval: int = arg(
        1, "Scheduler iterations between polls of transfer progress on the decode server.")
    enable_pd_role_switch: bool = arg(
        False, "Allow switching this server between prefill and decode at runtime.")
    optimistic_prefill_attempts: int = arg(
        0, "How many times prefill may start before decode has reserved pages.")
    encoder_only: bool = arg(False, "Run only the multimodal encoder (encoder disaggregation).")
    language_only: bool = arg(
        False, "Run only the language model and receive encoder outputs from encoder servers.")
    language_model_only: bool = arg(
        False, "Load only the language model of a multimodal checkpoint, without encoders.")
    encoder_transfer_backend: str = arg(
        "auto", "How encoder outputs reach the language server.",
        choices=("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"))
    encoder_urls: List[str] = arg(
        help="Encoder server URLs for a language-only server.", factory=list, nargs="+")
    encoder_bootstrap_port: int = arg(8997, "Bootstrap port for encoder disaggregation.")
    encoder_register_urls: List[str] = arg(
        help="URLs an encoder server registers itself with.", factory=list, nargs="+")
    enable_adaptive_dispatch_to_encoder: bool = arg(
        False, "Let a language server run small encoder jobs locally instead of dispatching them.")
    enable_pdmux: bool = arg(
        False, "Multiplex prefill and decode on one GPU by splitting its SMs into groups.")
    pdmux_config_path: Optional[str] = arg(None, "YAML file with PD multiplexing settings.")
    sm_group_num: int = arg(8, "Number of SM groups for PD multiplexing.")
    disaggregation_decode_host_receive_threshold: float = arg(
        1.0, "Below 1, the decode server may receive KV into its host pool when the device "
        "pool is fuller than this fraction. Must be in [0, 1].")
