"""Deployments: one server (``deploy=single``) or a prefill/decode pair behind a router (``deploy=pd``).

A PD deployment is two full records composed from one command line.  Everything written at top
level (``model=llama3_8b``, ``--page-size 16``, a ``--config`` file's namespaces) applies to both
sides; ``prefill.<ns>.<field>=...`` / ``decode.<ns>.<field>=...`` (or a ``prefill:`` / ``decode:``
section of the ``--config`` file) override one side, and always beat the shared value.  Each side
is composed exactly like a single record (the same presets, legacy flags, checks and rules), with
its ``disaggregation_mode`` set to its role.  Then the ports are laid out so that nothing on one
host is bound twice, and the two sides are checked to agree on what the KV transfer needs.

Deployment-level settings (``deploy.router_port=...``) live in ``conf/deploy/<option>.yaml``.
This package is pure configuration: it builds and checks, the ``launch`` job runs.

The package holds one concept per module, each importing only those before it: :mod:`.model` (what
a deployment is), :mod:`.request` (splitting the command line), :mod:`.ports` and :mod:`.gpus` (the
layouts), :mod:`.assemble` (composing and checking it all).  Every name is re-exported here, so
``from sglang_hydra.config.deploy import ...`` reads as it did when this was one module.
"""

from .model import (SIDES, DEFAULT_DEPLOY, DEPLOYMENT_JOBS, PLANNING_JOBS, _SOURCE, _WILDCARD_HOSTS, DeploySettings,
                    ROUTER_POLICIES, WORKER_KEYS, deploy_settings_problems, _ROUTER_MANAGED, _managed_router_flags, Router, Server, Deployment,
                    connect_host, as_deployment, router_argv, _Side)  # noqa: F401
from .request import (_TOKEN, _HELP_FLAGS, DeployRequest, deployment_request, _free_tokens, _deploy_token,
                      _parse_value, _load_file_sections)  # noqa: F401
from .ports import (ZMQ_TCP_PORT_DELTA, _ZMQ_PORTS, _GRPC_PORT_DELTA, _LOOPBACK, _Claim, _hosts_overlap,
                    _machine_loopback, _label, _key_flag, attn_dp_ports, _attn_dp, _legacy_grpc,
                    _dist_init_port, _server_port_claim, _side_claims, _router_claims, _clash_message,
                    _first_clash, _lay_out_ports, listening_ports)  # noqa: F401
from .gpus import (gpus_per_node, gpu_ids, _on_gpus, _lay_out_gpus, server_gpus, gpu_budget_problems)  # noqa: F401
from .assemble import (deploy_options, _deploy_settings, _side_command, _without_config, _compose, _Once,
                       _RoleLabel, _merge_side_problems, compose_deployment, _field_of, _mentions, _stand_in,
                       _preset_mode, _dedupe, _MUST_AGREE, cross_side_problems)  # noqa: F401
