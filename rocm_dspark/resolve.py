"""Selection + Catalog + Verdict -> LaunchPlan. Pure: no files, network, clock or environment.

Layers, applied in this order; a later layer wins:
  1. model base      base_args, base_env, served name, host/port of the model's recipe
  2. GPU profile     layout, batch limits, graph mode, MoE backend, image, env for (model, GPU);
                     explicit layout/limit inputs of the selection replace the profile's values here
  3. workarounds     every workaround that applies to (model, GPU, vLLM version), in file order
  4. speculative     --speculative-config from K and the model's DSpark config
  5. capture size    --max-cudagraph-capture-size = pow2ceil(max_num_seqs x (1+K)), checked against the cap
  6. verdict         adaptive verification on only when the gate proved it on this host
  7. user overrides  --vllm-arg / --env last (they may not touch what layers 4-6 decide)
Every non-obvious value gets a Note saying why.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from rocm_dspark.capture import capture_size
from rocm_dspark.catalog import Catalog, ModelSpec, Profile, release_tuple
from rocm_dspark.errors import UsageError
from rocm_dspark.plan import LaunchPlan, Note

# Flags that layers 4-6 own: overriding them by hand would bypass the K check, the capture rule
# or the adaptive-verification gate, so they have dedicated options instead.
GUARDED_FLAGS = {
    "--speculative-config": "--num-speculative-tokens, --adaptive or --benchmark-synthetic",
    "-sc": "--num-speculative-tokens, --adaptive or --benchmark-synthetic",
    "--max-cudagraph-capture-size": "--max-num-seqs, --num-speculative-tokens or --capture-cap",
    "--max-num-seqs": "--max-num-seqs",
    "--max-num-batched-tokens": "--max-num-batched-tokens",
    "--tensor-parallel-size": "--tp",
    "-tp": "--tp",
    "--data-parallel-size": "--dp",
    "-dp": "--dp",
    "--enable-expert-parallel": "--ep",
    "--served-model-name": "--served-model-name",
    "--host": "--host",
    "--port": "--port",
}


class Selection(NamedTuple):
    """What the operator asked for. None means "the profile's value"."""

    model: str
    gpu: str | None = None
    gpu_source: str = "flag"  # flag | detected | default: only for the note
    gpus_per_node: int | None = None
    nodes: int = 1
    head_address: str | None = None
    tp: int | None = None
    dp: int | None = None
    ep: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_speculative_tokens: int | None = None
    capture_cap: int | None = None
    vllm_version: str | None = None
    benchmark_synthetic: float | None = None
    model_path: str | None = None
    served_name: str | None = None
    host: str | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()  # "--flag" or "--flag=value"
    extra_env: tuple[tuple[str, str], ...] = ()


class Verdict(NamedTuple):
    """The gate's answer for this host: is adaptive verification proven here, and why (not)."""

    adaptive_proven: bool
    reason: str
    record: str | None = None

    @staticmethod
    def not_proven(reason: str = "no probe record was consulted") -> "Verdict":
        return Verdict(False, reason)


class _Args:
    """Ordered flag -> value (None for a bare flag); setting an existing flag replaces it in place."""

    def __init__(self):
        self.items: list[tuple[str, str | None]] = []

    def set(self, flag: str, value: str | None = None) -> None:
        for i, (f, _) in enumerate(self.items):
            if f == flag:
                self.items[i] = (flag, value)
                return
        self.items.append((flag, value))

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, value in self.items:
            out.append(flag)
            if value is not None:
                out.append(value)
        return out


