"""Selection + Catalog (+ Verdict) -> LaunchPlan. Pure: no files, network, clock or environment.

resolve() runs once per command. Its layers are named functions, applied in this order; a later layer wins:
  1. model_layer        base_args, base_env, served name, host/port of the model's recipe
  2. profile_layer      layout, batch limits, graph mode, MoE backend, env for (model, GPU); the selection's
                        explicit layout/limit inputs replace the profile's values here
  3. build_layer        the vLLM build (image, commit, reported version, changes it contains); the model
                        must be in it
  4. workaround_layer   every workaround that applies to (model, GPU), in file order
  5. workload_layer     --concurrency C: the settings public runs tie to it (batch tokens, Engram offload)
  6. layout_layer       TP/DP/EP checked against the heads and the nodes
  7. memory_layer       per-rank HBM budget; refuse a layout with no KV room (numbers in the error)
  8. speculative_layer  --speculative-config from K and the model's DSpark config
  9. capture_layer      --max-cudagraph-capture-size = pow2ceil(max_num_seqs x (1+K)), checked against the cap
 10. mono_layer         --monokernel where the layout and the decode batch fit the kernels (recipe/mono.py)
 11. command_layer      every flag, then flag_rules_layer: only what the build accepts and needs
 12. override_layer     --vllm-arg (checked against the build) / --env last; block_argv and adaptive_argv
 13. apply_verdict      adaptive verification on only when the gate proved it on this host: picks argv
Every non-obvious value gets a Note saying why.
"""

from __future__ import annotations

from rocm_dspark.errors import UsageError
from rocm_dspark.images import pick
from rocm_dspark.recipe.capture import MIN_CAPTURE, capture_size
from rocm_dspark.recipe.catalog import Catalog, GpuSpec, ModelSpec, Profile, parser_facts
from rocm_dspark.recipe.plan import NOT_PAYING, Build, Command, LaunchPlan, Note, Selection, Verdict, flag_for
from rocm_dspark.recipe.secret_env import SECRET_FLAGS, check_value

# The flags layers 8-12 own, and how a user --vllm-arg is read (as vLLM reads it) and guarded against them.
from rocm_dspark.recipe.vllm_args import check_parses, normalise, read, undoes
from rocm_dspark.recipe.vllm_env import check_env


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

    def put(self, dest: str, value: str | None = None) -> None:
        """Set vLLM `dest` by its flag (plan.flag_for)."""
        self.set(flag_for(dest), value)

    def command(self, head: tuple[str, ...]) -> Command:
        return Command(head, self.items)  # rendered once: a value starting with '-' stays glued to its flag


class _State:
    """What the layers build up, in one place (plain attributes: this is on the recipe path)."""

    def __init__(self, catalog: Catalog, sel: Selection):
        self.catalog, self.sel = catalog, sel
        self.notes: list[Note] = []
        self.model: ModelSpec
        self.gpu: GpuSpec
        self.profile: Profile
        self.build: Build
        self.fields: dict = {}
        self.explicit: set[str] = set()
        self.env: dict[str, str] = {}
        self.secret_env: dict[str, str] = {}
        self.extra_args: list[tuple[str, ...]] = []
        self.workaround_args: dict[str, str] = {}  # flag -> the workaround id that adds it
        self.workaround_notes: dict[str, int] = {}  # workaround id -> the index of its note in self.notes
        self.served_name = self.host = ""
        self.port = 0
        self.k = 0
        self.spec: dict = {}
        self.adaptive_allowed = True
        self.cap_size = 0
        self.block_argv: Command = Command(())
        self.adaptive_argv: Command | None = None
        self.memory = None
        self.mono = False

    def note(self, topic: str, text: str, short: str = "") -> None:
        self.notes.append(Note(topic, text, short))


def _plain_json(value) -> str | None:
    """`value` as json.dumps writes it, for the plain values a plan's configs hold (None: not one of those)."""
    if value is True or value is False or value is None:
        return "true" if value else "false" if value is False else "null"
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is str and value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return None


def _compact_json(obj) -> str:
    """json.dumps(obj, separators=(",", ":")). A flat object of plain values (the configs of most plans) is written
    here: importing json costs each `recipe` more than writing three small objects (tests/test_resolve.py holds
    the two equal)."""
    if type(obj) is dict:
        parts = [(_plain_json(k) if type(k) is str else None, _plain_json(v)) for k, v in obj.items()]
        if all(k is not None and v is not None for k, v in parts):
            return "{" + ",".join(f"{k}:{v}" for k, v in parts) + "}"
    import json

    return json.dumps(obj, separators=(",", ":"))


# --- layers ---------------------------------------------------------------------------------------


def model_layer(s: _State) -> None:
    sel, catalog = s.sel, s.catalog
    s.model = model = catalog.find_model(sel.model)
    s.gpu = gpu = catalog.find_gpu(sel.gpu or model.default_gpu)
    if sel.gpu is None or sel.gpu_source == "default":
        s.note(
            "gpu",
            f"no GPU given or detected; using the model's default {gpu.key} ({gpu.name}); pass --gpu to change",
            f"{gpu.key}, the model's default (none given or detected); pass --gpu to change",
        )
    elif sel.gpu_source == "detected":
        s.note("gpu", f"detected {gpu.name} ({gpu.arch}) on this host")
    _check_given(sel)
    s.served_name = sel.served_name or model.serve["served_name"]
    s.host = sel.host or model.serve["host"]
    s.port = sel.port if sel.port is not None else int(model.serve["port"])
    if not 0 < s.port < 65536:
        raise UsageError(f"--port {s.port} is not a TCP port (1-65535)")
    s.env = dict(model.base_env)


# The profile's values the layers read from s.fields; the sizes a selection may replace come first.
_SIZES = ("tp", "dp", "ep", "max_num_seqs", "max_num_batched_tokens", "capture_cap")
_SETTINGS = ("cudagraph_mode", "breakable_cudagraph", "moe_backend", "gpu_memory_utilization", "engram_cpu_offload")


