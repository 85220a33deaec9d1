"""Load and validate recipes/ into typed objects.

Facts live in YAML (models, GPUs, per-(model, GPU) profiles, workarounds, the vLLM capability table);
this module only checks their shape. A broken file fails with one line: file, key, problem.
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

import operator
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import yaml

from rocm_dspark.errors import UsageError, did_you_mean

RECIPES_ENV = "ROCM_DSPARK_RECIPES"
STATUSES = ("verified", "experimental", "unverified")
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


class CatalogError(UsageError):
    """A recipes/ file is malformed: the message names the file, the key and the problem."""


def recipes_dir() -> Path:
    """The packaged recipes/ (a symlink to the top-level folder in a checkout), or $ROCM_DSPARK_RECIPES."""
    env = os.environ.get(RECIPES_ENV)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for candidate in (here / "recipes", here.parent / "recipes"):
        if candidate.is_dir():
            return candidate
    raise CatalogError(f"cannot find the recipes/ folder next to {here}; set {RECIPES_ENV} to its path")


# --- versions -------------------------------------------------------------------------------------

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_COMPARE = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


def release_tuple(version: str) -> tuple[int, int, int]:
    """'0.33.0rc1+rocm' -> (0, 33, 0). Pre-release/dev/local parts are ignored on purpose: a 0.33 rc
    already carries the 0.33 code we care about, and nightlies are looked up by tag in `builds`."""
    m = _RELEASE.match(str(version))
    if not m:
        raise UsageError(f"vLLM version {version!r} is not a version number; pass e.g. --vllm-version 0.32.0")
    parts = [int(p) for p in m.group(1).split(".")][:3]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def version_in_range(version: str, spec: str) -> bool:
    """`spec` is a comma-separated list of comparisons, e.g. '>=0.30.0,<0.33.0'."""
    v = release_tuple(version)
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        m = re.match(r"^(>=|<=|==|!=|>|<)\s*(.+)$", clause)
        if not m:
            raise ValueError(f"bad version clause {clause!r}")
        if not _COMPARE[m.group(1)](v, release_tuple(m.group(2))):
            return False
    return True


# --- typed records --------------------------------------------------------------------------------


class GpuSpec(NamedTuple):
    key: str
    name: str
    arch: str
    family: str
    compute_units: int
    hbm_gb: float
    hbm_bandwidth_tbps: float
    peak_bf16_tflops: float
    peak_fp8_tflops: float
    peak_fp4_tflops: float | None
    fp8_format: str
    native_fp4: bool
    gpus_per_node: int
    tdp_w: float
    marketing_names: tuple[str, ...]
    sources: tuple[str, ...]


class Profile(NamedTuple):
    model: str
    gpu: str
    status: str
    status_date: str
    evidence: tuple[str, ...]
    image: str  # the default build's image (filled at load: builds own images)
    image_tag: str  # the default build's repo:tag
    vllm_build: str | None  # the build the profile pins (`build:`), else the GPU's default build
    vllm_version: str | None  # that build's reported version
    tp: int
    dp: int
    ep: int
    max_num_seqs: int
    max_num_batched_tokens: int
    capture_cap: int
    cudagraph_mode: str | None
    breakable_cudagraph: bool | None
    moe_backend: str | None
    gpu_memory_utilization: float | None
    engram_cpu_offload: dict | None
    args: tuple[tuple[str, ...], ...]
    env: dict

    @property
    def id(self) -> str:
        return f"{self.model}/{self.gpu}"


class ModelSpec(NamedTuple):
    key: str
    hf_id: str
    revision: str | None
    aliases: tuple[str, ...]
    fallback: str | None
    default_gpu: str
    architecture: dict
    weights_gb: float
    params: dict
    speculative: dict
    serve: dict
    base_args: tuple[tuple[str, ...], ...]
    base_env: dict
    validation: dict
    profiles: dict  # gpu key -> Profile
    requires: tuple[str, ...] = ()  # upstream changes (recipes/vllm.yaml `changes`) a build must contain
    workload: dict = {}  # --concurrency rules: max_num_seqs_per_request, evidence, rules
    memory: dict = {}  # per-rank budget parameters (see the model file); {} = weights check only

    @property
    def block_size(self) -> int:
        return int(self.speculative["block_size"])

    @property
    def query_heads(self) -> int:
        return int(self.architecture["query_heads"])


class Workaround(NamedTuple):
    id: str
    models: tuple[str, ...]
    gpus: tuple[str, ...]
    vllm: str | None
    sets: dict
    args: tuple[tuple[str, ...], ...]
    env: dict
    reason: str
    evidence: str
    remove_when: str
    short: str = ""  # what it does and why in a few words: the default output's note
    when: dict = {}  # conditions on the plan's own values, e.g. {"max_num_batched_tokens_below": 6144}

    def applies(self, model: str, gpu: str, vllm_version: str | None) -> bool:
        if self.models and model not in self.models:
            return False
        if self.gpus and gpu not in self.gpus:
            return False
        return not self.vllm or vllm_version is None or version_in_range(vllm_version, self.vllm)


class FlagRule(NamedTuple):
    """What a vLLM flag needs from a build: every change in `needs`; it is dropped where any change in
    `unnecessary_with` is in (the build does it by itself)."""

    flag: str
    needs: tuple[str, ...]
    unnecessary_with: tuple[str, ...]
    reason: str
    evidence: str


class Capability(NamedTuple):
    versions: str
    supports_v41: bool
    refuses_adaptive_on_rocm_v41: bool
    native_adaptive_on_rocm_v41: bool
    note: str
    evidence: str
    backport: dict | None = None  # what the plugin patches on this release (vllm_plugin/patch.py); None: nothing


class Catalog(NamedTuple):
    root: Path
    gpus: dict
    models: dict
    workarounds: tuple[Workaround, ...]
    capabilities: tuple[Capability, ...]
    builds: dict = {}  # name -> plan.Build
    changes: dict = {}  # "vllm#NNNNN" -> {title, url}
    flag_rules: dict = {}  # "--flag" -> FlagRule
    adaptive_change: str = ""  # the change that makes a build accept adaptive verification for V4.1 on ROCm
    adaptive_notes: dict = {}  # refused_note, refused_evidence, native_evidence
    dynamic_k_change: str = ""  # the change that gives vLLM a per-batch-size K (--k-per-batch-size)
    channels: dict = {}  # channel -> {retention_builds, retention_days, source}
    arch_defaults: dict = {}  # gfx arch -> {builds: (release names, in order), reason, source}
    mono: dict = {}  # vllm.yaml mono_decode: the --monokernel conditions (rocm_dspark/recipe/mono.py)

    def find_model(self, name: str) -> ModelSpec:
        wanted = name.strip().lower()
        for model in self.models.values():
            names = {model.key.lower(), model.hf_id.lower(), *(a.lower() for a in model.aliases)}
            if wanted in names:
                return model
        known = ", ".join(f"{m.key} ({', '.join(m.aliases[:2])})" for m in self.models.values())
        every = [n for m in self.models.values() for n in (m.key, m.hf_id, *m.aliases)]
        raise UsageError(f"unknown model {name!r}{did_you_mean(name, every)}; known models: {known}")

    def find_gpu(self, name: str) -> GpuSpec:
        key = name.strip().lower()
        if key in self.gpus:
            return self.gpus[key]
        raise UsageError(
            f"unknown GPU {name!r}{did_you_mean(name, self.gpus)}; known GPUs: {', '.join(sorted(self.gpus))}"
        )

    def vllm_version_of(self, build_or_version: str) -> str:
        """A build name (e.g. nightly-3df4ae15) -> the version it reports (or its name when none is
        recorded); anything else -> itself. A label only: never a feature test."""
        build = self.builds.get(build_or_version)
        return (build.reported_version or build.name) if build else build_or_version

    # --- builds -----------------------------------------------------------------------------------

    def find_build(self, name: str):
        """A build by name, or by the release it is (0.33.0, v0.33.0); one line listing the known ones otherwise."""
        key = name.strip()
        if key in self.builds:
            return self.builds[key]
        for b in self.builds.values():
            if b.channel == "release" and key.lstrip("v") == b.reported_version:
                return b
        known = ", ".join(self.builds)
        raise UsageError(
            f"unknown vLLM build {name!r}{did_you_mean(name, self.builds)}; known builds: {known} "
            f"(releases also by number, e.g. 0.33.0)"
        )

    def default_builds(self, gpu: GpuSpec) -> tuple:
        """The releases this GPU's arch runs by default, in order (the first the registry holds wins), and why."""
        d = self.arch_defaults.get(gpu.arch)
        if not d:
            raise UsageError(
                f"recipes/vllm.yaml names no default build for {gpu.arch} ({gpu.key}); pass --build "
                f"(known: {', '.join(self.builds)})"
            )
        return tuple(self.builds[n] for n in d["builds"]), f"the {gpu.arch} default: {d['reason']} ({d['source']})"

    def default_build(self, gpu: GpuSpec):
        """(build, why): the arch's first default release (before any registry answer)."""
        builds, why = self.default_builds(gpu)
        return builds[0], why

    def evidence_builds(self, gpu: GpuSpec) -> list:
        """Builds with public V4.1 evidence on this GPU, newest first."""
        return sorted((b for b in self.builds.values() if gpu.key in b.gpus), key=lambda b: b.date, reverse=True)

    def contains(self, build, change: str) -> bool | None:
        """True/False where recipes/vllm.yaml establishes it for this build, None where nothing does."""
        fact = build.facts.get(change)
        return None if fact is None else fact.get("in")

    def vllm_capability(self, version: str) -> Capability:
        version = self.vllm_version_of(version)
        for cap in self.capabilities:
            if version_in_range(version, cap.versions):
                return cap
        raise UsageError(f"vLLM version {version!r} matches no range in recipes/vllm.yaml")


