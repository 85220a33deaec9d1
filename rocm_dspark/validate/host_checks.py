"""Host checks: the GPUs the AMD tools report, and the host settings vLLM on ROCm depends on.

On a host without an AMD GPU (no /dev/kfd, no amd-smi/rocminfo) every check here is `not_applicable` with
that reason; the settings that can still be read are recorded as the value, for the record.
"""

from __future__ import annotations

import grp
import os
import pwd
import resource
import shutil
import stat
from functools import partial
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.launch import compile_cache, launch_facts
from rocm_dspark.runtime import gpus as gpu_detect
from rocm_dspark.validate.result import FAIL, NOT_APPLICABLE, PASS, WARN, Outcome

# A GPU that reports less HBM than its part's spec by more than this is partitioned or misreported.
HBM_TOLERANCE = 0.05


def _not_amd(ctx) -> Outcome | None:
    """The not_applicable outcome on a host without AMD GPUs, else None."""
    inv = ctx.host()
    if inv.gpus:
        return None
    if inv.kfd_present and not ctx.options.require_gpu:
        return None  # a GPU host whose tools fail: gpus() fails, the others still look
    return Outcome(NOT_APPLICABLE, inv.no_gpu_reason())


def gpus(ctx) -> Outcome:
    """AMD GPUs reported by amd-smi (JSON) or rocminfo: count, name, gfx arch."""
    inv = ctx.host()
    evidence = {
        "tools": inv.tools,
        "commands": list(inv.commands),
        "problems": list(inv.problems),
        "kfd_present": inv.kfd_present,
    }
    if not inv.gpus:  # a GPU host whose tools fail, or a GPU required: a failure; else not applicable
        status = FAIL if inv.kfd_present or ctx.options.require_gpu else NOT_APPLICABLE
        why = f" ({ctx.options.require_gpu_why})" if ctx.options.require_gpu else ""
        return Outcome(status, inv.no_gpu_reason() + why, value=0, evidence=evidence)
    names = sorted({f"{g.marketing_name} ({g.arch or 'arch unknown'})" for g in inv.gpus})
    evidence["gpus"] = [g._asdict() for g in inv.gpus]
    return Outcome(PASS, f"{len(inv.gpus)} GPU(s): {', '.join(names)}", value=len(inv.gpus), evidence=evidence)


def gpu_profile(ctx) -> Outcome:
    """the GPUs are the part the plan's profile assumed (name and gfx arch) and there are TP x DP of them."""
    if (na := _not_amd(ctx)) is not None:
        return na
    inv, plan = ctx.host(), ctx.plan
    agents = [gpu_detect.GpuAgent(g.index, g.marketing_name, g.arch, g.source) for g in inv.gpus]
    found = gpu_detect.match_catalog_gpu(agents, ctx.catalog.gpus)
    spec = ctx.catalog.gpus[plan.gpu]
    needed = plan.gpus_per_node_used  # TP x local DP x PP
    evidence = {
        "plan_gpu": plan.gpu,
        "plan_arch": plan.arch,
        "profile": plan.profile,
        "gpus_needed": needed,
        "detected": found,
        "detected_archs": sorted({g.arch for g in inv.gpus if g.arch}),
    }
    threshold = {"gpu": plan.gpu, "arch": spec.arch, "count_at_least": needed}
    out = partial(Outcome, value={"gpu": found, "count": len(inv.gpus)}, threshold=threshold, evidence=evidence)
    if found != plan.gpu:
        what = (
            f"this host has {found}"
            if found
            else f"no catalog GPU matches {sorted({g.marketing_name for g in inv.gpus})}"
        )
        return out(
            FAIL,
            f"the plan assumed {plan.gpu} (profile {plan.profile}) but {what}: pass --gpu {found or '...'} "
            "or validate on the right node",
        )
    wrong_arch = sorted({g.arch for g in inv.gpus if g.arch and g.arch != spec.arch})
    if wrong_arch:
        return out(FAIL, f"{plan.gpu} should be {spec.arch} but the tools report {wrong_arch}")
    if len(inv.gpus) < needed:
        return out(FAIL, f"the plan needs {needed} GPUs per node (TP x DP) but {len(inv.gpus)} are visible")
    return out(PASS, f"{len(inv.gpus)} x {plan.gpu} ({spec.arch}), the plan needs {needed}")


