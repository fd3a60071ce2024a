"""Config groups shipped with sglang-hydra (YAML presets; the schema lives in Python)."""