def profile_layer(s: _State) -> None:
    model, gpu, sel = s.model, s.gpu, s.sel
    profile = model.profiles.get(gpu.key)
    if profile is None:
        raise UsageError(
            f"{model.key} has no profile for {gpu.key}; profiles exist for {', '.join(sorted(model.profiles))}"
        )
    s.profile = profile
    s.fields = {name: getattr(profile, name) for name in (*_SIZES, *_SETTINGS)}
    s.fields["adaptive_verification"] = bool(model.speculative["adaptive_verification"])
    for name in _SIZES:
        value = getattr(sel, name)
        if value is not None:
            if value <= 0:
                raise UsageError(f"{flag_for(name)} must be a positive integer, got {value}")
            s.fields[name] = value
            s.explicit.add(name)
    if sel.concurrency is not None and sel.concurrency <= 0:
        raise UsageError(
            f"--concurrency must be a positive integer (expected concurrent requests), got {sel.concurrency}"
        )
    s.env.update(profile.env)
    s.extra_args = list(profile.args)
    # Every status, "verified" included: a public verification is not a run of this plan on this host.
    unrun = not any(gpu.key in b.gpus for b in s.catalog.builds.values())
    no_run = f"; no build in recipes/vllm.yaml has a public run on {gpu.key}" if unrun else ""
    s.note(
        "status",
        f"profile {profile.id} is {profile.status} (as of {profile.status_date}; evidence: "
        f"{', '.join(profile.evidence)}){no_run}; not yet run on MI300-class hardware by rocm-dspark: run "
        f"`rocm-dspark validate` before taking traffic",
        (
            f"{profile.status} ({profile.status_date}), "
            + (f"no public {gpu.key} run of any build" if unrun else "not yet run by rocm-dspark")
            + ": run `rocm-dspark validate` before taking traffic"
        ),
    )


def _pick_build(s: _State):
    """The selected build (--build, or --vllm-version mapped onto a build), else the profile's pin, else the
    arch's first default release the registry holds (rocm_dspark.images.pick)."""
    catalog, sel = s.catalog, s.sel
    if sel.build and sel.vllm_version:
        b, v = catalog.find_build(sel.build), catalog.find_build(sel.vllm_version)
        if b.name != v.name:
            raise UsageError(
                f"--build {sel.build} and --vllm-version {sel.vllm_version} name different builds "
                f"({b.name}, {v.name}); pass one of them"
            )
        return b, "given by --build"
    defaults, why = catalog.default_builds(s.gpu)
    if sel.build:
        return catalog.find_build(sel.build), "given by --build"
    if sel.vllm_version:
        b = catalog.find_build(sel.vllm_version)
        same = [d for d in defaults if d.reported_version == b.reported_version and d.channel == b.channel == "release"]
        return (pick.first_held(same, sel.images)[0] if same else b), f"--vllm-version {sel.vllm_version}"
    if s.profile.vllm_build not in [d.name for d in defaults]:  # the loader fills in the default otherwise
        return catalog.builds[s.profile.vllm_build], f"the profile {s.profile.id} pins it"
    b, skipped = pick.first_held(defaults, sel.images)
    if skipped:
        why += "; " + ", ".join(f"{x.image_tag} is not in the registry" for x in skipped)
    return b, why


def _image_own_build(s: _State, b, why: str):
    """--image REF: the build whose vLLM the image itself reports (the in-image probe's software facts, else the
    version label `rocm-dspark images` read from its config), else the selected one, said to be assumed."""
    sel = s.sel
    assert sel.image is not None  # called for --image only
    ref = pick.on_mirror(sel.image, sel.registry)
    entry = pick.lookup(sel.images, ref) or {}
    facts = sel.image_software or {}
    named = [x for x in s.catalog.builds.values() if x.image_tag == sel.image]
    if facts.get("vllm_version"):
        version, source = facts["vllm_version"], "the in-image probe (rocm_dspark/probe/software.py run in the image)"
    elif entry.get("vllm_version"):
        version, source = entry["vllm_version"], f"`rocm-dspark images` ({entry.get('vllm_source') or 'its config'})"
    elif named and named[0].reported_version:  # the tag of a build recipes/vllm.yaml records
        version, source = named[0].reported_version, f"recipes/vllm.yaml (the tag of build {named[0].name})"
    else:
        s.note(
            "image source",
            f"--image {sel.image}: runs instead of build {b.name}'s image; its own vLLM version is not read on this "
            f"host yet (`rocm-dspark images --image` reads a version label, `up` the in-image probe), so the plan "
            f"assumes {b.name}'s ({b.reported_version or 'not recorded'})",
            f"--image {sel.image}: vLLM assumed {b.name}",
        )
        return b, why
    release = version.split("+", 1)[0]
    try:
        own = s.catalog.find_build(release)
    except UsageError:
        s.note(
            "image source",
            f"--image {sel.image}: runs instead of build {b.name}'s image; {source} says vLLM {version}, which no "
            f"build in recipes/vllm.yaml is, so the plan assumes {b.name}'s facts",
            f"--image {sel.image}: vLLM {version}",
        )
        return b, why
    s.note(
        "image source",
        f"--image {sel.image}: runs instead of the build's image; planned as build {own.name} because {source} says "
        f"the image's vLLM is {version}",
        f"--image {sel.image}: vLLM {version} ({source.split(' (')[0]})",
    )
    return own, f"the image's own vLLM {version}, read by {source}"


def _on_registry(s: _State, b):
    """--image and --registry applied to the build's image: the plan's tag (and a published digest, which is the
    same on a mirror) on the mirror; --image drops the build's published digest (another image)."""
    sel = s.sel
    if not (sel.image or sel.registry):
        return b
    tag = pick.on_mirror(sel.image or b.image_tag, sel.registry)
    if sel.registry:
        s.note(
            "registry",
            f"--registry {sel.registry}: every image maps to the same repository and tag there "
            f"({sel.image or b.image_tag} -> {tag})",
            f"mirror {sel.registry}",
        )
    if sel.image:
        return b._replace(image=tag, image_tag=tag, digest=None)
    return b._replace(image=pick.on_mirror(b.image, sel.registry), image_tag=tag)