# --- validation helpers ---------------------------------------------------------------------------


class _Reader:
    """Typed access to a mapping that reports `file: key.path: problem` on any mismatch."""

    def __init__(self, path: Path, data, where: str = ""):
        self.path, self.data, self.where = path, data, where
        self.seen: set = set()
        if not isinstance(data, dict):
            self.fail(f"expected a mapping, got {type(data).__name__}")

    def close(self, *also: str) -> None:
        """Refuse keys nobody read (a typo such as `max_num_seq` would otherwise be silently ignored)."""
        unknown = [k for k in self.data if k not in self.seen and k not in also]
        if unknown:
            known = ", ".join(sorted(str(k) for k in (self.seen | set(also))))
            self.fail(f"unknown key (known: {known})", str(unknown[0]))

    def number(
        self,
        key: str,
        *,
        optional: bool = False,
        minimum: float = 0.0,
        strict: bool = True,
        maximum: float | None = None,
    ):
        """A finite number > minimum (>= when not strict), <= maximum; None when optional and absent."""
        value = self.req(key, (int, float), optional=optional)
        if value is None:
            return None
        if isinstance(value, bool) or value != value or value in (float("inf"), float("-inf")):
            self.fail(f"expected a finite number, got {value!r}", key)
        low_ok = value > minimum if strict else value >= minimum
        if not low_ok or (maximum is not None and value > maximum):
            rel = ">" if strict else ">="
            high = f" and <= {maximum:g}" if maximum is not None else ""
            self.fail(f"expected a number {rel} {minimum:g}{high}, got {value!r}", key)
        return float(value)

    def fail(self, problem: str, key: str | None = None):
        loc = ".".join(p for p in (self.where, key) if p) or "(top level)"
        raise CatalogError(f"{self.path}: {loc}: {problem}")

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.path, self.req(key, dict), f"{self.where}.{key}" if self.where else key)

    def req(self, key: str, kind, *, optional: bool = False, default=None):
        self.seen.add(key)
        if key not in self.data:
            if optional:
                return default
            self.fail("missing key", key)
        value = self.data[key]
        if value is None and optional:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is float and isinstance(value, float) and (value != value or abs(value) == float("inf")):
            self.fail(f"expected a finite number, got {value!r}", key)
        if kind is int and isinstance(value, bool):
            self.fail(f"expected an integer, got {value!r}", key)
        if not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            self.fail(f"expected {want}, got {value!r}", key)
        return value

    def choice(self, key: str, choices, *, optional: bool = False, where: str = ""):
        """A string that is one of `choices` (None when optional and absent)."""
        value = self.req(key, str, optional=optional)
        if value is not None and value not in choices:
            self.fail(f"expected one of {', '.join(choices)}{where}, got {value!r}", key)
        return value

    def positive_int(self, key: str) -> int:
        value = self.req(key, int)
        if value <= 0:
            self.fail(f"expected a positive integer, got {value!r}", key)
        return value

    def str_list(self, key: str, *, optional: bool = False) -> tuple[str, ...]:
        value = self.req(key, list, optional=optional, default=[])
        if not all(isinstance(v, str) for v in value):
            self.fail("expected a list of strings", key)
        return tuple(value)

    def arg_list(self, key: str) -> tuple[tuple[str, ...], ...]:
        """args are lists of [flag] or [flag, value]; values are strings so YAML cannot reformat them."""
        value = self.req(key, list, optional=True, default=[])
        out = []
        for i, item in enumerate(value):
            if (
                not isinstance(item, list)
                or not 1 <= len(item) <= 2
                or not all(isinstance(x, str) for x in item)
                or not item[0].startswith("--")
            ):
                self.fail(f'item {i} must be [--flag] or [--flag, "value"] (strings), got {item!r}', key)
            if any(not x.isprintable() for x in item):  # a newline would end the launcher's command line
                self.fail(f"item {i} ({item[0]}) has a control character (newline, tab, ...): {item!r}", key)
            if item[0] == "--max-model-len" and (len(item) != 2 or not item[1].isascii() or not item[1].isdigit()):
                self.fail(f"item {i}: --max-model-len takes a positive integer, got {item[1:]!r}", key)
            out.append(tuple(item))
        return tuple(out)

    def env(self, key: str) -> dict:
        value = self.req(key, dict, optional=True, default={})
        for k, v in value.items():
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                self.fail(f"{k!r} is not an environment variable name", key)
            if not isinstance(v, str):
                self.fail(f"{k}: value must be a quoted string, got {v!r}", key)
        return dict(value)


