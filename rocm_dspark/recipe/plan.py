"""The launch plan and the records around it: what the operator selected (Selection), what the probe
gate decided (Verdict), the vLLM build (Build), the memory estimate (Memory), and the resolved plan
(LaunchPlan) that every renderer, launcher, probe and validator consumes.

A plan carries its structure (layout, batch limits, capture size, K, build, memory), so no consumer
re-parses argv. It carries both commands: `block_argv` (full block verification, always) and
`adaptive_argv` (adaptive verification on; None where the plan may not use it, e.g. a synthetic
benchmark). `argv` is the command that runs: the verdict, applied last, picks one of the two.
"""

# No __future__ annotations: NamedTuple would compile each string annotation at import (benchmarks/recipe_latency.py).

from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple

from rocm_dspark.recipe.vllm_args import canonical_name, emit

# NamedTuple rather than dataclasses: importing dataclasses (and inspect behind it) costs ~16 ms,
# most of what `rocm-dspark recipe` would otherwise spend beyond importing yaml and click.


def flag_for(dest: str) -> str:
    """The long flag vLLM reads for `dest`, the one mapping between the plan's settings and argv: `--` + dest with
    `_` as `-`, as vLLM's EngineArgs derives its CLI from its config fields."""
    return "--" + dest.replace("_", "-")


class Flags(tuple[tuple[str, str | None], ...]):
    """A command's flags in order: (flag, value or None) pairs. What every consumer reads instead of argv words."""

    def get(self, dest: str, default=None):
        flag = flag_for(dest)  # the last one wins, as in argparse
        return next((v for f, v in reversed(self) if f == flag), default)

    def has(self, dest: str) -> bool:
        flag = flag_for(dest)
        return any(f == flag for f, _ in self)


class Command(tuple[str, ...]):
    """One `vllm serve` command as data: `head` (vllm serve MODEL) and `flags` (Flags). It is also its argv, the
    words rendered once from the flags (vllm_args.emit), so a consumer that runs or prints it takes it as it is,
    and one that needs a setting reads `flags`; nobody parses the words back."""

    head: tuple[str, ...]
    flags: Flags

    def __new__(cls, head: Iterable[str], flags: Iterable[tuple[str, str | None]] = ()) -> "Command":
        first, pairs = tuple(head), Flags((f, v) for f, v in flags)
        words = list(first)
        for flag, value in pairs:
            words.extend(emit(flag, value))
        self = super().__new__(cls, words)
        self.head, self.flags = first, pairs
        return self

    def __getnewargs__(self) -> tuple[tuple[str, ...], Flags]:  # pickle/copy rebuild it from its parts
        return self.head, Flags(self.flags)

    @classmethod
    def from_words(cls, words: Iterable[str]) -> "Command":
        """The one way a command from outside the resolver (--server-json, a stored record, a log's argv) becomes
        a Command. Read as vLLM's FlexibleArgumentParser.parse_args reads it (vllm/utils/argparse_utils.py):
        `--a_b` is `--a-b` (up to the first `.`), `--f=v` is `--f v`, `-O3` is `--optimization-level 3`, the
        short aliases are their long flags; `--no-f` stays its own flag (bool_flag reads it)."""
        if isinstance(words, Command):
            return words
        ws, head = [str(w) for w in words], []
        pairs: list[tuple[str, str | None]] = []
        i = 0
        while i < len(ws) and not _is_flag(ws[i]):
            head.append(ws[i])
            i += 1
        while i < len(ws):
            w = ws[i]
            i += 1
            if not _is_flag(w):  # a positional after the flags (the model, or what follows `--`)
                head.append(w)
                continue
            if w == "--":
                head.extend(ws[i:])
                break
            if w.startswith("-O") and w != "-O":
                pairs.append(("--optimization-level", w[3:] if w[2:3] == "=" else w[2:]))
                continue
            flag, eq, value = w.partition("=")
            flag = _SHORT.get(flag) or canonical_name(flag)
            if eq:
                pairs.append((flag, value))
            elif i < len(ws) and not _is_flag(ws[i]):
                pairs.append((flag, ws[i]))
                i += 1
            else:
                pairs.append((flag, None))
        return cls(head, pairs)

    def value(self, dest: str, default=None):
        """The value vLLM reads for `dest` (None for a bare flag); `default` when it is not set."""
        return self.flags.get(dest, default)

    def bool_flag(self, dest: str) -> bool | None:
        """A boolean flag as vLLM reads it: the last of `--f` / `--no-f` wins; None when neither is given."""
        flag = flag_for(dest)
        return next((f == flag for f, _ in reversed(self.flags) if f in (flag, "--no-" + flag[2:])), None)

    def int_value(self, dest: str, default: int = 1) -> int:
        v = self.value(dest)
        return default if v is None else int(v)

    def spec_config(self) -> dict | None:
        """The --speculative-config JSON object (None: not given, or not a JSON object)."""
        import json

        raw = self.value("speculative_config")
        try:
            spec = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return spec if isinstance(spec, dict) else None

    @property
    def gpus_per_node_used(self) -> int:
        """GPUs this `vllm serve` uses on its node: TP x local DP (else DP) x PP."""
        dp = self.value("data_parallel_size_local") or self.value("data_parallel_size") or 1
        return self.int_value("tensor_parallel_size") * int(dp) * self.int_value("pipeline_parallel_size")

    def without(self, dest: str) -> "Command":
        flag = flag_for(dest)  # and its dotted keys (--speculative-config.method=...), which vLLM merges into it
        return Command(self.head, ((f, v) for f, v in self.flags if f != flag and not f.startswith(flag + ".")))