def build_layer(s: _State) -> None:
    """The vLLM build: the plan's image, and which upstream changes it contains (recipes/vllm.yaml)."""
    catalog, model = s.catalog, s.model
    b, why = _pick_build(s)
    if s.sel.image:
        b, why = _image_own_build(s, b, why)
    for change in model.requires:
        what = _lacks(catalog, b, change)
        if what:
            raise UsageError(
                f"vLLM build {b.name} {what} {model.key} ({change}: {catalog.changes[change]['title']}); "
                f"pick another with --build ({', '.join(catalog.builds)})"
                + (f" or use the fallback model --model {model.fallback}" if model.fallback else "")
            )
    av = catalog.contains(b, catalog.adaptive_change)
    notes = catalog.adaptive_notes
    replacement = pick.first_held(catalog.default_builds(s.gpu)[0], s.sel.images)[0].name
    b = _on_registry(s, b)
    entry = pick.lookup(s.sel.images, b.image_tag)
    image, image_note = pick.image_for(b, entry, replacement if replacement != b.name else None)
    s.build = b._replace(
        adaptive_on_rocm_v41={True: "native", False: "refused", None: "unknown"}[av],
        adaptive_evidence=notes["native_evidence"] if av else notes["refused_evidence"],
        image=image,
        resolution=dict(entry or {}),
    )
    version = f", reports {b.reported_version}" if b.reported_version else ", reported version not recorded"
    short_why = why.split("; ")[0].split(": ")[0]  # its first clause; the note's text has it whole
    s.note(
        "build",
        f"vLLM build {b.name} ({b.channel}, ROCm {b.rocm or 'not established'}{version}; {b.status}): {why}",
        f"{b.name} (ROCm {b.rocm or 'not established'}): {short_why}",
    )
    unresolved = "unresolved here: `rocm-dspark images` asks the registry; `up` pulls once and runs the digest"
    s.note("image", image_note, "" if entry or b.digest else unresolved)
    gone = pick.retention_note(catalog, b, s.sel.today, replacement)
    if gone:
        s.note("build gone", gone)
    if b.status != "current":
        s.note("build status", f"{b.name} is {b.status}: {b.status_note}")
    s.note("evidence", pick.evidence_note(catalog, s.gpu, b, s.profile, s.model.key))


def workaround_layer(s: _State) -> None:
    for w in s.catalog.workarounds:
        if w.when or not w.applies(s.model.key, s.gpu.key, s.build.reported_version):
            continue  # a `when` workaround waits for the plan's values (capture_layer)
        s.fields.update(w.sets)
        s.extra_args.extend(w.args)
        s.workaround_args.update({a[0]: w.id for a in w.args})
        s.env.update(w.env)
        s.workaround_notes[w.id] = len(s.notes)
        s.note(f"workaround {w.id}", f"{w.reason} Remove when: {w.remove_when}. ({w.evidence})", w.short)


def workload_layer(s: _State) -> None:
    """--concurrency C: the settings public runs tie to it (model `workload`); explicit limits win."""
    c, w, f = s.sel.concurrency, s.model.workload, s.fields
    if c is None:
        return
    if not w:
        s.note("workload", f"{s.model.key} has no concurrency rules in its recipe: --concurrency {c} changes nothing")
        return
    per = w.get("max_num_seqs_per_request")
    if per and "max_num_seqs" not in s.explicit:
        cap = f["capture_cap"] // (1 + s.model.block_size)  # graphs must still cover full verify batches
        mns = min(max(f["max_num_seqs"], per * c), cap)
        if mns != f["max_num_seqs"]:
            f["max_num_seqs"] = mns
            s.note(
                "workload",
                (
                    f"--max-num-seqs {mns}: max(profile {s.profile.max_num_seqs}, {per} x concurrency {c})"
                    + (f", capped at {cap} so capture stays within {f['capture_cap']}" if mns == cap else "")
                    + f" ({w['evidence']})"
                ),
            )
    for rule in w["rules"]:
        applies = (not rule["gpus"] or s.gpu.key in rule["gpus"]) and (not rule["tp"] or f["tp"] in rule["tp"])
        if not applies or c < rule["min_concurrency"]:
            continue
        for key, value in rule["sets"].items():
            if key in s.explicit:
                continue
            if key == "engram_cpu_offload":
                f[key] = {**(f[key] or {}), str(f["tp"]): value}
                shown = f"Engram cpu_offload {str(value).lower()}"
            else:
                f[key] = value
                shown = f"--{key.replace('_', '-')} {value}"
            s.note(
                "workload",
                f"{shown} at TP{f['tp']} concurrency {c} (>= {rule['min_concurrency']}): {rule['why']} ({rule['evidence']})",
            )


def layout_layer(s: _State) -> None:
    """Validate tensor/data/expert parallel sizes against the heads and the nodes."""
    sel, p = s.sel, s.fields
    tp, dp, ep, nodes = p["tp"], p["dp"], p["ep"], sel.nodes
    gpus_per_node = sel.gpus_per_node or s.gpu.gpus_per_node
    heads = s.model.query_heads
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    if tp < 1 or dp < 1 or ep < 1:
        raise UsageError("--tp, --dp and --ep must be positive integers")
    if heads % tp:
        ok = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0 and d <= gpus_per_node)
        raise UsageError(f"--tp {tp} does not divide the {heads} query heads of {s.model.key}; use one of {ok}")
    if tp > gpus_per_node:
        raise UsageError(
            f"--tp {tp} exceeds the {gpus_per_node} GPUs of one node; tensor parallelism stays inside a node, "
            f"use --tp {gpus_per_node} and scale out with --dp"
        )
    if dp % nodes and "dp" not in s.explicit:  # --nodes alone: the layout across nodes is a strategy's to make
        raise UsageError(
            f"--nodes {nodes} needs a layout across the nodes: pass --strategy NAME (e.g. multi_node_dep; "
            f"`rocm-dspark recipe --help` lists them), or --dp with a multiple of {nodes}"
        )
    if dp % nodes:
        raise UsageError(f"--dp {dp} must be a multiple of --nodes {nodes} (each node runs the same number of ranks)")
    if tp * dp // nodes > gpus_per_node:
        raise UsageError(
            f"--tp {tp} x --dp {dp} needs {tp * dp // nodes} GPUs per node but a node has {gpus_per_node}; "
            f"lower --dp or add --nodes"
        )
    if ep not in (1, tp * dp):
        raise UsageError(
            f"--ep {ep} is not possible: vLLM's expert parallel size is tp x dp = {tp * dp} when enabled; "
            f"pass --ep {tp * dp} or --ep 1"
        )
    if nodes > 1 and not sel.head_address:
        raise UsageError("--nodes > 1 needs --head-address (the IP of node 0 that the other nodes reach)")


