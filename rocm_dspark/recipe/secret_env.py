"""Environment values that must stay out of argv, launchers, plans, state files and manifests.

Every `--env` value, and any name that looks like a credential, reaches the server only through the 0600 env
file, in the syntax of the program that reads it: systemd's EnvironmentFile= for a unit (the launcher then finds
the values in its environment and hands a container `-e NAME`), and `docker run --env-file` for a shell
launcher (one raw NAME=value line each). No launcher parses quotes or escapes. Plans and manifests carry the
names only (docs/security.md).
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
# The env file's syntaxes: "systemd" (EnvironmentFile=, systemd src/basic/env-file.c) and "docker" (`docker run
# --env-file`, docker/cli opts/file.go parseKeyValueFile: each line raw, UTF-8, at most bufio.Scanner's 64 KiB).
SYNTAXES = ("systemd", "docker")
DOCKER_LINE_MAX = 64 * 1024 - 1  # bufio.MaxScanTokenSize, less the newline


def is_credential(name: str) -> bool:
    return bool(re.fullmatch(_CREDENTIAL, name, re.IGNORECASE))


def check_value(name: str, value: str) -> str:
    """A value both env file syntaxes carry unchanged: systemd's, and `docker --env-file`'s one raw UTF-8 line
    (refused here, at generation, in one line: never written half-right)."""
    bad = sorted({repr(c) for c in value if c in "\0\n\r"})
    if bad:
        raise UsageError(
            f"--env {name}: the value contains {', '.join(bad)}, which an env file line cannot carry "
            f"(docker --env-file reads one raw line per variable); remove it"
        )
    try:
        size = len(f"{name}={value}".encode())
    except UnicodeEncodeError:  # bytes the command line held that are not UTF-8 (Python's surrogateescape)
        raise UsageError(
            f"--env {name}: the value is not valid UTF-8, which docker --env-file refuses; give it as UTF-8 text"
        ) from None
    if size > DOCKER_LINE_MAX:
        raise UsageError(
            f"--env {name}: {size} bytes, longer than the {DOCKER_LINE_MAX}-byte line docker "
            f"--env-file reads; pass a path to a file holding it instead"
        )
    return value


def env_file_line(name: str, value: str, syntax: str = "systemd") -> str:
    """One variable's line. systemd: NAME="value", inside double quotes a backslash escapes \\ " ` and $
    (systemd.exec(5) EnvironmentFile=, src/basic/env-file.c). docker: NAME=value, the value raw to the line's end
    (docker/cli opts/file.go: no quotes, no escapes, no trimming of the value)."""
    check_value(name, value)
    if syntax == "docker":
        return f"{name}={value}"
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
            head, _, rest = ("", "", word) if after_env else word.partition("=")
            name, sep, _ = rest.partition("=")
            word = (f"{head}=" if head else "") + (f"{name}=<not recorded>" if sep else name)
        after_env = word == "--env"
        out.append(word)
    return out


def merge_env_file(existing: str, values: dict[str, str], syntax: str = "systemd") -> str:
    """`existing` with each NAME in `values` set (in `syntax`): its line replaced in place, or appended."""
    lines: list[str] = []
    seen: set[str] = set()
    for line in existing.splitlines():
        m = re.match(_ENV_LINE, line)
        if m and m.group(1) in values:
            if m.group(1) not in seen:  # a repeated line would win over the new value: dropped
                lines.append(env_file_line(m.group(1), values[m.group(1)], syntax))
            seen.add(m.group(1))
        else:
            lines.append(line)
    lines += [env_file_line(k, v, syntax) for k, v in values.items() if k not in seen]
    return "\n".join(lines) + "\n"
