"""What runs on a host, next to a vLLM server: one job per module (docs/layout.md names them)."""