def _engram_resident(s: _State) -> bool:
    """Whether the Engram tables stay in HBM: the plan's explicit --engram-config where the build takes it;
    otherwise the build's own default (before vllm#57491 ROCm keeps them on the GPU; after it offload defaults on)."""
    offload = (s.fields["engram_cpu_offload"] or {}).get(str(s.fields["tp"]))
    keep, _ = flag_verdict(s.catalog, s.build, "--engram-config")
    if keep and offload is not None:
        return not offload
    rule = s.catalog.flag_rules.get("--engram-config")
    has = all(s.catalog.contains(s.build, c) is True for c in (rule.needs if rule else ()))
    return not has  # unknown counts as resident: the conservative side for a memory check


def _engram_dp_shard(s: _State) -> bool:
    """Whether this build shards resident Engram tables over a node-local DP group: it resolves an
    EngramConfig (the plan passes --engram-config) and its wheel was read to do so (the model's memory layout)."""
    builds = ((s.model.memory or {}).get("layout") or {}).get("engram_dp_shard_builds") or ()
    return s.build.name in builds and flag_verdict(s.catalog, s.build, "--engram-config")[0]


def _user_utilization(sel: Selection) -> float | None:
    """A --vllm-arg --gpu-memory-utilization: what vLLM will run with (the last one wins), so the budget uses it."""
    value = None
    for token in sel.extra_args:
        arg = read(token)
        if arg.flag == "--gpu-memory-utilization" and arg.value is not None:
            try:
                value = float(arg.value)
            except ValueError:
                pass  # vLLM refuses it at start; the budget keeps the plan's value
    return value if value is not None and 0 < value <= 1 else None


def _budget(s: _State, layout, max_num_batched_tokens: int, extra: tuple[str, float] | None = None):
    """The per-rank budget of `layout` for this plan (rocm_dspark/recipe/memory.py rank_budget)."""
    from rocm_dspark.recipe.memory import rank_budget

    return rank_budget(
        s.model,
        s.gpu,
        layout,
        util=_user_utilization(s.sel) or s.fields["gpu_memory_utilization"] or 0.9,
        max_num_batched_tokens=max_num_batched_tokens,
        engram_resident=_engram_resident(s),
        engram_dp_shard=_engram_dp_shard(s),
        extra=extra,
    )


def memory_layer(s: _State) -> None:
    """Per-rank HBM budget from recipe data; refuse a layout that leaves no KV room (with the numbers)."""
    model, f, gpu = s.model, s.fields, s.gpu
    tp = f["tp"]
    if not model.memory:  # no budget data for this model: the weights must at least fit the TP group
        if model.weights_gb >= gpu.hbm_gb * tp:
            raise UsageError(
                f"{model.key} weights ({model.weights_gb:g} GB) do not fit in TP {tp} x {gpu.hbm_gb:g} GB "
                f"HBM ({gpu.hbm_gb * tp:g} GB); use a larger --tp"
            )
        return
    from rocm_dspark.recipe.memory import RankLayout, plan_memory, short_text

    layout = RankLayout(
        tp=tp, dp=f["dp"], nodes=s.sel.nodes, ep=f["ep"] > 1, gpus_per_node=s.sel.gpus_per_node or gpu.gpus_per_node
    )
    budget = _budget(s, layout, f["max_num_batched_tokens"])
    s.memory, text = plan_memory(model, gpu, layout, budget, override=s.sel.memory_override)
    s.note("memory", text, short_text(s.memory, layout))


def speculative_layer(s: _State) -> None:
    sel, model = s.sel, s.model
    block = model.block_size
    if sel.no_speculation:
        asked = {
            "--num-speculative-tokens": sel.num_speculative_tokens,
            "--k-per-batch-size": sel.k_schedule,
            "--benchmark-synthetic": sel.benchmark_synthetic,
        }
        given = [f for f, v in asked.items() if v is not None]
        if given:
            raise UsageError(f"--no-speculation serves without a draft: drop {', '.join(given)}")
        s.k, s.spec, s.adaptive_allowed = 0, {}, False
        s.note("speculation", "OFF (--no-speculation): the target model alone, no DSpark draft")
        return
    k = sel.num_speculative_tokens if sel.num_speculative_tokens is not None else block
    if not 1 <= k <= block:
        raise UsageError(
            f"--num-speculative-tokens {k} is outside 1..{block} (the trained DSpark block of {model.key})"
        )
    s.k = k
    s.spec = {
        "method": model.speculative["method"],
        "num_speculative_tokens": k,
        **model.speculative["config"],
        "enable_adaptive_verification": False,
    }
    if sel.k_schedule:
        _k_schedule(s, k)
    if sel.benchmark_synthetic is not None:
        al = sel.benchmark_synthetic
        if not 1.0 <= al <= k + 1:
            raise UsageError(
                f"--benchmark-synthetic {al} must lie in [1, K+1] = [1, {k + 1}] (acceptance length counts the bonus token)"
            )
        s.spec["rejection_sample_method"] = "synthetic"
        s.spec["synthetic_acceptance_length"] = al
        s.adaptive_allowed = False  # a throughput knob: never gated on, never adaptive
        s.note(
            "synthetic",
            f"rejection_sample_method synthetic with acceptance length {al}: a throughput-benchmark knob that "
            f"fakes acceptance; NOT for serving and never for evals",
            f"synthetic acceptance length {al}: a benchmark knob, NOT for serving or evals",
        )