def _strict_loader():
    """libyaml's C loader when present (the recipe command's start-up time is mostly YAML parsing), refusing
    duplicate keys, which plain YAML loaders resolve silently (the last one wins)."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[valid-type, misc]  # a base chosen at run time: C loader or not
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key != "<<":
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_document(self, node):
            # PyYAML's constructor walks every node through generators (most of a recipe file's load time);
            # this builds the same objects directly. Anything it does not cover (merge keys, other tags, a
            # duplicate key, recursion) goes the standard way, which gives the canonical result and error.
            try:
                return _plain(node, self, {}, set())
            except _NotPlain:
                return super().construct_document(node)

    return StrictLoader


class _NotPlain(Exception):
    """A node the direct build leaves to PyYAML's own constructor."""


_SCALARS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float"))
_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


def _plain(node, loader, memo: dict, building: set):
    """`node` as SafeConstructor builds it (an alias to a collection is the same object, as there), for plain
    YAML only."""
    kind = type(node)
    if kind is yaml.ScalarNode:
        if node.tag == _STR:
            return node.value
        if node.tag in _SCALARS:
            return loader.yaml_constructors[node.tag](loader, node)
        raise _NotPlain
    if node in building:  # a recursive alias
        raise _NotPlain
    if node in memo:
        return memo[node]
    building.add(node)
    if node.tag == _MAP and kind is yaml.MappingNode:
        value: dict | list = {}
        seen = set()  # raw key text, as StrictLoader.construct_mapping compares keys
        for key_node, value_node in node.value:
            if type(key_node) is not yaml.ScalarNode or key_node.value in seen or key_node.value == "<<":
                raise _NotPlain  # a merge key, a collection as key, a duplicate (refused, with its line)
            seen.add(key_node.value)
            key = key_node.value if key_node.tag == _STR else _plain(key_node, loader, memo, building)
            value[key] = _plain(value_node, loader, memo, building)
    elif node.tag == _SEQ and kind is yaml.SequenceNode:
        value = [_plain(child, loader, memo, building) for child in node.value]
    else:
        raise _NotPlain
    building.discard(node)
    memo[node] = value
    return value