# vLLM's short aliases (vllm/engine/arg_utils.py add_cli_args); its underscore rule is vllm_args.canonical_name.
_SHORT = {
    "-tp": "--tensor-parallel-size",
    "-dp": "--data-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-sc": "--speculative-config",
    "-cc": "--compilation-config",
    "-O": "--optimization-level",
}


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


def flag_pairs(argv: tuple[str, ...]) -> Flags | None:
    """The (flag, value) pairs of a plan's command; None for words that came from elsewhere (a --server-json
    command), which are shown and run as given, never parsed."""
    return argv.flags if isinstance(argv, Command) else None


class Note(NamedTuple):
    """Why one non-obvious value in the plan is what it is: `text` in full (reasons, evidence, removal
    condition; `--explain` and JSON), `short` in a few words for the default output (empty: render.brief
    shortens `text`)."""

    topic: str
    text: str
    short: str = ""


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
    vllm_version: str | None = None  # a build name, or a release number that names a build (0.33.0)
    benchmark_synthetic: float | None = None
    model_path: str | None = None
    served_name: str | None = None
    host: str | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()  # "--flag" or "--flag=value"
    extra_env: tuple[tuple[str, str], ...] = ()
    build: str | None = None  # a build name from recipes/vllm.yaml (wins over vllm_version)
    concurrency: int | None = None  # expected concurrent requests: drives workload rules
    memory_override: bool = False  # start even when the memory model finds no KV room (noted)
    images: tuple = ()  # (repo:tag, registry answer) read from this host's cache (rocm_dspark.images.cache)
    today: str | None = None  # YYYY-MM-DD, for the nightly retention note; None: the catalog's newest build date
    k_schedule: tuple[tuple[int, int, int], ...] | None = None  # per-batch-size K (rocm_dspark.recipe.k_schedule)
    no_speculation: bool = False  # serve the target model alone (what `plan` recommends where drafting loses)
    image: str | None = None  # --image REF: run REF instead of the build's image
    registry: str | None = None  # --registry HOST[:PORT]: every image maps to the same repo:tag on this mirror
    image_software: dict | None = None  # the image's own software (rocm_dspark.probe.software, read in the image)


class State(StrEnum):
    """The one vocabulary of the gate's answer (composed in rocm_dspark/usecase/verdict.py); the reason is words
    for the note, never parsed."""

    PROVEN = "proven"  # adaptive verification is proven here and pays (or --adaptive on)
    REFUTED = "refuted"  # the newest matching evidence is that it fails here
    NOT_PROVEN = "not proven"  # no record, or none that matches and is complete
    NOT_PAYING = "proven, not paying"  # proven here, but the payoff half keeps block verification


PROVEN, REFUTED, NOT_PROVEN, NOT_PAYING = State


class Verdict(NamedTuple):
    """The gate's answer for this host: is adaptive verification proven here, and why (not)."""

    adaptive_proven: bool
    reason: str
    record: str | None = None
    state: State | None = None  # None is read from adaptive_proven

    @property
    def outcome(self) -> State:
        return self.state or (PROVEN if self.adaptive_proven else NOT_PROVEN)

    @staticmethod
    def not_proven(reason: str = "no probe record was consulted") -> "Verdict":
        return Verdict(False, reason)

    @staticmethod
    def refuted(reason: str, record: str | None) -> "Verdict":
        return Verdict(False, reason, record, REFUTED)

    @staticmethod
    def not_paying(reason: str, record: str | None) -> "Verdict":
        """Proven on this host, but it does not pay for the declared workload: block verification stays."""
        return Verdict(False, reason, record, NOT_PAYING)


class Build(NamedTuple):
    """One vLLM build (an image), as recipes/vllm.yaml records it."""

    name: str  # e.g. "nightly-3df4ae15", "v0.33.0"
    image: str  # what the plan runs: repo@sha256:... when published, else repo:tag
    image_tag: str  # repo:tag
    digest: str | None  # sha256:... from public evidence; None = resolved at launch
    vllm_commit: str | None
    reported_version: str | None  # what `vllm --version` says (a label, not a feature test); None: not recorded
    rocm: str | None
    channel: str  # a channel of recipes/vllm.yaml `channels` (release, nightly, ...)
    changes: tuple[str, ...]  # upstream changes contained, e.g. ("vllm#56227", ...)
    status: str  # current | superseded
    date: str
    evidence: tuple[str, ...]
    adaptive_on_rocm_v41: str = "refused"  # refused | native | unknown: AV for V4.1 on ROCm (filled by resolve)
    adaptive_evidence: str = ""
    facts: dict = {}  # change -> {"in": True/False/None, "how": ancestry|wheel|parser|note, "source"}
    gpus: dict = {}  # GPU key -> public evidence of V4.1 runs on this build
    status_note: str = ""
    resolution: dict = {}  # this host's registry answer for image_tag (rocm_dspark.images.cache), {} if none