def hbm(ctx) -> Outcome:
    """HBM per GPU matches the part's size (a smaller value means a memory partition or a VF slice)."""
    if (na := _not_amd(ctx)) is not None:
        return na
    spec = ctx.catalog.gpus[ctx.plan.gpu]
    sizes = {g.index: g.vram_mb for g in ctx.host().gpus}
    known = {i: mb / 1024 for i, mb in sizes.items() if mb}
    threshold = {"per_gpu_gib_at_least": round(spec.hbm_gb * (1 - HBM_TOLERANCE), 1), "spec_gb": spec.hbm_gb}
    if not known:
        return Outcome(WARN, "the tools report no HBM size", threshold=threshold, evidence={"vram_mb": sizes})
    # amd-smi's "MB" are MiB, so 192 GB parts report ~196,000 MB = ~191.7 GiB: compare in GiB with the spec's GB.
    small = {i: round(g, 1) for i, g in known.items() if g < spec.hbm_gb * (1 - HBM_TOLERANCE)}
    value = {"min_gib": round(min(known.values()), 1), "max_gib": round(max(known.values()), 1)}
    out = partial(Outcome, value=value, threshold=threshold, evidence={"vram_mb": sizes})
    if small:
        return out(
            WARN,
            f"GPU(s) {sorted(small)} report {sorted(set(small.values()))} GiB, below the {spec.hbm_gb} GB "
            f"of a {ctx.plan.gpu}: a memory partition (NPS/CPX) or a VF slice? the plan's memory math assumes the full part",
        )
    return out(PASS, f"{value['min_gib']} GiB per GPU ({ctx.plan.gpu}: {spec.hbm_gb} GB)")


def ecc(ctx) -> Outcome:
    """no uncorrectable ECC errors (correctable ones warn)."""
    if (na := _not_amd(ctx)) is not None:
        return na
    gpus = ctx.host().gpus
    counts = {
        g.index: {"correctable": g.ecc_correctable, "uncorrectable": g.ecc_uncorrectable, "deferred": g.ecc_deferred}
        for g in gpus
    }
    out = partial(Outcome, threshold={"uncorrectable": 0}, evidence=counts)
    bad = {i: c["uncorrectable"] for i, c in counts.items() if c["uncorrectable"]}
    if bad:
        return out(
            FAIL,
            f"uncorrectable ECC errors on GPU(s) {bad}: take the node out and check "
            "`amd-smi bad-pages` / `amd-smi ras --cper`",
            value=bad,
        )
    if all(c["uncorrectable"] is None for c in counts.values()):
        return out(WARN, "the tools report no ECC counts (amd-smi metric --ecc): cannot rule out memory errors")
    corrected = {i: c["correctable"] for i, c in counts.items() if c["correctable"]}
    if corrected:
        return out(WARN, f"correctable ECC errors on GPU(s) {corrected}; no uncorrectable ones", value=corrected)
    return out(PASS, "no ECC errors reported", value=0)


# Which of the device's own limits applies to which sensor (amd-smi static --limit names).
_LIMIT_FOR_SENSOR = {"hotspot": "slowdown_hotspot", "edge": "slowdown_edge", "mem": "slowdown_vram"}


def temperature(ctx) -> Outcome:
    """current temperatures below the device's own slowdown limits."""
    if (na := _not_amd(ctx)) is not None:
        return na
    gpus = ctx.host().gpus
    readings = {g.index: g.temperature_c for g in gpus}
    limits = {g.index: g.temperature_limits_c for g in gpus}
    if not any(readings.values()):
        return Outcome(WARN, "the tools report no temperatures", evidence={"limits": limits})
    hot = []
    for g in gpus:
        for sensor, celsius in g.temperature_c.items():
            limit = g.temperature_limits_c.get(_LIMIT_FOR_SENSOR.get(sensor, ""))
            if limit is not None and celsius >= limit:
                hot.append(f"GPU {g.index} {sensor} {celsius:g} C >= slowdown {limit:g} C")
    peak = max(c for r in readings.values() for c in r.values())
    out = partial(
        Outcome,
        value=peak,
        threshold="the device's own slowdown limits (amd-smi static --limit)",
        evidence={"readings": readings, "limits": limits},
    )
    if hot:
        return out(WARN, "; ".join(hot) + ": the GPU throttles; check cooling")
    note = "" if any(limits.values()) else " (no limits reported to compare with)"
    return out(PASS, f"hottest sensor {peak:g} C{note}")


