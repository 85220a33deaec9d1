"""Environment values that must stay out of argv, launchers, plans, state files and manifests.

Every `--env` value, and any name that looks like a credential, reaches the server only through the 0600 env
file (systemd's EnvironmentFile=, which the shell launcher reads too) and, in a container, through
`docker run --env-file`. Plans and manifests carry the names only (docs/security.md).
"""

from __future__ import annotations

import re

from rocm_dspark.errors import UsageError

# Names that look like credentials: *_TOKEN, *_KEY, *_SECRET, *PASSWORD*, HF_TOKEN (matched ignoring case). The
# patterns here compile on first use (re's cache): `recipe` without --env reads neither.
_CREDENTIAL = r"(.*_(TOKEN|KEY|SECRET)|.*PASSWORD.*|HF_TOKEN)"
# vLLM flags whose value is a secret, and the env variable vLLM (or huggingface_hub) reads instead.
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
_ENV_LINE = r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*="


def is_credential(name: str) -> bool:
    return bool(re.fullmatch(_CREDENTIAL, name, re.IGNORECASE))


def check_value(name: str, value: str) -> str:
    """A value the env file (systemd) and `docker --env-file` (one raw line) both carry unchanged."""
    bad = sorted({repr(c) for c in value if c in "\0\n\r"})
    if bad:
        raise UsageError(f"--env {name}: the value contains {', '.join(bad)}, which an env file line cannot carry "
                         f"(docker --env-file reads one raw line per variable); remove it")
    return value


def env_file_line(name: str, value: str) -> str:
    """NAME="value" as systemd.exec(5) EnvironmentFile= reads it: inside double quotes a backslash escapes
    \\ " ` and $ (systemd src/basic/env-file.c); the launcher's reader (rocm_dspark/launch/templates/launcher.sh.tmpl) undoes the same."""
    check_value(name, value)
    return f'{name}="' + re.sub(r'([\\"`$])', r"\\\1", value) + '"'


def digest(value: str) -> str:
    """What records keep of a value: its sha256 (another value is another launch; the value is not kept)."""
    import hashlib

    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def redact_argv(argv) -> list[str]:
    """A command line as records keep it: `--env NAME=value` becomes `--env NAME=<not recorded>`."""
    out, after_env = [], False
    for word in map(str, argv):
        if after_env or word.startswith("--env="):
            head, _, rest = (("", "", word) if after_env else word.partition("="))
            name, sep, _ = rest.partition("=")
            word = (f"{head}=" if head else "") + (f"{name}=<not recorded>" if sep else name)
        after_env = word == "--env"
        out.append(word)
    return out


def merge_env_file(existing: str, values: dict[str, str]) -> str:
    """`existing` with each NAME in `values` set: its line replaced in place, or appended when absent."""
    lines: list[str] = []
    seen: set[str] = set()
    for line in existing.splitlines():
        m = re.match(_ENV_LINE, line)
        if m and m.group(1) in values:
            if m.group(1) not in seen:  # a repeated line would win over the new value: dropped
                lines.append(env_file_line(m.group(1), values[m.group(1)]))
            seen.add(m.group(1))
        else:
            lines.append(line)
    lines += [env_file_line(k, v) for k, v in values.items() if k not in seen]
    return "\n".join(lines) + "\n"


__all__ = ["is_credential", "check_value", "env_file_line", "merge_env_file", "digest", "redact_argv", "SECRET_FLAGS"]