class Memory(NamedTuple):
    """Per-rank HBM budget (GiB) for the plan's layout, from recipe data; see resolve.memory_layer."""

    hbm_gib: float
    usable_gib: float  # hbm x gpu_memory_utilization
    weights_gib: float  # weights split across TP, per rank (Engram tables apart)
    engram_gib: float  # Engram tables resident per rank (0 when offloaded)
    indexer_gib: float  # [max_num_batched_tokens, max_model_len] fp8 logits buffer and companions
    margin_gib: float  # the fixed per-rank part: replicated weights, activations, graphs, runtime
    kv_gib: float  # what is left for KV cache
    kv_tokens: int | None  # KV capacity in tokens (None when kv_gib <= 0)
    kv_multiples: float | None  # kv_tokens / max_model_len
    error_gib: float  # the model's stated error against published KV headroom
    sources: tuple[str, ...]
    override: bool = False  # refused layout started anyway (--memory-override)


class LaunchPlan(NamedTuple):
    model_id: str  # Hugging Face id passed to `vllm serve`
    model_key: str  # catalog key, e.g. "DeepSeek-V4.1-Flash"
    served_name: str  # --served-model-name
    gpu: str  # catalog GPU key, e.g. "mi355x"
    arch: str  # gfx942 / gfx950
    profile: str  # profile id, e.g. "DeepSeek-V4.1-Flash/mi355x"
    status: str  # verified / experimental / unverified
    status_date: str
    evidence: tuple[str, ...]
    vllm_version: str  # the build's reported version (a label, not a feature test)
    image: str  # container image: pinned by digest where one is published
    host: str
    port: int
    argv: tuple[str, ...]  # the command that runs: block_argv or adaptive_argv (verdict applied last); a
    # Command from resolve: read settings from argv.flags (or plan.flag), never the words
    env: dict[str, str]
    speculative_config: dict  # the exact object serialised into argv's --speculative-config
    adaptive_verification: bool
    block_argv: Command | None = None  # full block verification: always set by resolve()
    notes: tuple[Note, ...] = ()
    adaptive_argv: Command | None = None  # adaptive verification on; None where not allowed
    build: Build | None = None
    tp: int = 1
    dp: int = 1
    ep: int = 1  # 1 (off) or tp x dp
    pp: int = 1
    nodes: int = 1
    dp_local: int = 1  # data-parallel ranks on each node
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    capture_size: int = 0  # --max-cudagraph-capture-size
    k: int = 0  # num_speculative_tokens (0: no speculative decoding)
    concurrency: int | None = None
    memory: Memory | None = None
    model_path: str | None = None  # --model-path: a local checkpoint (container modes mount it read-only)
    # name -> value for every --env: delivered only through the 0600 env file (rocm_dspark/recipe/secret_env.py);
    # to_json_dict keeps the names, never the values.
    secret_env: dict = {}

    def flag(self, dest: str, default=None):
        """The running command's value for vLLM `dest` (None for a bare flag); `default` when it is not set."""
        pairs = flag_pairs(self.argv)
        return default if pairs is None else pairs.get(dest, default)

    @property
    def gpus_per_node_used(self) -> int:
        """GPUs this node runs: TP x local DP x PP."""
        return self.tp * self.dp_local * self.pp

    def to_json_dict(self) -> dict:
        d = self._asdict()
        d["env"] = dict(self.env)
        d["secret_env"] = sorted(self.secret_env)
        d["speculative_config"] = dict(self.speculative_config)
        d["argv"] = list(self.argv)
        d["block_argv"] = list(self.block_argv) if self.block_argv else None
        d["adaptive_argv"] = list(self.adaptive_argv) if self.adaptive_argv else None
        d["evidence"] = list(self.evidence)
        d["notes"] = [n._asdict() for n in self.notes]
        if self.build is not None:
            b = self.build._asdict()
            b["changes"], b["evidence"] = list(self.build.changes), list(self.build.evidence)
            b["facts"] = {k: dict(v) for k, v in self.build.facts.items()}
            b["gpus"] = {k: list(v) for k, v in self.build.gpus.items()}
            b["resolution"] = dict(self.build.resolution)
            d["build"] = b
        if self.memory is not None:
            m = self.memory._asdict()
            m["sources"] = list(self.memory.sources)
            d["memory"] = m
        return d

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_json_dict(), indent=2, sort_keys=False)