def _compact_json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layout(sel: Selection, model: ModelSpec, p: dict, gpus_per_node: int, notes: list[Note]) -> None:
    """Validate tensor/data/expert parallel sizes against the heads and the nodes."""
    tp, dp, ep, nodes = p["tp"], p["dp"], p["ep"], sel.nodes
    heads = model.query_heads
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    if tp < 1 or dp < 1 or ep < 1:
        raise UsageError("--tp, --dp and --ep must be positive integers")
    if heads % tp:
        ok = ", ".join(str(d) for d in _divisors(heads) if d <= gpus_per_node)
        raise UsageError(f"--tp {tp} does not divide the {heads} query heads of {model.key}; use one of {ok}")
    if tp > gpus_per_node:
        raise UsageError(
            f"--tp {tp} exceeds the {gpus_per_node} GPUs of one node; tensor parallelism stays inside a node, "
            f"use --tp {gpus_per_node} and scale out with --dp")
    if dp % nodes:
        raise UsageError(f"--dp {dp} must be a multiple of --nodes {nodes} (each node runs the same number of ranks)")
    if tp * dp // nodes > gpus_per_node:
        raise UsageError(
            f"--tp {tp} x --dp {dp} needs {tp * dp // nodes} GPUs per node but a node has {gpus_per_node}; "
            f"lower --dp or add --nodes")
    if ep not in (1, tp * dp):
        raise UsageError(
            f"--ep {ep} is not possible: vLLM's expert parallel size is tp x dp = {tp * dp} when enabled; "
            f"pass --ep {tp * dp} or --ep 1")
    if nodes > 1 and not sel.head_address:
        raise UsageError("--nodes > 1 needs --head-address (the IP of node 0 that the other nodes reach)")


def _memory_check(model: ModelSpec, gpu_hbm_gb: float, tp: int, util: float | None, notes: list[Note]) -> None:
    """Weights are split across the TP group (experts too under EP); refuse a layout that cannot hold them."""
    group_gb = gpu_hbm_gb * tp
    if model.weights_gb >= group_gb:
        raise UsageError(
            f"{model.key} weights ({model.weights_gb:g} GB) do not fit in TP {tp} x {gpu_hbm_gb:g} GB HBM "
            f"({group_gb:g} GB); use a larger --tp")
    usable = group_gb * (util or 0.9)
    share = model.weights_gb / usable
    if share > 0.8:
        notes.append(Note("memory", (
            f"weights take {share:.0%} of the usable HBM of the TP {tp} group ({usable:.0f} GB at "
            f"gpu_memory_utilization {util or 0.9}); little is left for KV cache: expect short contexts or "
            f"use a larger --tp")))


def _parse_user_arg(token: str) -> tuple[str, str | None]:
    if not token.startswith("-"):
        raise UsageError(f"--vllm-arg {token!r} must start with '-' (e.g. --vllm-arg --max-model-len=65536)")
    flag, sep, value = token.partition("=")
    if flag in GUARDED_FLAGS:
        raise UsageError(f"--vllm-arg {flag} conflicts with what the plan decides; use {GUARDED_FLAGS[flag]} instead")
    return flag, (value if sep else None)