def power(ctx) -> Outcome:
    """the power cap in force is not below the part's TDP."""
    if (na := _not_amd(ctx)) is not None:
        return na
    spec = ctx.catalog.gpus[ctx.plan.gpu]
    gpus = ctx.host().gpus
    evidence = {g.index: {"power_w": g.power_w, "cap_w": g.power_cap_w} for g in gpus}
    caps = [g.power_cap_w for g in gpus if g.power_cap_w]
    threshold = {"cap_at_least_w": spec.tdp_w}
    if not caps:
        return Outcome(WARN, "the tools report no power cap", threshold=threshold, evidence=evidence)
    low = sorted({c for c in caps if c < spec.tdp_w})
    value = {"cap_w_min": min(caps), "power_w_max": max((g.power_w or 0) for g in gpus)}
    out = partial(Outcome, value=value, threshold=threshold, evidence=evidence)
    if low:
        return out(
            WARN,
            f"power cap {low} W is below the {spec.tdp_w:g} W TDP of a {ctx.plan.gpu}: throughput "
            "will be lower than the profile's evidence",
        )
    return out(PASS, f"power cap {min(caps):g} W (TDP {spec.tdp_w:g} W), drawing up to {value['power_w_max']:g} W")


def compute_partition(ctx) -> Outcome:
    """the compute partition mode (amd-smi static --partition): a split GPU cannot run --monokernel.

    A split GPU (DPX..CPX) is a logical GPU of part of the XCDs, fewer compute units than the 256 CTAs of vLLM 0.33.0's mono decode kernels
    (mono/common/plan.py:22, checked at mono_decode.py:372): the launcher starts such a plan without --monokernel."""
    if (na := _not_amd(ctx)) is not None:
        return na
    modes = ctx.host().partitions
    mono = launch_facts.runs_mono(ctx.plan.argv)
    threshold = {"split_modes": list(launch_facts.SPLIT_PARTITIONS), "plan_monokernel": mono}
    if not modes:
        return Outcome(
            NOT_APPLICABLE, "amd-smi reports no compute partition (`amd-smi static --partition`)", threshold=threshold
        )
    split = {i: m for i, m in modes.items() if m in launch_facts.SPLIT_PARTITIONS}
    value = {"modes": sorted(set(modes.values())), "split_gpus": sorted(split)}
    out = partial(Outcome, value=value, threshold=threshold)
    if not split:
        return out(PASS, f"every GPU is whole ({'/'.join(value['modes'])})")
    what = f"{len(split)} GPU(s) in compute partition {'/'.join(sorted(set(split.values())))}"
    if not mono:
        return out(PASS, f"{what}; the plan does not use --monokernel")
    return out(
        WARN,
        f"{what}: a partition has fewer compute units than the mono decode kernels' 256 CTAs, so "
        "vLLM refuses --monokernel; the launcher starts the plan without it",
    )


def _user_ids(user: str | None) -> tuple[str, int, set[int], dict[int, str]]:
    try:
        entry = pwd.getpwnam(user) if user else pwd.getpwuid(os.geteuid())
    except KeyError:
        raise UsageError(f"--service-user {user!r}: no such user on this host") from None
    names = {g.gr_gid: g.gr_name for g in grp.getgrall()}
    gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    if not user:
        gids |= set(os.getgroups())
    return entry.pw_name, entry.pw_uid, gids, names


