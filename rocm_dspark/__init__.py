"""rocm-dspark: DeepSeek-V4.1-Flash with DSpark speculative decoding on AMD MI300-class GPUs via vLLM."""

__version__ = "0.1.0"
