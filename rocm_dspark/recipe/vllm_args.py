"""User `--vllm-arg` tokens, read the way `vllm serve` reads them, and the guard on plan-owned settings.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, vLLM 0.32; github.com/vllm-project/vllm) is a
stdlib ArgumentParser that, before argparse sees a word:
  * turns `_` into `-` in a `--` flag's name, up to the first `.` (`--speculative_config` is `--speculative-config`);
  * merges dotted keys into one JSON value for the head flag and appends it after every other word, so
    `--speculative-config.enable_adaptive_verification=true` replaces the whole speculative config
    (`-sc.key=v` works the same for a short alias); a trailing `+` on a key appends to a list;
  * reads `--config FILE` (YAML) into flags, which can set anything;
  * rewrites `-O3` / `-O=3` into `--optimization-level 3`.
argparse then accepts `--flag=value` and `--flag value`, and, with allow_abbrev (the default, kept by vLLM),
any unique prefix of a long flag (`--speculative=...`, `--max-num-seq 3`) and `-tp=3` for short ones.

normalise() applies the same reading to one token and refuses every token whose flag, by any of these
spellings, reaches a setting the plan decides. The table below lists those settings by vLLM `dest` with all
of their option strings in vLLM 0.32 and 0.33; tests/slow/test_vllm_args_real.py checks it against both real
parsers (each dest's option strings are exactly the union of theirs, and the plan's dests come out unchanged
for every token we let through).

The plan emits a user value that starts with `-` as one word, `--flag=-value`, so vLLM can never read the
value as a flag of its own (`--enforce-eager --speculative-config=...`).
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

import re
from collections.abc import Mapping
from typing import NamedTuple

from rocm_dspark.errors import UsageError, did_you_mean

_SPEC = "--num-speculative-tokens, --adaptive or --benchmark-synthetic"
_CAPTURE = "--max-num-seqs, --num-speculative-tokens or --capture-cap"
_GROUP = "--nodes, --node-rank, --head-address, --strategy, --rpc-port, --dp-lb or --backend"

# dest -> (every option string in vLLM 0.32 and 0.33 together, the rocm-dspark option that sets it instead).
# 0.33 renamed --no-enable-expert-parallel to --disable-expert-parallel; both are listed.
PLAN_OWNED: dict[str, tuple[tuple[str, ...], str]] = {
    "speculative_config": (("--speculative-config", "-sc"), _SPEC),
    "spec_method": (("--spec-method",), _SPEC),
    "spec_model": (("--spec-model",), _SPEC),
    "spec_tokens": (("--spec-tokens",), _SPEC),
    "max_cudagraph_capture_size": (("--max-cudagraph-capture-size",), _CAPTURE),
    "cudagraph_capture_sizes": (("--cudagraph-capture-sizes",), _CAPTURE),
    "max_num_seqs": (("--max-num-seqs",), "--max-num-seqs"),
    "max_num_batched_tokens": (("--max-num-batched-tokens",), "--max-num-batched-tokens"),
    "tensor_parallel_size": (("--tensor-parallel-size", "-tp"), "--tp"),
    "data_parallel_size": (("--data-parallel-size", "-dp"), "--dp"),
    "enable_expert_parallel": (
        ("--enable-expert-parallel", "--no-enable-expert-parallel", "--disable-expert-parallel", "-ep"),
        "--ep",
    ),
    # The group's layout (rocm_dspark/recipe/strategies.py decides it for every node; one node's copy must match the rest).
    "pipeline_parallel_size": (("--pipeline-parallel-size", "-pp"), "--strategy multi_node_tp_pp"),
    "data_parallel_size_local": (("--data-parallel-size-local", "-dpl"), _GROUP),
    "data_parallel_address": (("--data-parallel-address", "-dpa"), _GROUP),
    "data_parallel_rpc_port": (("--data-parallel-rpc-port", "-dpp"), _GROUP),
    "data_parallel_start_rank": (("--data-parallel-start-rank", "-dpr"), _GROUP),
    "data_parallel_rank": (("--data-parallel-rank", "-dpn"), _GROUP),
    "data_parallel_backend": (("--data-parallel-backend", "-dpb"), _GROUP),
    "data_parallel_hybrid_lb": (("--data-parallel-hybrid-lb", "--no-data-parallel-hybrid-lb", "-dph"), _GROUP),
    "data_parallel_external_lb": (("--data-parallel-external-lb", "--no-data-parallel-external-lb", "-dpe"), _GROUP),
    "headless": (("--headless",), _GROUP),
    "nnodes": (("--nnodes", "-n"), _GROUP),
    "node_rank": (("--node-rank", "-r"), _GROUP),
    "master_addr": (("--master-addr",), _GROUP),
    "master_port": (("--master-port",), _GROUP),
    "distributed_executor_backend": (("--distributed-executor-backend",), "--backend"),
    # Decided per GPU, build and workload (recipes/); the plan's notes say why.
    "moe_backend": (("--moe-backend",), "the profile in recipes/ (the plan's notes say why it is set)"),
    "engram_config": (("--engram-config",), "--concurrency and --tp (the Engram offload rule in recipes/)"),
    "served_model_name": (("--served-model-name",), "--served-model-name"),
    "host": (("--host",), "--host"),
    "port": (("--port",), "--port"),
    "model": (("--model",), "--model-path"),
    # A vLLM config file can set any flag, the plan's included; its flags can be given one by one instead.
    "config": (("--config",), "separate --vllm-arg flags (a vLLM --config file could set the plan's flags)"),
}
# dest -> (option strings, the keys of its JSON value that the plan owns)
PARTLY_OWNED: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "compilation_config": (
        ("--compilation-config", "-cc"),
        frozenset({"max_cudagraph_capture_size", "cudagraph_capture_sizes"}),
    ),
}

# Option string -> hint, and -> (long name, owned keys): the views normalise() looks a flag up in.
GUARDED_FLAGS: dict[str, str] = {opt: hint for opts, hint in PLAN_OWNED.values() for opt in opts}
_PARTLY: dict[str, tuple[str, frozenset[str]]] = {
    opt: (opts[0], keys) for opts, keys in PARTLY_OWNED.values() for opt in opts
}

# What a flag name may look like: one or two dashes, a letter, then letters, digits, '-', '_', '.', '+'.
_FLAG = r"--?[A-Za-z][A-Za-z0-9_.+-]*"  # compiled on first use (re's cache), off the plain `recipe` path


class UserArg(NamedTuple):
    flag: str  # canonical: `_` -> `-` before the first '.', aliases of watched dests spelled long
    value: str | None  # None for a bare flag


def canonical_name(name: str) -> str:
    """`--a_b.c_d` -> `--a-b.c_d`: vLLM rewrites `_` only between `--` and the first `.`."""
    if not name.startswith("--"):
        return name
    head, dot, rest = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _reaches(name: str, option: str) -> bool:
    """Would argparse (allow_abbrev) read `name` as `option`? Exact, or a prefix of it.

    argparse takes a prefix only when it is unique among all of the parser's flags; when it is not,
    vLLM exits with "ambiguous option". Refusing every prefix therefore never refuses a flag that would work
    for another setting, except one that is itself a complete flag (handled by the caller: exact names win)."""
    if name == option:
        return True
    if option.startswith("--"):
        return name.startswith("--") and len(name) > 2 and option.startswith(name)
    # short options: argparse matches "-t" to "-tp" (prefix) and reads "-tp=3" as "-tp" "3" (caller splits '=')
    return not name.startswith("--") and len(name) > 1 and option.startswith(name)


def _owner(head: str, table: Mapping[str, object]) -> str | None:
    return head if head in table else next((opt for opt in table if _reaches(head, opt)), None)


def _json_keys(value: str, what: str) -> set[str]:
    import json

    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UsageError(f"--vllm-arg {what}: give the value as a JSON object (vLLM parses it as JSON)")
    return {str(k).replace("-", "_") for k in data}


def read(token: str) -> UserArg:
    """One `--vllm-arg` token as vLLM spells it (UsageError when malformed), before the guard."""
    if not isinstance(token, str) or not token.startswith("-"):
        raise UsageError(f"--vllm-arg {token!r} must start with '-' (e.g. --vllm-arg --max-model-len=65536)")
    raw_name, sep, value = token.partition("=")
    if not re.fullmatch(_FLAG, raw_name):
        raise UsageError(f"--vllm-arg {token!r}: {raw_name!r} is not a flag name (letters, digits, '-', '_', '.')")
    return UserArg(canonical_name(raw_name), value if sep else None)


def normalise(token: str) -> UserArg:
    """One `--vllm-arg` token -> UserArg, or UsageError when it is malformed or reaches a plan-owned setting."""
    name, value = read(token)
    head, dot, keys = name.partition(".")
    if head.startswith("-O") and not head.startswith("--"):
        # vLLM reads -O<x> (and -O.<x>) as --optimization-level <x>: not plan-owned, passed as given.
        return UserArg(name, value)

    owned = _owner(head, GUARDED_FLAGS)
    if owned is not None:
        spelled = f"{head} (read by vLLM as {owned})" if head != owned else head
        raise UsageError(
            f"--vllm-arg {spelled} conflicts with what the plan decides; use {GUARDED_FLAGS[owned]} instead"
        )

    if not head.startswith("--") and len(head) > 2 and head[:2] in GUARDED_FLAGS:
        # argparse reads a joined short option `-n2` as `-n 2` (its _get_option_tuples), so `-n2` sets nnodes.
        raise UsageError(
            f"--vllm-arg {head} (read by vLLM as {head[:2]} {head[2:]}) conflicts with what the plan "
            f"decides; use {GUARDED_FLAGS[head[:2]]} instead"
        )

    partly = _owner(head, _PARTLY)
    if partly is not None:
        long_name, owned_keys = _PARTLY[partly]
        if dot:
            touched = {keys.split(".")[0].rstrip("+").replace("-", "_")}
        elif value is not None:
            touched = _json_keys(value, long_name)
        else:
            touched = set()
        hit = sorted(touched & owned_keys)
        if hit:
            raise UsageError(
                f"--vllm-arg {long_name} sets {', '.join(hit)}, which the plan decides; use {_CAPTURE} instead"
            )
        return UserArg(long_name + (dot + keys if dot else ""), value)

    return UserArg(name, value)


def _negation(flag: str) -> str:
    """argparse's BooleanOptionalAction pair: `--x` <-> `--no-x`."""
    return "--" + flag[5:] if flag.startswith("--no-") else "--no-" + flag[2:]


