"""The fields a probe record must match to count: this host's software and GPUs, and the plan.

Host fields are read from files and package metadata only (rocm_dspark.probe.software, /sys/module/amdgpu/version,
amd-smi/rocminfo): the gate runs on the `rocm-dspark recipe` path, which must not import torch or vLLM. The probe
records exactly the same functions' answers, so a record and the gate compare like with like; for a plan that
runs in a container image, `up` gives the gate that image's software instead. Plan fields come from the
LaunchPlan's own fields (resolved once; never re-parsed from argv), the launch command less --host/--port.

A value that cannot be read is None, and None only matches None: a record made where vLLM was installed does not
count where it is not (run `recipe`/`launch` where the probe ran).
"""

from __future__ import annotations

from pathlib import Path

from rocm_dspark.probe import software
from rocm_dspark.probe.software import rocm_version, torch_facts, vllm_facts  # noqa: F401 (the host's software)
from rocm_dspark.recipe.plan import Command

_OPT_STR = (str, type(None))  # a value that cannot be read is None
# (key, words for the note, JSON type in a record). Host fields first, in the order a reader checks them.
HOST_FIELDS = (
    ("host_id", "host", _OPT_STR),
    ("toolkit_version", "rocm-dspark", str),
    ("vllm_version", "vLLM", _OPT_STR),
    ("vllm_commit", "vLLM commit", _OPT_STR),
    ("torch_version", "torch", _OPT_STR),
    ("hip_version", "torch HIP", _OPT_STR),
    ("gpu_arch", "GPU arch", _OPT_STR),
    ("gpu_name", "GPU", _OPT_STR),
    ("gpu_count", "GPU count", int),
    ("rocm_version", "ROCm", _OPT_STR),
    ("driver_version", "amdgpu driver", _OPT_STR),
)
PLAN_FIELDS = (
    ("model_id", "model", str),
    ("model_revision", "model revision", _OPT_STR),
    ("gpu", "GPU profile", str),
    ("plan_vllm", "planned vLLM", str),
    ("image", "image", str),
    ("tp", "tensor parallel size", int),
    ("dp", "data parallel size", int),
    ("ep", "expert parallel size", int),
    ("nodes", "nodes", int),
    ("num_speculative_tokens", "K", int),
    ("max_num_seqs", "max_num_seqs", int),
    ("launch", "launch command", dict),
)
FIELDS = HOST_FIELDS + PLAN_FIELDS
_HOST_KEYS = {k for k, _, _ in HOST_FIELDS}

# Overridable in tests (an instrument: the real files exist only on an AMD host).
AMDGPU_VERSION_FILE = Path("/sys/module/amdgpu/version")
# systemd's machine-id(5), then the D-Bus copy; a container sees the host's when it is mounted read-only.
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


# --- host ------------------------------------------------------------------------------------------


def host_id() -> str:
    """Which machine this is, so a state dir shared over NFS or a PVC (one host.key for all) does not let one
    host's proof count on another. machine-id(5) is confidential, so only an app-specific hash of it is kept
    (as sd_id128_get_machine_app_specific does); without one, the host name."""
    import hashlib
    import socket

    for path in MACHINE_ID_FILES:
        ident = (software._read(path) or "").strip()
        if ident:
            return "machine-" + hashlib.sha256(b"rocm-dspark host id\0" + ident.encode()).hexdigest()[:16]
    return "hostname-" + socket.gethostname()


def driver_version() -> str | None:
    return (software._read(AMDGPU_VERSION_FILE) or "").strip() or None


