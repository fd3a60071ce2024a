"""``perf``: how long the engine's forward passes take on a target GPU.

One pass-time model (:class:`~sglang_hydra.perf.pass_time.PassModel`) serves every timing
question: ``job=estimate``'s static batch, the replay's prefill timeline and the deployment
simulation.  It sits beside ``cache`` in the layer contract: it reads the record's model
shapes (config) and the KV and weight bytes (memory), and nothing above.  Pure Python.
"""
from .pass_time import PassModel, PassModelError

__all__ = ["PassModel", "PassModelError"]
