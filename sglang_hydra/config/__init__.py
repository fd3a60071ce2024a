"""The configuration layer: pure Python + omegaconf/Hydra, never torch or triton."""