def base_arch(arch: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942'."""
    return arch.split(":")[0].strip()


def gpu_facts() -> dict:
    from rocm_dspark.runtime.gpus import detect_gpus

    agents = detect_gpus()
    archs = sorted({base_arch(a.arch) for a in agents if a.arch})
    names = sorted({a.marketing_name for a in agents if a.marketing_name})
    return {"gpu_arch": ",".join(archs) or None, "gpu_name": " + ".join(names) or None, "gpu_count": len(agents)}


def host_fingerprint(gpus: dict | None = None, soft: dict | None = None) -> dict:
    """This environment's host fields. `gpus` (from gpu_facts()) saves a second amd-smi run; `soft` (software.facts()
    of another interpreter: the image a plan runs in) replaces this Python's vLLM, torch and ROCm."""
    from rocm_dspark import __version__

    read = {
        "host_id": host_id(),
        "toolkit_version": __version__,
        **(soft if soft is not None else software.facts()),
        **(gpus if gpus is not None else gpu_facts()),
        "driver_version": driver_version(),
    }
    return {key: read[key] for key, _, _ in HOST_FIELDS}


# --- plan ------------------------------------------------------------------------------------------

_WHERE = ("host", "port")  # vLLM dests that only say where it listens


def launch_identity(plan) -> dict:
    """The plan's adaptive argv and env without --host/--port: what must be the same command that was probed.
    Read from the command's typed flags (recipe/plan.py Command), rendered as resolve renders them."""
    from rocm_dspark.recipe.plan import flag_for, flag_pairs

    command = plan.adaptive_argv or plan.argv
    pairs = flag_pairs(command)
    where = {flag_for(d) for d in _WHERE}
    if pairs is not None:
        argv = list(Command(command.head, [(f, v) for f, v in pairs if f not in where]))
    else:  # a command made outside resolve (up's local-cpu target, its docker wrapper): kept as its words, less
        argv = _without_flags(list(command), where)  # --host/--port, found as vLLM's parser finds them
    # --env values (plan.secret_env) count by digest: another value is another launch, and no record holds a secret.
    from rocm_dspark.recipe.secret_env import digest

    env = {**plan.env, **{k: digest(v) for k, v in getattr(plan, "secret_env", {}).items()}}
    return {"argv": argv, "env": dict(sorted(env.items()))}


def _without_flags(words, flags: set[str]) -> list[str]:
    """`words` less each of `flags` and its value, the rest as given (a record keeps a foreign command's words).
    Which word is such a flag, and whether the next is its value: as Command.from_words (vLLM's parser) reads."""
    words = [str(w) for w in words]
    out, skip = [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        pairs = Command.from_words(["x", word]).flags  # this word alone: the flag vLLM reads it as, if any
        if pairs and pairs[0][0] in flags:
            skip = pairs[0][1] is None and i + 1 < len(words) and not Command.from_words(["x", words[i + 1]]).flags
            continue
        out.append(word)
    return out


def plan_fingerprint(plan, catalog) -> dict:
    """Plan fields of a LaunchPlan, read from its fields; the launch is its adaptive command."""
    model = catalog.find_model(plan.model_key)
    return {
        "model_id": plan.model_id,
        "model_revision": model.revision,
        "gpu": plan.gpu,
        "plan_vllm": plan.vllm_version,
        "image": plan.image,
        "tp": plan.tp,
        "dp": plan.dp,
        "ep": plan.ep,
        "nodes": plan.nodes,
        "num_speculative_tokens": plan.k,
        "max_num_seqs": plan.max_num_seqs,
        "launch": launch_identity(plan),
    }


def adaptive_plan(catalog, selection):
    """The plan with adaptive verification on (resolved once, the verdict forced): what the probe's live
    level starts and the gate guards."""
    from rocm_dspark.recipe.plan import Verdict
    from rocm_dspark.recipe.resolve import apply_verdict, resolve_plan

    return apply_verdict(
        resolve_plan(catalog, selection), Verdict(True, "probe: adaptive verification forced on to test it", None)
    )


def current_fingerprint(catalog, plan, gpus: dict | None = None, soft: dict | None = None) -> dict:
    return {**host_fingerprint(gpus, soft), **plan_fingerprint(plan, catalog)}


# --- comparison -----------------------------------------------------------------------------------


def _show(value) -> str:
    return "none" if value is None else str(value)


def _flag_values(argv: list) -> tuple[list, dict]:
    """(positional words, {flag: value or None}) of a `vllm serve MODEL --flag value ...` argv, read as vLLM
    reads it (Command.from_words: `--f=v` is `--f v`, the last of a flag wins)."""
    command = Command.from_words(argv)
    return list(command.head), dict(command.flags)


def _launch_difference(recorded: dict, current: dict) -> str:
    """Which flags / env keys differ, briefly: "--max-model-len 65536 in the record, 1048576 in the plan"."""
    rh, rf = _flag_values(recorded.get("argv") or [])
    ch, cf = _flag_values(current.get("argv") or [])
    parts = []
    if rh != ch:
        parts.append(f"command {' '.join(rh)} in the record, {' '.join(ch)} in the plan")
    for flag in sorted(set(rf) | set(cf)):
        if rf.get(flag, "<absent>") != cf.get(flag, "<absent>"):
            show = lambda d, flag=flag: "absent" if flag not in d else (d[flag] if d[flag] is not None else "set")  # noqa: E731
            parts.append(f"{flag} {show(rf)} in the record, {show(cf)} in the plan")
    re_, ce = recorded.get("env") or {}, current.get("env") or {}
    for key in sorted(k for k in set(re_) | set(ce) if re_.get(k) != ce.get(k)):
        parts.append(f"env {key} {re_.get(key, 'unset')} in the record, {ce.get(key, 'unset')} in the plan")
    if not parts:
        parts.append("same flags in another order")
    return "; ".join(parts[:3]) + (f"; {len(parts) - 3} more" if len(parts) > 3 else "")


def mismatches(recorded: dict, current: dict) -> list[str]:
    """One phrase per differing field, e.g. "vLLM 0.32.0 (this host has 0.33.0)"; [] when all match."""
    out = []
    for key, words, _ in FIELDS:
        rv, cv = recorded.get(key), current.get(key)
        if rv == cv:
            continue
        where = "host" if key in _HOST_KEYS else "plan"
        if key == "launch":
            out.append(f"another launch command ({_launch_difference(rv or {}, cv or {})})")
        else:
            out.append(f"{words} {_show(rv)} (this {where} has {_show(cv)})")
    return out


def summary(fp: dict) -> str:
    """One line for --show and the verdict: GPU x count, vLLM, model, layout, K, MNS."""
    gpu = f"{fp.get('gpu_name') or 'no AMD GPU'} ({fp.get('gpu_arch') or '-'}) x{fp.get('gpu_count')}"
    return (
        f"{gpu}, vLLM {_show(fp.get('vllm_version'))}, {fp.get('model_id')}, TP{fp.get('tp')} DP{fp.get('dp')} "
        f"EP{fp.get('ep')}, K={fp.get('num_speculative_tokens')}, max_num_seqs {fp.get('max_num_seqs')}"
    )