def _can_rw(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    """Read and write, by the permission class `uid` falls in (root: always)."""
    if st.st_uid == uid:
        rw = stat.S_IRUSR | stat.S_IWUSR
    else:
        rw = stat.S_IRGRP | stat.S_IWGRP if st.st_gid in gids else stat.S_IROTH | stat.S_IWOTH
    return uid == 0 or (st.st_mode & rw) == rw


def devices(ctx) -> Outcome:
    """/dev/kfd and /dev/dri render nodes are readable and writable by the service user (groups video, render)."""
    kfd = Path(ctx.path(launch_facts.KFD))
    if not kfd.exists():
        if (na := _not_amd(ctx)) is not None:
            return na
        return Outcome(FAIL, f"{kfd} does not exist: the amdgpu driver is not loaded")
    name, uid, gids, group_names = _user_ids(ctx.options.service_user)
    dri = Path(ctx.path(launch_facts.DRI))
    nodes = [kfd] + sorted(dri.glob("renderD*")) if dri.is_dir() else [kfd]
    table: dict[str, dict] = {}
    denied = []
    for node in nodes:
        st = node.stat()
        ok = _can_rw(st, uid, gids)
        table[str(node)] = {
            "group": group_names.get(st.st_gid, str(st.st_gid)),
            "mode": oct(stat.S_IMODE(st.st_mode)),
            "read_write": ok,
        }
        if not ok:
            denied.append(node)
    groups = sorted(group_names.get(g, str(g)) for g in gids)
    out = partial(Outcome, value=name, evidence={"user": name, "groups": groups, "devices": table})
    if not dri.is_dir() or len(nodes) == 1:
        return out(FAIL, f"{dri} has no render nodes: the GPU is not exposed to this host/container")
    threshold = {"groups": list(launch_facts.GPU_GROUPS)}
    if denied:
        need = sorted({table[str(n)]["group"] for n in denied})
        return out(
            FAIL,
            f"user {name} cannot open {', '.join(str(n) for n in denied[:3])}: add it to {need} "
            f"(sudo usermod -aG {','.join(need)} {name}, then log in again)",
            threshold=threshold,
        )
    return out(
        PASS, f"user {name} can open {launch_facts.KFD} and {len(nodes) - 1} render node(s)", threshold=threshold
    )


def numa_balancing(ctx) -> Outcome:
    """kernel NUMA balancing is off (it can stall GPU work)."""
    path, off = Path(ctx.path(launch_facts.NUMA_BALANCING)), launch_facts.NUMA_BALANCING_OFF
    try:
        value = path.read_text().strip()
    except OSError:
        value = None
    out = partial(Outcome, value=value, threshold=off)
    na = _not_amd(ctx)
    if na is not None:
        return out(NOT_APPLICABLE, f"{na.message} (numa_balancing here: {value if value is not None else 'absent'})")
    if value is None:
        return out(PASS, f"{path} absent: this kernel has no automatic NUMA balancing")
    if value != off:
        return out(
            WARN,
            f"NUMA balancing is on ({path} = {value}): GPU work can stall while pages migrate; "
            f"{launch_facts.NUMA_BALANCING_FIX}",
        )
    return out(PASS, "NUMA balancing is off")


def memlock(ctx) -> Outcome:
    """the memlock limit is unlimited (pinned host memory)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"  # noqa: E731
    value = {"soft": shown(soft), "hard": shown(hard)}
    out = partial(Outcome, value=value, threshold="unlimited")
    na = _not_amd(ctx)
    if na is not None:
        return out(NOT_APPLICABLE, f"{na.message} (memlock here: {value['soft']})")
    if soft != resource.RLIM_INFINITY:
        return out(
            WARN,
            f"memlock limit is {value['soft']}: pinned host memory (KV/Engram CPU tiers, RDMA) needs "
            "unlimited (LimitMEMLOCK=infinity in the unit, --ulimit memlock=-1 for docker)",
        )
    return out(PASS, "memlock is unlimited")


def hf_cache() -> Path:
    return Path(launch_facts.hf_hub_cache())  # the rule the container mounts follow too


def disk(ctx) -> Outcome:
    """the checkpoint is present or its disk has room for it.

    Where vLLM will read it: --model-path, else the Hugging Face cache."""
    model, plan = ctx.model, ctx.plan
    need = int(model.weights_gb * 1e9)
    serve_target = plan.argv[2] if len(plan.argv) > 2 and plan.argv[:2] == ("vllm", "serve") else plan.model_id
    if os.path.isabs(serve_target):
        where = Path(serve_target)
    else:
        where = hf_cache() / ("models--" + plan.model_id.replace("/", "--"))
    present = compile_cache.tree_bytes(where, follow=True) if where.exists() else 0
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    value = {"checkpoint_dir": str(where), "present_gb": round(present / 1e9, 1), "free_gb": round(free / 1e9, 1)}
    out = partial(Outcome, value=value, threshold={"checkpoint_gb": model.weights_gb})
    na = _not_amd(ctx)
    if na is not None:
        return out(NOT_APPLICABLE, f"{na.message} (free here: {value['free_gb']} GB at {probe})")
    if present >= need * 0.95:
        return out(PASS, f"checkpoint present at {where} ({value['present_gb']} GB)")
    missing = need - present
    if free < missing:
        return out(
            FAIL,
            f"{value['free_gb']} GB free at {probe} but the checkpoint needs {missing / 1e9:.0f} GB more: "
            "free space or point --model-path at a bigger disk",
        )
    return out(PASS, f"{value['free_gb']} GB free at {probe}, enough for the {model.weights_gb:g} GB checkpoint")