def resolve(catalog: Catalog, sel: Selection, verdict: Verdict | None = None) -> LaunchPlan:
    verdict = verdict or Verdict.not_proven()
    notes: list[Note] = []

    # 1. model base -------------------------------------------------------------------------------
    model = catalog.find_model(sel.model)
    gpu_key = sel.gpu or model.default_gpu
    gpu = catalog.find_gpu(gpu_key)
    if sel.gpu is None or sel.gpu_source == "default":
        notes.append(Note("gpu", f"no GPU given or detected; using the model's default {gpu.key} ({gpu.name}); pass --gpu to change"))
    elif sel.gpu_source == "detected":
        notes.append(Note("gpu", f"detected {gpu.name} ({gpu.arch}) on this host"))
    profile: Profile | None = model.profiles.get(gpu.key)
    if profile is None:
        raise UsageError(f"{model.key} has no profile for {gpu.key}; profiles exist for {', '.join(sorted(model.profiles))}")
    served_name = sel.served_name or model.serve["served_name"]
    host = sel.host or model.serve["host"]
    port = sel.port if sel.port is not None else int(model.serve["port"])
    if not 0 < port < 65536:
        raise UsageError(f"--port {port} is not a TCP port (1-65535)")
    env: dict[str, str] = dict(model.base_env)

    # 2. GPU profile (+ explicit layout/limits from the selection) -----------------------------------
    fields = {
        "tp": profile.tp, "dp": profile.dp, "ep": profile.ep, "max_num_seqs": profile.max_num_seqs,
        "max_num_batched_tokens": profile.max_num_batched_tokens, "capture_cap": profile.capture_cap,
        "cudagraph_mode": profile.cudagraph_mode, "breakable_cudagraph": profile.breakable_cudagraph,
        "moe_backend": profile.moe_backend, "gpu_memory_utilization": profile.gpu_memory_utilization,
        "engram_cpu_offload": profile.engram_cpu_offload,
        "adaptive_verification": bool(model.speculative["adaptive_verification"]),
    }
    for name in ("tp", "dp", "ep", "max_num_seqs", "max_num_batched_tokens", "capture_cap"):
        value = getattr(sel, name)
        if value is not None:
            if value <= 0:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} must be a positive integer, got {value}")
            fields[name] = value
    env.update(profile.env)
    extra_args: list[tuple[str, ...]] = list(profile.args)
    if profile.status != "verified":
        notes.append(Note("status", (
            f"profile {profile.id} is {profile.status} (as of {profile.status_date}; evidence: "
            f"{', '.join(profile.evidence)}); not yet run on MI300-class hardware by rocm-dspark: run "
            f"`rocm-dspark validate` before taking traffic")))
    vllm_label = sel.vllm_version or profile.vllm_build or profile.vllm_version
    vllm_version = catalog.vllm_version_of(vllm_label)
    if model.key.startswith("DeepSeek-V4.1") and release_tuple(vllm_version) < release_tuple(catalog.min_version_for_v41):
        fb = f" or use the fallback model --model {model.fallback}" if model.fallback else ""
        raise UsageError(f"vLLM {vllm_version} has no {model.key}; use vLLM >= {catalog.min_version_for_v41}{fb}")

    # 3. workarounds --------------------------------------------------------------------------------
    for w in catalog.workarounds:
        if not w.applies(model.key, gpu.key, vllm_version):
            continue
        fields.update(w.sets)
        extra_args.extend(w.args)
        env.update(w.env)
        notes.append(Note(f"workaround {w.id}", f"{w.reason} Remove when: {w.remove_when}. ({w.evidence})"))

    gpus_per_node = sel.gpus_per_node or gpu.gpus_per_node
    _layout(sel, model, fields, gpus_per_node, notes)
    _memory_check(model, gpu.hbm_gb, fields["tp"], fields["gpu_memory_utilization"], notes)

    # 4. speculative config -------------------------------------------------------------------------
    block = model.block_size
    k = sel.num_speculative_tokens if sel.num_speculative_tokens is not None else block
    if not 1 <= k <= block:
        raise UsageError(f"--num-speculative-tokens {k} is outside 1..{block} (the trained DSpark block of {model.key})")
    spec = {"method": model.speculative["method"], "num_speculative_tokens": k,
            **model.speculative["config"], "enable_adaptive_verification": False}
    if sel.benchmark_synthetic is not None:
        al = sel.benchmark_synthetic
        if not 1.0 <= al <= k + 1:
            raise UsageError(f"--benchmark-synthetic {al} must lie in [1, K+1] = [1, {k + 1}] (acceptance length counts the bonus token)")
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_length"] = al
        notes.append(Note("synthetic", (
            f"rejection_sample_method synthetic with acceptance length {al}: a throughput-benchmark knob that "
            f"fakes acceptance; NOT for serving and never for evals")))

    # 5. capture size -------------------------------------------------------------------------------
    mns, mnbt = fields["max_num_seqs"], fields["max_num_batched_tokens"]
    cap_size = capture_size(mns, k, fields["capture_cap"])
    if mnbt < cap_size:
        raise UsageError(
            f"max_num_batched_tokens {mnbt} is below the capture size {cap_size}; use --max-num-batched-tokens "
            f"{cap_size} or more, or a smaller --max-num-seqs")
    notes.append(Note("capture", (
        f"--max-cudagraph-capture-size {cap_size}: max_num_seqs {mns} x (1+K={1 + k}) = {mns * (1 + k)} "
        f"rounded up to a power of two (vLLM's own ROCm default stops at 512, so full verify batches "
        f"above it would run eager)")))

    # 6. verdict ------------------------------------------------------------------------------------
    cap = catalog.vllm_capability(vllm_version)
    adaptive = bool(fields["adaptive_verification"])
    label = vllm_label if vllm_label == vllm_version else f"{vllm_label} = {vllm_version}"
    if sel.benchmark_synthetic is not None:
        adaptive = False
    elif not adaptive and verdict.adaptive_proven:
        adaptive = True
        notes.append(Note("adaptive verification", (
            f"ON: the probe proved it on this host ({verdict.reason}; record {verdict.record})")))
    elif not adaptive:
        why = (f"vLLM {label} refuses it for V4.1 on ROCm ({cap.evidence})" if cap.refuses_adaptive_on_rocm_v41
               else f"vLLM {label} supports it natively, but it has not been proven on this host")
        notes.append(Note("adaptive verification", (
            f"OFF: full {k}-token block verification. {why}; gate: {verdict.reason}. Run `rocm-dspark probe` "
            f"on this host to prove it")))
    spec["enable_adaptive_verification"] = adaptive

    # Build argv --------------------------------------------------------------------------------------
    args = _Args()
    args.set("--served-model-name", served_name)
    args.set("--host", host)
    args.set("--port", str(port))
    for item in model.base_args:
        args.set(*item)
    args.set("--tensor-parallel-size", str(fields["tp"]))
    if fields["dp"] > 1:
        args.set("--data-parallel-size", str(fields["dp"]))
        if sel.nodes > 1:
            args.set("--data-parallel-size-local", str(fields["dp"] // sel.nodes))
            args.set("--data-parallel-address", sel.head_address)
            notes.append(Note("multi-node", (
                f"this is node 0's command; on node r (1..{sel.nodes - 1}) run the same with --headless "
                f"--data-parallel-start-rank r*{fields['dp'] // sel.nodes}")))
    if fields["ep"] > 1:
        args.set("--enable-expert-parallel")
    if fields["moe_backend"]:
        args.set("--moe-backend", fields["moe_backend"])
    if fields["gpu_memory_utilization"] is not None:
        args.set("--gpu-memory-utilization", f"{fields['gpu_memory_utilization']:g}")
    if fields["cudagraph_mode"]:
        args.set("--compilation-config", _compact_json({"cudagraph_mode": fields["cudagraph_mode"]}))
    if fields["breakable_cudagraph"] is not None:
        env["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1" if fields["breakable_cudagraph"] else "0"
    engram = fields["engram_cpu_offload"]
    if engram is not None:
        offload = engram.get(str(fields["tp"]))
        if offload is None:
            raise UsageError(
                f"profile {profile.id} sets Engram offload only for TP {', '.join(sorted(engram))}; "
                f"pick one of those with --tp")
        args.set("--engram-config", _compact_json({"cpu_offload": offload}))
    for item in extra_args:
        args.set(*item)
    args.set("--speculative-config", _compact_json(spec))
    args.set("--max-num-seqs", str(mns))
    args.set("--max-num-batched-tokens", str(mnbt))
    args.set("--max-cudagraph-capture-size", str(cap_size))

    # 7. user overrides -----------------------------------------------------------------------------
    for token in sel.extra_args:
        args.set(*_parse_user_arg(token))
        notes.append(Note("override", f"{token} (given by --vllm-arg)"))
    for key, value in sel.extra_env:
        env[key] = value
        notes.append(Note("override", f"env {key} (given by --env)"))

    target = sel.model_path or model.hf_id
    argv = ("vllm", "serve", target, *args.argv())
    block_argv = None
    if adaptive:
        block_spec = dict(spec, enable_adaptive_verification=False)
        block_argv = tuple(a if a != _compact_json(spec) else _compact_json(block_spec) for a in argv)

    return LaunchPlan(
        model_id=target, model_key=model.key, served_name=served_name, gpu=gpu.key, arch=gpu.arch,
        profile=profile.id, status=profile.status, status_date=profile.status_date,
        evidence=profile.evidence, vllm_version=vllm_version, image=profile.image, host=host, port=port,
        argv=argv, env=env, speculative_config=spec, adaptive_verification=adaptive,
        block_argv=block_argv, notes=tuple(notes),
    )


__all__ = ["Selection", "Verdict", "resolve", "GUARDED_FLAGS"]