def undoes(arg: UserArg, planned: dict) -> str | None:
    """The planned workaround flag (of `planned`: flag -> value) that `arg` would undo, or None: its
    BooleanOptionalAction opposite by any spelling vLLM reads (vLLM keeps the last one), or the same flag
    with another value."""
    head = arg.flag.partition(".")[0]
    for flag, value in planned.items():
        if not flag.startswith("--"):
            continue
        if _reaches(head, _negation(flag)) and head != flag:
            return flag
        if head == flag and arg.value != value:
            return flag
    return None


def emit(flag: str, value: str | None) -> list[str]:
    """The argv words for one flag: `--flag value`, or `--flag=value` when the value could read as a flag."""
    if value is None:
        return [flag]
    if value.startswith("-"):
        return [f"{flag}={value}"]
    return [flag, value]


# --- the build's own parser (recipes/vllm_parsers.yaml) ----------------------------------------------
_SIZE = r"\d+(?:\.\d+)?[kKmMgGtT]"  # vllm/utils/argparse_utils.py human_readable_int; compiled on first use
_WORDS = {
    "int": "an integer",
    "float": "a number",
    "int?": "an integer or None",
    "float?": "a number or None",
    "size": "an integer such as 65536 or 64k",
    "size|auto": "an integer such as 65536 or 64k, or auto",
    "json": "JSON",
}