_LOADER = None


def load_yaml(path: Path):
    """One recipe file through the strict loader (bounded read, duplicate keys, bad UTF-8: CatalogError naming the file)."""
    from rocm_dspark.inputs import read_text

    global _LOADER
    try:
        text = read_text(path, "recipe file")
    except UsageError as exc:
        raise CatalogError(str(exc)) from None
    _LOADER = _LOADER or _strict_loader()
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CatalogError(f"{path}: {where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise CatalogError(f"{path}: nested too deeply") from None


@lru_cache(maxsize=4)
def parser_facts(release: str | None) -> dict | None:
    """What the `vllm serve` parser of `release` accepts (recipes/vllm_parsers.yaml), or None where it is not known;
    read only when a --vllm-arg needs it (the file is not on the plain `recipe` path)."""
    path = recipes_dir() / "vllm_parsers.yaml"
    data = load_yaml(path)
    if not isinstance(data, dict) or data.get("schema") != "rocm-dspark/vllm-parsers/1":
        raise CatalogError(f"{path}: not a rocm-dspark/vllm-parsers/1 file")
    return (data.get("parsers") or {}).get(release)


def _gpu(path: Path, key: str, r: _Reader) -> GpuSpec:
    fp8 = r.req("fp8_format", str)
    if fp8 not in ("fnuz", "ocp"):
        r.fail(f"expected fnuz or ocp, got {fp8!r}", "fp8_format")
    arch = r.req("arch", str)
    if not re.fullmatch(r"gfx\d+[a-z]?", arch):
        r.fail(f"expected a gfx architecture such as gfx942, got {arch!r}", "arch")
    spec = GpuSpec(
        key=key,
        name=r.req("name", str),
        arch=arch,
        family=r.req("family", str),
        compute_units=r.positive_int("compute_units"),
        hbm_gb=r.number("hbm_gb"),
        hbm_bandwidth_tbps=r.number("hbm_bandwidth_tbps"),
        peak_bf16_tflops=r.number("peak_bf16_tflops"),
        peak_fp8_tflops=r.number("peak_fp8_tflops"),
        peak_fp4_tflops=r.number("peak_fp4_tflops", optional=True),
        fp8_format=fp8,
        native_fp4=r.req("native_fp4", bool),
        gpus_per_node=r.positive_int("gpus_per_node"),
        tdp_w=r.number("tdp_w"),
        marketing_names=r.str_list("marketing_names"),
        sources=r.str_list("sources"),
    )
    r.close()
    return spec


def _profile(model: str, gpu: str, r: _Reader, gpus: dict) -> Profile:
    if gpu not in gpus:
        r.fail(f"unknown GPU {gpu!r}; known: {', '.join(sorted(gpus))}")
    status = r.choice("status", STATUSES)
    date = str(r.req("status_date", str))
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        r.fail(f"expected YYYY-MM-DD, got {date!r}", "status_date")
    evidence = r.str_list("evidence")
    if not evidence:
        r.fail("at least one evidence link is required", "evidence")
    mode = r.choice("cudagraph_mode", CUDAGRAPH_MODES, optional=True)
    engram = r.req("engram_cpu_offload", dict, optional=True)
    if engram is not None and not all(isinstance(v, bool) for v in engram.values()):
        r.fail("expected a mapping from TP size to true/false", "engram_cpu_offload")
    for old in ("image", "image_tag", "vllm_build", "vllm_version"):
        if old in r.data:
            r.fail(
                "the image and vLLM come from the build now: use `build: <name in vllm.yaml builds>` "
                "(or leave it out for the GPU's default build)",
                old,
            )
    build = r.req("build", str, optional=True)
    profile = Profile(
        model=model,
        gpu=gpu,
        status=status,
        status_date=date,
        evidence=evidence,
        image="",
        image_tag="",
        vllm_build=build,
        vllm_version=None,
        tp=r.positive_int("tp"),
        dp=r.positive_int("dp"),
        ep=r.positive_int("ep"),
        max_num_seqs=r.positive_int("max_num_seqs"),
        max_num_batched_tokens=r.positive_int("max_num_batched_tokens"),
        capture_cap=r.positive_int("capture_cap"),
        cudagraph_mode=mode,
        breakable_cudagraph=r.req("breakable_cudagraph", bool, optional=True),
        moe_backend=r.req("moe_backend", str, optional=True),
        gpu_memory_utilization=r.number("gpu_memory_utilization", optional=True, maximum=1.0),
        engram_cpu_offload={str(k): v for k, v in engram.items()} if engram else None,
        args=r.arg_list("args"),
        env=r.env("env"),
    )
    r.close()
    return profile


def _model(path: Path, data, gpus: dict) -> ModelSpec:
    r = _Reader(path, data)
    spec = r.sub("speculative")
    block = spec.positive_int("block_size")
    spec.req("method", str)
    spec.sub("config")
    spec.req("adaptive_verification", bool)
    spec.number("golden_acceptance_length", optional=True, minimum=1.0, strict=False)
    spec.close("allowed_num_speculative_tokens")  # checked where it is used (planner/profile.py)
    arch = r.sub("architecture")
    for k in (
        "layers",
        "hidden_size",
        "query_heads",
        "context_length",
        "swa_window",
        "kv_latent_dim",
        "routed_experts",
        "experts_per_token",
    ):
        arch.positive_int(k)
    arch.close()
    serve = r.sub("serve")
    serve.req("host", str)
    port = serve.positive_int("port")
    if port > 65535:
        serve.fail(f"expected a TCP port 1-65535, got {port}", "port")
    if not serve.req("served_name", str).strip():
        serve.fail("must not be empty", "served_name")
    serve.close()
    validation = r.sub("validation")
    check = validation.sub("deterministic_check")
    check.req("prompt", str)
    check.req("expect", str)
    check.req("chat_template_kwargs", dict, optional=True)
    if check.req("max_tokens", int, optional=True) is not None:
        check.positive_int("max_tokens")
    check.close()
    validation.number("acceptance_length_min", optional=True, minimum=1.0, strict=False)
    validation.number("gsm8k_min", optional=True, minimum=0.0, strict=False, maximum=1.0)
    validation.close()
    params = r.sub("params")
    for k in ("active_output_token_b", "weight_bytes_per_step_gb", "backbone_b", "active_prompt_token_b"):
        params.number(k)
    for k in ("engram_b", "draft_b"):
        params.number(k, optional=True, strict=False)
    params.close()
    key = r.req("key", str)
    profiles_r = r.sub("profiles")
    profiles = {g: _profile(key, g, profiles_r.sub(g), gpus) for g in profiles_r.data}
    default_gpu = r.req("default_gpu", str)
    if default_gpu not in profiles:
        r.fail(f"{default_gpu!r} has no profile", "default_gpu")
    model = ModelSpec(
        key=key,
        hf_id=r.req("hf_id", str),
        revision=r.req("revision", str, optional=True),
        aliases=r.str_list("aliases"),
        fallback=r.req("fallback", str, optional=True),
        default_gpu=default_gpu,
        architecture=dict(arch.data),
        weights_gb=r.number("weights_gb"),
        params=dict(params.data),
        speculative={**spec.data, "block_size": block},
        serve=dict(serve.data),
        base_args=r.arg_list("base_args"),
        base_env=r.env("base_env"),
        validation=dict(r.data["validation"]),
        profiles=profiles,
        requires=r.str_list("requires", optional=True),
        workload=_workload(path, r, gpus),
        memory=_memory(r),
    )
    if not model.hf_id.strip():
        r.fail("must not be empty", "hf_id")
    r.close()
    return model


MEMORY_KEYS = (
    "fixed_gib",
    "sharded_weights_gib",
    "engram_tables_gib",
    "indexer_mib_per_batched_token",
    "kv_gib_per_million_tokens",
    "error_gib",
)


def _memory(r: _Reader) -> dict:
    if r.data.get("memory") is None:
        return {}
    m = r.sub("memory")
    out = {k: m.req(k, float) for k in MEMORY_KEYS}
    for k, v in out.items():
        if v < 0 or (k == "kv_gib_per_million_tokens" and v == 0):
            m.fail(f"must be positive, got {v!r}", k)
    out["sources"] = m.str_list("sources")
    out["layout"] = {}
    if m.data.get("layout") is not None:  # how the parts lie over TP x DP x PP ranks (rocm_dspark/recipe/memory.py)
        lay = m.sub("layout")
        out["layout"] = {k: lay.req(k, float) for k in ("expert_bytes_per_param", "dense_bytes_per_param")}
        for k, v in out["layout"].items():
            if not v > 0:
                lay.fail(f"must be positive, got {v!r}", k)
        out["layout"]["engram_dp_shard_builds"] = tuple(lay.str_list("engram_dp_shard_builds", optional=True))
        lay.close()
    return out


WORKLOAD_SETS = ("max_num_batched_tokens", "max_num_seqs", "engram_cpu_offload")


def _workload(path: Path, r: _Reader, gpus: dict) -> dict:
    if r.data.get("workload") is None:
        return {}
    w = r.sub("workload")
    out = {
        "max_num_seqs_per_request": w.req("max_num_seqs_per_request", int, optional=True),
        "evidence": w.req("evidence", str),
        "rules": [],
    }
    for i, rule in enumerate(w.req("rules", list, optional=True, default=[])):
        rr = _Reader(path, rule, f"workload.rules[{i}]")
        for g in rr.str_list("gpus", optional=True):
            if g not in gpus:
                rr.fail(f"unknown GPU {g!r}", "gpus")
        tps = rr.req("tp", list, optional=True, default=[])
        sets = rr.req("sets", dict)
        for k, v in sets.items():
            if k not in WORKLOAD_SETS:
                rr.fail(f"can set only {', '.join(WORKLOAD_SETS)}, got {k!r}", "sets")
            if (
                k == "engram_cpu_offload"
                and not isinstance(v, bool)
                or k != "engram_cpu_offload"
                and (not isinstance(v, int) or isinstance(v, bool) or v <= 0)
            ):
                rr.fail(f"bad value {v!r} for {k}", "sets")
        out["rules"].append(
            {
                "gpus": rr.str_list("gpus", optional=True),
                "tp": tuple(tps),
                "min_concurrency": rr.positive_int("min_concurrency"),
                "sets": dict(sets),
                "why": rr.req("why", str),
                "evidence": rr.req("evidence", str),
            }
        )
    return out


def _workaround(path: Path, i: int, data, gpus: dict) -> Workaround:
    r = _Reader(path, data, f"workarounds[{i}]")
    applies = r.sub("applies")
    vllm_range = applies.req("vllm", str, optional=True)
    if vllm_range:
        try:
            version_in_range("0.0.0", vllm_range)
        except (ValueError, UsageError):
            applies.fail(f"bad version range {vllm_range!r}", "vllm")
    wgpus = applies.str_list("gpus", optional=True)
    for g in wgpus:
        if g not in gpus:
            applies.fail(f"unknown GPU {g!r}", "gpus")
    for k in ("reason", "evidence", "remove_when"):
        if not r.req(k, str).strip():
            r.fail("must not be empty", k)
    w = Workaround(
        id=r.req("id", str),
        models=applies.str_list("models", optional=True),
        gpus=wgpus,
        vllm=vllm_range,
        sets=dict(r.req("sets", dict, optional=True, default={})),
        args=r.arg_list("args"),
        env=r.env("env"),
        reason=" ".join(r.data["reason"].split()),
        evidence=r.data["evidence"],
        remove_when=" ".join(r.data["remove_when"].split()),
        short=" ".join(r.req("short", str, optional=True, default="").split()),
        when=_when(r),
    )
    applies.close()
    r.close()
    return w


WHEN_KEYS = ("max_num_batched_tokens_below",)


def _when(r: "_Reader") -> dict:
    if r.data.get("when") is None:
        return {}
    wr = r.sub("when")
    out = {k: wr.req(k, int) for k in WHEN_KEYS if k in wr.data}
    if not out:
        wr.fail(f"name a condition ({', '.join(WHEN_KEYS)})")
    wr.close()
    return out


def load_catalog(root: Path | str | None = None) -> Catalog:
    root = Path(root) if root else recipes_dir()
    return _load_catalog_cached(root.resolve())


def _yaml_files(directory: Path) -> list[Path]:
    """sorted(directory.glob("*.yaml")) in one listing, without compiling the glob (on every `recipe`)."""
    try:
        return sorted(directory / n for n in os.listdir(directory) if n.endswith(".yaml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


@lru_cache(maxsize=8)
def _load_catalog_cached(root: Path) -> Catalog:
    gpus_path = root / "gpus.yaml"
    gr = _Reader(gpus_path, load_yaml(gpus_path))
    gpus_r = gr.sub("gpus")
    gpus = {k: _gpu(gpus_path, k, gpus_r.sub(k)) for k in gpus_r.data}
    gr.close("reference_gpus")  # read by benchmarks/sparse_swa.py for "% of peak" only

    models: dict[str, ModelSpec] = {}
    model_paths: dict[str, Path] = {}
    model_files = _yaml_files(root / "models")
    if not model_files:
        raise CatalogError(f"{root / 'models'}: no model files (*.yaml)")
    for path in model_files:
        model = _model(path, load_yaml(path), gpus)
        if model.key in models:
            raise CatalogError(f"{path}: key: model {model.key!r} is defined twice")
        models[model.key] = model
        model_paths[model.key] = path
    for model in models.values():
        if model.fallback and model.fallback not in models:
            raise CatalogError(f"{root / 'models'}: {model.key}.fallback: unknown model {model.fallback!r}")

    wa_path = root / "workarounds.yaml"
    wr = _Reader(wa_path, load_yaml(wa_path))
    wa_list = wr.req("workarounds", list)
    workarounds = tuple(_workaround(wa_path, i, w, gpus) for i, w in enumerate(wa_list))
    wr.close()
    for w in workarounds:
        for m in w.models:
            if m not in models:
                raise CatalogError(f"{wa_path}: {w.id}.applies.models: unknown model {m!r}")

    vpath = root / "vllm.yaml"
    vr = _Reader(vpath, load_yaml(vpath))
    caps = []
    for i, c in enumerate(vr.req("capabilities", list)):
        cr = _Reader(vpath, c, f"capabilities[{i}]")
        try:
            version_in_range("0.0.0", cr.req("versions", str))
        except (ValueError, UsageError):
            cr.fail("bad version range", "versions")
        caps.append(
            Capability(
                versions=c["versions"],
                supports_v41=cr.req("supports_v41", bool),
                refuses_adaptive_on_rocm_v41=cr.req("refuses_adaptive_on_rocm_v41", bool),
                native_adaptive_on_rocm_v41=cr.req("native_adaptive_on_rocm_v41", bool),
                note=" ".join(cr.req("note", str).split()),
                evidence=cr.req("evidence", str),
                backport=_backport(cr) if cr.req("backport", dict, optional=True) else None,
            )
        )
    changes = {}
    for cid, c in vr.req("changes", dict).items():
        cr = _Reader(vpath, c, f"changes.{cid}")
        if not re.fullmatch(r"vllm#\d+", str(cid)):
            vr.fail(f"change ids look like vllm#12345, got {cid!r}", "changes")
        changes[cid] = {"title": cr.req("title", str), "url": cr.req("url", str)}
    av = vr.sub("adaptive_verification")
    adaptive_change = av.req("change", str)
    if adaptive_change not in changes:
        av.fail(f"unknown change {adaptive_change!r}", "change")
    adaptive_notes = {
        k: " ".join(av.req(k, str).split()) for k in ("refused_note", "refused_evidence", "native_evidence")
    }
    kr = vr.sub("per_batch_size_k")
    dynamic_k_change = kr.req("change", str)
    if dynamic_k_change not in changes:
        kr.fail(f"unknown change {dynamic_k_change!r}", "change")
    kr.close()
    channels = {}  # the channel list is the recipe's: a build names one of these
    for ch, c in vr.req("channels", dict).items():
        cr = _Reader(vpath, c, f"channels.{ch}")
        channels[ch] = {
            "retention_builds": cr.req("retention_builds", int, optional=True),
            "retention_days": cr.req("retention_days", int, optional=True),
            "source": cr.req("source", str),
        }
        cr.close()
    if "release" not in channels:  # the defaults below are releases
        vr.fail("name the release channel", "channels")
    builds = {
        name: _build(vpath, name, vr.sub("builds").sub(name), changes, gpus, tuple(channels))
        for name in vr.sub("builds").data
    }
    arch_defaults = {}
    for arch, d in vr.req("defaults", dict, optional=True, default={}).items():
        dr = _Reader(vpath, d, f"defaults.{arch}")
        names = dr.str_list("builds")
        for n in names:
            if n not in builds:
                dr.fail(f"{n!r} is not in builds", "builds")
            if builds[n].channel != "release":
                dr.fail(f"{n!r} is a {builds[n].channel} build: defaults are releases (nightlies are pruned)", "builds")
        if not names:
            dr.fail("name at least one build", "builds")
        arch_defaults[arch] = {
            "builds": names,
            "reason": " ".join(dr.req("reason", str).split()),
            "source": dr.req("source", str),
        }
        dr.close()
    flag_rules = {}
    for flag, f in vr.req("flags", dict).items():
        fr = _Reader(vpath, f, f"flags.{flag}")
        rule = FlagRule(
            flag,
            fr.str_list("needs", optional=True),
            fr.str_list("unnecessary_with", optional=True),
            " ".join(fr.req("reason", str).split()),
            fr.req("evidence", str),
        )
        for cid in rule.needs + rule.unnecessary_with:
            if cid not in changes:
                fr.fail(f"unknown change {cid!r}")
        flag_rules[flag] = rule
    mono = _mono(vr, changes, flag_rules, models, {g.arch for g in gpus.values()}) if "mono_decode" in vr.data else {}
    for model in models.values():
        for cid in model.requires:
            if cid not in changes:
                raise CatalogError(f"{model_paths[model.key]}: requires: unknown change {cid!r}")
        for p in model.profiles.values():
            if p.vllm_build and p.vllm_build not in builds:
                raise CatalogError(f"{root / 'models'}: {p.id}.build: {p.vllm_build!r} is not in vllm.yaml builds")
    catalog = Catalog(
        root=root,
        gpus=gpus,
        models=models,
        workarounds=workarounds,
        capabilities=tuple(caps),
        builds=builds,
        changes=changes,
        dynamic_k_change=dynamic_k_change,
        flag_rules=flag_rules,
        adaptive_change=adaptive_change,
        adaptive_notes=adaptive_notes,
        channels=channels,
        arch_defaults=arch_defaults,
        mono=mono,
    )
    for model in models.values():  # each profile names the build it runs by default, for readers of the catalog
        for g, p in list(model.profiles.items()):
            b = builds[p.vllm_build] if p.vllm_build else catalog.default_build(gpus[g])[0]
            model.profiles[g] = p._replace(
                image=b.image, image_tag=b.image_tag, vllm_build=b.name, vllm_version=b.reported_version
            )
    return catalog


BUILD_STATUSES = ("current", "superseded", "floating")
HOW = ("ancestry", "wheel", "parser", "note")


def _build(path: Path, name: str, r: _Reader, changes: dict, gpus: dict, channels: tuple[str, ...]):
    from rocm_dspark.recipe.plan import Build

    image = r.req("image", str)
    if "@" in image or ":" not in image.rsplit("/", 1)[-1]:
        r.fail(f"expected repo:tag (the digest goes in `digest`), got {image!r}", "image")
    digest = r.req("digest", str, optional=True)
    if digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        r.fail(f"expected sha256:<64 hex digits> or null, got {digest!r}", "digest")
    status = r.choice("status", BUILD_STATUSES)
    channel = r.choice("channel", channels, where=" (vllm.yaml channels)")
    date = r.req("date", str, optional=True)
    if date is not None and not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", date):
        r.fail(f"expected YYYY-MM-DD or YYYY-MM, got {date!r}", "date")
    facts = {}
    cr = r.sub("changes") if r.data.get("changes") else None
    for cid, fact in cr.data.items() if cr else ():
        assert cr is not None
        if cid not in changes:
            cr.fail(f"unknown change {cid!r}")
        fr = _Reader(path, fact, f"{cr.where}.{cid}")
        value = fact.get("in", "missing")
        if value not in (True, False, None):
            fr.fail("`in` must be true, false or null", "in")
        if value is not None:
            fr.choice("how", HOW)
            fr.req("source", str)
        facts[cid] = {"in": value, "how": fact.get("how"), "source": fact.get("source")}
    evidence_on = {}
    for g, urls in (r.req("gpus", dict, optional=True, default={}) or {}).items():
        if g not in gpus:
            r.fail(f"unknown GPU {g!r}", "gpus")
        if not urls or not all(isinstance(u, str) for u in urls):
            r.fail(f"{g}: expected a non-empty list of evidence links", "gpus")
        evidence_on[g] = tuple(urls)
    reported = r.req("reported_version", str, optional=True)
    release = r.req("release", str, optional=True)
    if channel == "release" and release is None:
        r.fail('a release build needs `release` (e.g. "0.33.0")')
    build = Build(
        name=name,
        image=f"{image.rsplit(':', 1)[0]}@{digest}" if digest else image,
        image_tag=image,
        digest=digest,
        vllm_commit=r.req("commit", str, optional=True),
        reported_version=reported or release or None,
        rocm=r.req("rocm", str, optional=True),
        channel=channel,
        changes=tuple(c for c, f in facts.items() if f["in"] is True),
        status=status,
        date=date or "",
        evidence=r.str_list("evidence"),
        facts=facts,
        gpus=evidence_on,
        status_note=" ".join((r.req("status_note", str, optional=True) or "").split()),
    )
    r.close("changes")  # read above only when not empty
    return build


MONO_SOURCED = (
    "archs",
    "rows",
    "tensor_parallel_only",
    "moe_backend",
    "gfx942_copy_fraction",
    "min_compute_units",
    "cudagraph_mode",
    "kv_cache_dtype",
    "unset_env",
    "indexer",
)


def _mono(vr: _Reader, changes: dict, flag_rules: dict, models: dict, archs: set) -> dict:
    """vllm.yaml `mono_decode`: the --monokernel conditions, each with its wheel source."""
    mr = vr.sub("mono_decode")
    out = {
        "change": mr.req("change", str),
        "flag": mr.req("flag", str),
        "models": mr.str_list("models"),
        "min_compute_units": mr.positive_int("min_compute_units"),
        "kv_cache_dtype": mr.req("kv_cache_dtype", str),
        "cudagraph_mode": mr.req("cudagraph_mode", str),
        "unset_env": mr.str_list("unset_env"),
        "evidence": mr.req("evidence", str),
        "archs": {},
    }
    if out["change"] not in changes:
        mr.fail(f"unknown change {out['change']!r}", "change")
    if out["flag"] not in flag_rules:
        mr.fail(f"{out['flag']!r} has no rule in `flags`", "flag")
    if out["cudagraph_mode"] not in CUDAGRAPH_MODES:
        mr.fail(f"expected one of {', '.join(CUDAGRAPH_MODES)}", "cudagraph_mode")
    for m in out["models"]:
        if m not in models:
            mr.fail(f"unknown model {m!r}", "models")
    for arch, a in mr.req("archs", dict).items():
        if arch not in archs:
            mr.fail(f"no GPU in gpus.yaml is {arch!r}", "archs")
        ar = _Reader(vr.path, a, f"mono_decode.archs.{arch}")
        tps = ar.req("tp", list)
        if not tps or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tps):
            ar.fail("expected a list of positive integers", "tp")
        out["archs"][arch] = {
            "tp": tuple(tps),
            "max_rows": ar.positive_int("max_rows"),
            "moe_backend": ar.req("moe_backend", str, optional=True),
        }
        ar.close()
    cf = mr.sub("gfx942_copy_fraction")
    out["gfx942_copy_fraction"] = {k: cf.number(k, maximum=1.0) for k in ("experts", "dense")}
    cf.close()
    gr = mr.sub("public_gain")
    out["public_gain"] = {"source": gr.req("source", str)}
    for k in ("per_layer", "interactivity", "concurrency"):
        pair = gr.req(k, list)
        if (
            len(pair) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in pair)
            or pair[0] > pair[1]
        ):
            gr.fail("expected [low, high], positive numbers", k)
        out["public_gain"][k] = (float(pair[0]), float(pair[1]))
    gr.close()
    sr = mr.sub("sources")
    out["sources"] = {k: " ".join(sr.req(k, str).split()) for k in MONO_SOURCED}
    sr.close()
    mr.close()
    return out


def _backport(cr: _Reader) -> dict:
    """A capability's `backport` entry: which vLLM modules and classes the plugin patches on that release."""
    br = cr.sub("backport")
    out = {
        "rocm_modules": br.str_list("rocm_modules"),
        "indexer_module": br.req("indexer_module", str),
        "indexer_backends": br.str_list("indexer_backends"),
        "k1_predicate": br.req("k1_predicate", str, optional=True),
    }
    if not out["rocm_modules"] or not out["indexer_backends"]:
        br.fail("rocm_modules and indexer_backends must name at least one each")
    br.close()
    return out