def _k_schedule(s: _State, k: int) -> None:
    """--k-per-batch-size: vLLM's num_speculative_tokens_per_batch_size, where vLLM would really run it."""
    from rocm_dspark.recipe.k_schedule import format_schedule

    sched, change = s.sel.k_schedule, s.catalog.dynamic_k_change
    assert sched is not None  # called for --k-per-batch-size only
    if s.catalog.contains(s.build, change) is not True:
        releases = [b for b in s.catalog.builds.values() if b.channel == "release" and b.reported_version]
        having = sorted({b.reported_version for b in releases if s.catalog.contains(b, change) is True})
        raise UsageError(
            f"--k-per-batch-size: vLLM build {s.build.name} is not shown to contain "
            f"{_change_words(s.catalog, s.build, change)}; pick a build that does "
            f"(--vllm-version {' or '.join(having) or 'of a build that has it'}) or use one K"
        )
    top = max(e[2] for e in sched)
    if top > k:
        raise UsageError(
            f"--k-per-batch-size asks for K={top}, more than --num-speculative-tokens {k} (vLLM would "
            f"clamp it); use K <= {k} or pass -k {top}"
        )
    if s.fields["dp"] > 1:
        raise UsageError(
            "--k-per-batch-size with data parallel: vLLM drops the schedule when data_parallel_size > 1 "
            "(ranks could pick different K and deadlock; vllm/config/vllm.py); use one K"
        )
    mode = s.fields.get("cudagraph_mode")
    if mode and "FULL" in str(mode):
        raise UsageError(
            f"--k-per-batch-size on {s.gpu.key}: vLLM turns cudagraph_mode {mode} into PIECEWISE for a "
            "per-batch-size K (vllm/config/vllm.py _maybe_override_dynamic_sd_cudagraph_mode), which this "
            "GPU's workaround avoids (see the plan's notes); use one K"
        )
    s.spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in sched]
    s.adaptive_allowed = False
    s.note(
        "per-batch-size K",
        f"num_speculative_tokens_per_batch_size {format_schedule(sched)} (--k-per-batch-size), block verification: "
        f"each batch size runs its fixed K; adaptive verification is not combined with it; not yet run with DSpark "
        f"on MI300-class hardware",
    )


def capture_layer(s: _State) -> None:
    mns, mnbt, cap = s.fields["max_num_seqs"], s.fields["max_num_batched_tokens"], s.fields["capture_cap"]
    tokens = mns * (1 + s.k)
    needed = max(MIN_CAPTURE, 1 << max(tokens - 1, 0).bit_length())  # the power of two capture_size() picks
    overrun = "capture_cap" in s.explicit and needed > cap >= MIN_CAPTURE
    # An explicit --capture-cap below that is the operator's choice (graph memory), one rule for every N: capture
    # up to the largest power of two <= N (kept as given on vLLM's grid) and say which steps leave the graphs.
    s.cap_size = cap_size = 1 << (cap.bit_length() - 1) if overrun else capture_size(mns, s.k, cap)
    if mnbt < cap_size:
        raise UsageError(
            f"max_num_batched_tokens {mnbt} is below the capture size {cap_size}; use --max-num-batched-tokens "
            f"{cap_size} or more, or a smaller --max-num-seqs"
        )
    if overrun:
        s.note(
            "capture overrun",
            f"--max-cudagraph-capture-size {cap_size} (--capture-cap {cap}) < max_num_seqs {mns} x (1+K={1 + s.k}) "
            f"= {tokens}: bigger verify batches run without a full graph; `rocm-dspark plan --capture-size "
            f"{cap_size}` prices them",
            f"capture size {cap_size} < max_num_seqs {mns} x (1+K={1 + s.k}) = {tokens}: bigger verify batches run "
            f"without a full graph",
        )
    else:
        s.note(
            "capture",
            f"--max-cudagraph-capture-size {cap_size}: max_num_seqs {mns} x (1+K={1 + s.k}) = {tokens} "
            f"rounded up to a power of two (vLLM's own ROCm default stops at 512, so full verify batches "
            f"above it would run eager)",
            f"--max-cudagraph-capture-size {cap_size}: max_num_seqs {mns} x (1+K={1 + s.k}) = {tokens}, "
            f"rounded up to a power of two",
        )
    _when_workarounds(s)


def _when_workarounds(s: _State) -> None:
    """recipes/workarounds.yaml `when`: conditions on the plan's own values (each note once)."""
    mnbt = s.fields["max_num_batched_tokens"]
    for w in s.catalog.workarounds:
        below = w.when.get("max_num_batched_tokens_below")
        topic = f"workaround {w.id}"
        if (
            below is not None
            and mnbt < below
            and w.applies(s.model.key, s.gpu.key, s.build.reported_version)
            and not any(n.topic == topic for n in s.notes)
        ):
            s.note(topic, f"{w.reason} Remove when: {w.remove_when}. ({w.evidence})", w.short)


def mono_layer(s: _State) -> None:
    """--monokernel where the build has it, the layout is the kernels' and a decode step of --concurrency
    requests fits their rows (recipes/vllm.yaml mono_decode); otherwise one note saying why not."""
    from rocm_dspark.recipe.mono import decide

    m, f = s.catalog.mono, s.fields
    d = decide(
        m,
        model=s.model.key,
        gpu=s.gpu,
        build=s.build.name,
        has_change=s.catalog.contains(s.build, m["change"]) if m else None,
        tp=f["tp"],
        dp=f["dp"],
        ep=f["ep"],
        nodes=s.sel.nodes,
        k=s.k,
        concurrency=s.sel.concurrency,
        capture_size=s.cap_size,
        k_schedule=bool(s.sel.k_schedule),
        env_keys=tuple(k for k, _ in s.sel.extra_env),
    )
    if d is None:
        return
    on, why, short, src = d.on, d.why, d.short, m["sources"]
    if on and s.gpu.arch == "gfx942" and s.model.memory:
        on, why, short = _mono_copies(s, why, short)
    if not on:
        s.note("mono decode", f"{why} ({src['archs']}; {src['rows']})", short)
        return
    s.mono = True
    was = (f["cudagraph_mode"], f["breakable_cudagraph"])
    f["cudagraph_mode"], f["breakable_cudagraph"] = m["cudagraph_mode"], False
    graphs = "" if was == (m["cudagraph_mode"], False) else f", {m['cudagraph_mode']}, breakable graphs off"
    s.note(
        "mono decode",
        f"{why}; {m['cudagraph_mode']} with breakable graphs off (a PIECEWISE step falls back); --kv-cache-dtype "
        f"{m['kv_cache_dtype']} for the whole layer (else only the FFN launch runs); bigger and mixed steps run "
        f"vLLM's path{'' if s.gpu.arch == 'gfx942' else '; ' + src['indexer']}; not yet run on MI300-class "
        f"hardware by rocm-dspark ({src['cudagraph_mode']}; "
        f"{src['kv_cache_dtype']}; {src['tensor_parallel_only']}; {src['moe_backend']})",
        f"{short}{graphs}, {m['kv_cache_dtype']} KV",
    )