def _fits(kind: str, value: str, choices) -> bool:
    import json

    if kind.endswith("?") and value in ("", "None"):
        return True
    if kind == "size|auto" and value.strip().lower() in ("-1", "auto"):
        return True
    if kind == "size" or kind == "size|auto":
        return bool(re.fullmatch(_SIZE, value.strip())) or _fits("int", value, None)
    if kind == "choice":  # over-accepts on purpose (a case-folding or int type): the real parser is the last word
        return value in choices or value.lower() in {c.lower() for c in choices}
    parse: dict = {"int": int, "int?": int, "float": float, "float?": float, "json": json.loads}
    try:
        parse.get(kind, str)(value)
    except ValueError:
        return False
    return True


def check_parses(arg: UserArg, facts: dict, build: str) -> None:
    """UsageError when the build's `vllm serve` parser (its facts) would refuse `arg`: no such flag (argparse's
    unique-prefix rule included), a value on a flag that takes none, none where one is needed, or a value its
    type refuses. Dotted keys and -O are left to vLLM (FlexibleArgumentParser rewrites them first)."""
    head, dot, _ = arg.flag.partition(".")
    choices: dict = facts.get("choices") or {}
    kinds = {opt: kind for kind, opts in (facts.get("kinds") or {}).items() for opt in opts} | dict.fromkeys(
        choices, "choice"
    )
    if head.startswith("-O") and not head.startswith("--"):
        return
    if head not in kinds:
        hits = [opt for opt in kinds if _reaches(head, opt)]
        if len(hits) > 1:
            raise UsageError(
                f"--vllm-arg {head}: vLLM build {build} reads it as more than one flag ({', '.join(sorted(hits)[:4])}"
                f"{', ...' if len(hits) > 4 else ''}); spell the flag out"
            )
        if not hits and not (not head.startswith("--") and head[:2] in kinds):  # `-qfp8` is `-q fp8`
            raise UsageError(
                f"--vllm-arg {head}: vLLM build {build} has no such flag{did_you_mean(head, kinds)}; "
                f"`vllm serve --help` there lists them"
            )
        head = hits[0] if hits else head[:2]
    kind = kinds[head]
    if dot:
        return
    if kind == "flag":
        if arg.value is not None:
            raise UsageError(
                f"--vllm-arg {arg.flag}={arg.value}: {head} takes no value in vLLM build {build}; pass {head} alone"
            )
        return
    if arg.value is None:
        raise UsageError(f"--vllm-arg {arg.flag}: {head} needs a value in vLLM build {build}; pass {arg.flag}=VALUE")
    if not _fits(kind, arg.value, choices.get(head, ())):
        want = f"one of {', '.join(choices[head])}" if kind == "choice" else _WORDS[kind]
        raise UsageError(
            f"--vllm-arg {arg.flag}={arg.value}: vLLM build {build} reads {head} as {want}; {arg.value!r} is not"
        )
