"""Built-in transfer backends. Each module is imported lazily by the registry."""