def _mono_copies(s: _State, why: str, short: str) -> tuple[bool, str, str]:
    """gfx942: the kernels' own weight copies count as model memory (vllm 0.33.0 mono_decode.py:215-231). Keep
    mono only where KV room stays above the memory model's error, lowering --max-num-batched-tokens (powers of
    two down to the capture size, unless given) to make room; otherwise say why it is off."""
    from rocm_dspark.recipe.memory import RankLayout, expert_share, plan_memory, short_text

    f, model, frac = s.fields, s.model, s.catalog.mono["gfx942_copy_fraction"]
    share = expert_share(model) or 0.0
    per_rank = model.memory["sharded_weights_gib"] / f["tp"]
    extra = ("mono gfx942 weight copies", per_rank * (share * frac["experts"] + (1 - share) * frac["dense"]))
    layout = RankLayout(tp=f["tp"], gpus_per_node=s.sel.gpus_per_node or s.gpu.gpus_per_node)
    mnbt, sizes = f["max_num_batched_tokens"], [f["max_num_batched_tokens"]]
    if "max_num_batched_tokens" not in s.explicit:
        sizes += [1 << b for b in range(mnbt.bit_length() - 1, 0, -1) if s.cap_size <= 1 << b < mnbt]
    for size in sizes:
        b = _budget(s, layout, size, extra)
        if b.kv > b.error:
            break
    else:  # b is the smallest size tried
        head = f"gfx942 weight copies ({extra[1]:.1f} GiB per rank) leave KV {b.kv:.1f} GiB (+-{b.error:g})"
        return False, f"mono decode off: its {head} at --max-num-batched-tokens {size}: {b.text}", f"off: {head}"
    mem, text = plan_memory(model, s.gpu, layout, b, override=s.sel.memory_override)
    s.memory = mem
    i = next(i for i, n in enumerate(s.notes) if n.topic == "memory")
    s.notes[i] = Note(
        "memory",
        text,
        short_text(mem, layout).split(":")[0] + f" after {extra[1]:.1f} GiB of "
        f"mono weight copies: {mem.kv_multiples:g} x max_model_len",
    )
    if size != mnbt:
        f["max_num_batched_tokens"] = size
        s.note(
            "mono batch tokens",
            f"--max-num-batched-tokens {size} (from {mnbt}): the gfx942 mono weight copies ({extra[1]:.1f} GiB per "
            f"rank) leave KV room above the model's error only with smaller prefill chunks, so long prompts take "
            f"more steps to prefill; pass --max-num-batched-tokens to choose",
        )
        _when_workarounds(s)
    return True, why, short


def _check_given(sel: Selection) -> None:
    """An empty value (an unset shell variable) must not fall back to the default checkpoint or name."""
    given = {"--model-path": sel.model_path, "--served-model-name": sel.served_name, "--host": sel.host}
    for flag, value in given.items():
        if value is None:
            continue
        if not value.strip():
            raise UsageError(f"{flag} is empty (an unset shell variable?); give a value or leave the option out")
        if flag == "--served-model-name" and not value.isprintable():  # clients, logs and Description= read one line
            raise UsageError(f"{flag} {value!r} holds a control character (a newline, a tab); give it without")
    if sel.host is not None:
        from rocm_dspark.recipe.strategies import check_address

        check_address(sel.host, "--host")
    if sel.model_path is not None and sel.model_path.startswith("-"):  # the positional model of `vllm serve`
        raise UsageError(
            f"--model-path {sel.model_path!r} starts with '-', which vLLM would read as a flag; "
            f"write ./{sel.model_path}"
        )


