"""The bottom layer: small helpers with no project imports (environment flags, ports, child processes)."""