def command_layer(s: _State) -> _Args:
    """Every flag the layers decided, in a stable order (the speculative config is filled per command)."""
    sel, f, model = s.sel, s.fields, s.model
    args = _Args()
    args.put("served_model_name", s.served_name)
    args.put("host", s.host)
    args.put("port", str(s.port))
    for item in model.base_args:
        args.set(*item)
    args.put("tensor_parallel_size", str(f["tp"]))
    if f["dp"] > 1:
        args.put("data_parallel_size", str(f["dp"]))
        if sel.nodes > 1:
            args.put("data_parallel_size_local", str(f["dp"] // sel.nodes))
            args.put("data_parallel_address", sel.head_address)
            s.note(
                "multi-node",
                f"this is node 0's command; on node r (1..{sel.nodes - 1}) run the same with --headless "
                f"--data-parallel-start-rank r*{f['dp'] // sel.nodes}",
                f"node 0's command; node r (1..{sel.nodes - 1}) adds --headless --data-parallel-start-rank "
                f"r*{f['dp'] // sel.nodes}",
            )
    if f["ep"] > 1:
        args.put("enable_expert_parallel")
    if f["moe_backend"]:
        args.put("moe_backend", f["moe_backend"])
    if s.mono:  # mono_layer: the flag and the KV record the whole layer needs
        args.put("kv_cache_dtype", s.catalog.mono["kv_cache_dtype"])
        args.put("monokernel")
    if f["gpu_memory_utilization"] is not None:
        args.put("gpu_memory_utilization", f"{f['gpu_memory_utilization']:g}")
    if f["cudagraph_mode"]:
        args.put("compilation_config", _compact_json({"cudagraph_mode": f["cudagraph_mode"]}))
    if f["breakable_cudagraph"] is not None:
        s.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1" if f["breakable_cudagraph"] else "0"
    engram = f["engram_cpu_offload"]
    if engram is not None:
        offload = engram.get(str(f["tp"]))
        if offload is None:
            raise UsageError(
                f"profile {s.profile.id} sets Engram offload only for TP {', '.join(sorted(engram))}; "
                f"pick one of those with --tp"
            )
        args.put("engram_config", _compact_json({"cpu_offload": offload}))
    for item in s.extra_args:
        args.set(*item)
    flag_rules_layer(s, args)
    args.put("speculative_config", "")  # placeholder: filled per command below
    args.put("max_num_seqs", str(f["max_num_seqs"]))
    args.put("max_num_batched_tokens", str(f["max_num_batched_tokens"]))
    args.put("max_cudagraph_capture_size", str(s.cap_size))
    return args


def _lacks(catalog, build, change: str) -> str | None:
    """How `build` misses `change` ("lacks", or "is not shown to contain" where vllm.yaml does not say); None if not."""
    has = catalog.contains(build, change)
    return None if has is True else "lacks" if has is False else "is not shown to contain"


def _change_words(catalog, build, change: str) -> str:
    fact = build.facts.get(change) or {}
    how = f", by {fact['how']}: {fact['source']}" if fact.get("how") else ", not established for this build"
    return f"{change} ({catalog.changes[change]['title']}{how})"


def flag_verdict(catalog, build, flag: str) -> tuple[bool, str]:
    """(keep, why) for one flag on one build, from recipes/vllm.yaml `flags`; flags with no rule are kept."""
    rule = catalog.flag_rules.get(flag)
    if rule is None:
        return True, ""
    for change in rule.needs:
        what = _lacks(catalog, build, change)
        if what:
            return (
                False,
                f"{flag} left out: build {build.name} {what} {_change_words(catalog, build, change)}; {rule.reason}",
            )
    for change in rule.unnecessary_with:
        if catalog.contains(build, change) is True:
            return False, (
                f"{flag} left out: not needed on build {build.name}, which contains "
                f"{_change_words(catalog, build, change)}; {rule.reason}"
            )
    return True, ""


def flag_rules_layer(s: _State, args: _Args) -> None:
    """Emit only the flags the build accepts and needs; say which were dropped and why."""
    kept = []
    for flag, value in args.items:
        keep, why = flag_verdict(s.catalog, s.build, flag)
        if keep:
            kept.append((flag, value))
        else:
            wid = s.workaround_args.get(flag)
            if wid:  # the workaround's flag is gone: its note (found by reference, not by wording) says why, once
                i = s.workaround_notes[wid]
                n = s.notes[i]
                s.notes[i] = n._replace(
                    text=f"not applied: {why}. " + n.text,
                    short=f"not applied: {s.build.name} has the fix ({flag} left out)",
                )
            else:
                s.note("build flags", why, why.split(" (")[0])
            if flag == "--engram-config":
                s.fields["engram_cpu_offload"] = None  # the build's own Engram placement applies
    args.items = kept


def check_user_args(catalog, build, tokens) -> None:
    """A --vllm-arg that the build cannot parse is an error naming the build: against its release's own parser
    (recipes/vllm_parsers.yaml; a nightly has none) and the flags with a rule in recipes/vllm.yaml."""
    facts = parser_facts(build.reported_version) if tokens and build.channel == "release" else None
    for token in tokens:
        if facts is not None:
            check_parses(normalise(token), facts, build.name)  # the plan-owned guard speaks first
        flag = read(token).flag.partition(".")[0]  # `--engram_config`, dotted keys: the flag vLLM reads
        rule = catalog.flag_rules.get(flag)
        if rule is None:
            continue
        for change in rule.needs:
            if catalog.contains(build, change) is not True:
                raise UsageError(
                    f"--vllm-arg {flag}: vLLM build {build.name} cannot parse it (needs "
                    f"{_change_words(catalog, build, change)}); drop it or pick another --build"
                )


def _merge_compilation_config(args: _Args, flag: str, value: str | None) -> None:
    """Merge a user --compilation-config into the plan's: vLLM keeps only the last copy (and folds dotted keys
    into a last copy), so passing it through would silently drop the plan's cudagraph_mode workaround."""
    if flag != "--compilation-config" or value is None:
        raise UsageError(
            f"--vllm-arg {flag}: give the compilation config as one JSON object, --compilation-config='{{...}}'; "
            f"rocm-dspark merges it with the plan's (a dotted key or a bare flag would replace the plan's whole config)"
        )
    import json

    user = json.loads(value)  # normalise() has checked that it is a JSON object
    current = next((v for f, v in args.items if f == "--compilation-config"), None)
    planned = json.loads(current) if current else {}
    clash = sorted(k for k in user if k.replace("-", "_") in planned)
    if clash:
        raise UsageError(
            f"--vllm-arg --compilation-config sets {', '.join(clash)}, which the plan decides for this GPU "
            f"(see the plan's workaround notes); leave that key out"
        )
    args.set("--compilation-config", _compact_json({**planned, **user}))


def override_layer(s: _State, args: _Args) -> None:
    check_user_args(s.catalog, s.build, s.sel.extra_args)
    planned = {f: v for f, v in args.items if f in s.workaround_args}  # the workaround flags the build kept
    for token in s.sel.extra_args:
        arg = normalise(token)  # refuses anything that reaches a plan-owned setting, by any spelling vLLM reads
        flag, value = arg
        if flag.replace("_", "-") in SECRET_FLAGS:  # argv is world-readable (ps, /proc) and vLLM logs its args
            name = SECRET_FLAGS[flag.replace("_", "-")]
            raise UsageError(
                f"--vllm-arg {flag}: a secret on the command line is readable by every user of the host "
                f"and logged by vLLM; pass --env {name} (vLLM reads it from there) and it reaches "
                f"vLLM only through the 0600 env file"
            )
        undone = undoes(arg, planned)
        if undone:
            raise UsageError(
                f"--vllm-arg {token} undoes {undone}, which workaround {s.workaround_args[undone]} adds "
                f"on this GPU and build (see the plan's notes); drop it"
            )
        if flag.startswith("--compilation-config"):
            _merge_compilation_config(args, flag, value)
        else:
            args.set(flag, value)
        s.note("override", f"{token} (given by --vllm-arg)")
    planned_env = dict(s.env)  # every occurrence checked against the plan's value (the last one reaches vLLM)
    for key, value in s.sel.extra_env:
        check_env(key, value, planned_env)
        # Every --env value is the operator's and may be a secret: the plan keeps its name, the value goes only
        # to the 0600 env file (rocm_dspark/recipe/secret_env.py); a planned key it repeats or overrides moves there too.
        s.env.pop(key, None)
        s.secret_env[key] = check_value(key, value)
        s.note("override", f"env {key} (given by --env; its value reaches vLLM only through the env file)")
    target = s.sel.model_path or s.model.hf_id

    def with_spec(adaptive: bool) -> Command:
        if not s.spec:  # --no-speculation
            args.items = [(f, v) for f, v in args.items if f != "--speculative-config"]
        else:
            args.set("--speculative-config", _compact_json(dict(s.spec, enable_adaptive_verification=adaptive)))
        return args.command(("vllm", "serve", target))

    s.block_argv = with_spec(False)
    s.adaptive_argv = with_spec(True) if s.adaptive_allowed else None


LAYERS = (
    model_layer,
    profile_layer,
    build_layer,
    workaround_layer,
    workload_layer,
    layout_layer,
    memory_layer,
    speculative_layer,
    capture_layer,
    mono_layer,
)


def resolve_plan(catalog: Catalog, sel: Selection) -> LaunchPlan:
    """Layers 1-10: the plan with both commands and block verification running (no verdict yet)."""
    s = _State(catalog, sel)
    for layer in LAYERS:
        layer(s)
    override_layer(s, command_layer(s))
    f, b = s.fields, s.build
    plan = LaunchPlan(
        model_id=s.block_argv[2],
        model_key=s.model.key,
        served_name=s.served_name,
        gpu=s.gpu.key,
        arch=s.gpu.arch,
        profile=s.profile.id,
        status=s.profile.status,
        status_date=s.profile.status_date,
        evidence=s.profile.evidence,
        vllm_version=b.reported_version or b.name,
        image=b.image,
        host=s.host,
        port=s.port,
        argv=s.block_argv,
        env=s.env,
        speculative_config=dict(s.spec, enable_adaptive_verification=False) if s.spec else {},
        adaptive_verification=False,
        block_argv=s.block_argv,
        notes=tuple(s.notes),
        adaptive_argv=s.adaptive_argv,
        build=b,
        tp=f["tp"],
        dp=f["dp"],
        ep=f["ep"],
        nodes=sel.nodes,
        dp_local=f["dp"] // sel.nodes,
        max_num_seqs=f["max_num_seqs"],
        max_num_batched_tokens=f["max_num_batched_tokens"],
        capture_size=s.cap_size,
        k=s.k,
        concurrency=sel.concurrency,
        memory=s.memory,
        model_path=sel.model_path,
        secret_env=s.secret_env,
    )
    if f["adaptive_verification"] and s.adaptive_allowed:
        # The model's recipe turns it on here and no workaround turned it off: no gate needed.
        return _switch(plan, True, "ON: the recipe's default for this GPU")
    return plan


def _switch(plan: LaunchPlan, adaptive: bool, text: str, short: str = "") -> LaunchPlan:
    """The plan running adaptive (or block) verification, with the note that says why."""
    argv = plan.adaptive_argv if adaptive else plan.block_argv
    assert argv is not None  # resolve sets block_argv always, adaptive_argv wherever adaptive may be switched on
    return plan._replace(
        argv=argv,
        adaptive_verification=adaptive,
        notes=(*plan.notes, Note("adaptive verification", text, short)),
        speculative_config=dict(plan.speculative_config, enable_adaptive_verification=adaptive),
    )


def apply_verdict(plan: LaunchPlan, verdict: Verdict | None) -> LaunchPlan:
    """Layer 11, last: adaptive verification on only when the gate proved it on this host."""
    verdict = verdict or Verdict.not_proven()
    if plan.adaptive_verification or plan.adaptive_argv is None:
        return plan  # already on by the recipe's default, or not allowed (synthetic benchmark)
    if verdict.adaptive_proven:
        return _switch(
            plan,
            True,
            f"ON: the probe proved it on this host ({verdict.reason}; record {verdict.record})",
            f"ON: proven on this host (record {verdict.record})",
        )
    if verdict.outcome == NOT_PAYING:  # the gate's payoff half kept it off (probe/payoff.py)
        return _switch(
            plan, False, f"OFF: full {plan.k}-token block verification. Adaptive verification is {verdict.reason}"
        )
    b = plan.build
    assert b is not None  # resolve sets it
    label = b.name if not b.reported_version or b.reported_version in b.name else f"{b.name} = {b.reported_version}"
    why = {
        "refused": f"vLLM {label} refuses it for V4.1 on ROCm ({b.adaptive_evidence})",
        "native": f"vLLM {label} supports it natively ({b.adaptive_evidence}), but it has not been proven on this host",
    }.get(b.adaptive_on_rocm_v41, f"whether vLLM {label} accepts it for V4.1 on ROCm is not established")
    short = {
        "refused": f"{b.name} refuses it for V4.1 on ROCm",  # within render.NOTE_WIDTH for every build name
        "native": f"{b.name} has it; prove it: `rocm-dspark probe`",
    }.get(b.adaptive_on_rocm_v41, f"{b.name} may lack it; see `rocm-dspark probe`")
    return _switch(
        plan,
        False,
        f"OFF: full {plan.k}-token block verification. {why}; gate: {verdict.reason}. Run `rocm-dspark probe` "
        f"on this host to prove it",
        f"OFF ({plan.k}-token blocks): {short}",
    )


def resolve(catalog: Catalog, sel: Selection, verdict: Verdict | None = None) -> LaunchPlan:
    """The whole resolution: layers 1-10, then the verdict."""
    return apply_verdict(resolve_plan(catalog, sel), verdict)
