"""The resolver: golden plans per profile, agreement with the public MI355X command, the layer rules."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.plan import flag_pairs
from rocm_dspark.recipe.resolve import Selection, Verdict, resolve
from tests.conftest import FIXTURES

GOLDEN = Path(__file__).parent / "golden"
CAT = load_catalog()
PROFILES = [(m, g) for m in CAT.models for g in CAT.models[m].profiles]
V41_BUILDS = [b for b in CAT.builds if CAT.contains(CAT.builds[b], "vllm#56214")]
# (model, gpu, build or None = the GPU's default, concurrency, tp or None = the profile's)
GOLDEN_CASES = (
    [(m, g, None, None, None) for m, g in PROFILES]
    + [("DeepSeek-V4.1-Flash", g, b, None, None) for g in CAT.gpus for b in V41_BUILDS]
    + [("DeepSeek-V4.1-Flash", "mi355x", None, c, tp) for tp in (4, 2) for c in (32, 64, 128)]
    + [("DeepSeek-V4.1-Flash", g, None, 32, None) for g in ("mi300x", "mi325x")]
)


def golden_name(model, gpu, build, conc, tp) -> str:
    return f"{model}__{gpu}__{build or 'default'}__c{conc or 'none'}" + (f"__tp{tp}" if tp else "") + ".json"


def flags(argv):
    """{flag: value or None}: a plan's typed flags (recipe/plan.py Command); the public recipe's command, an
    outside text, by its words (positional words after `vllm serve` are skipped)."""
    pairs = flag_pairs(argv)
    if pairs is not None:
        return dict(pairs)
    out, i = {}, 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def golden_view(plan) -> dict:
    """What a golden pins: the plan's structure, argv and env, and its note topics (in order). The notes' prose
    lives in a few snapshots (NOTE_SNAPSHOTS), so one wording change rewrites those, not every golden."""
    d = plan.to_json_dict()
    d["note_topics"] = [n["topic"] for n in d.pop("notes")]
    b = d.pop("build")
    d["build"] = {k: b[k] for k in ("name", "image_tag", "digest", "channel", "reported_version", "rocm",
                                    "adaptive_on_rocm_v41")}
    if d["memory"]:
        d["memory"] = {k: v for k, v in d["memory"].items() if k != "sources"}
    return d


def _check_golden(path: Path, got) -> None:
    if os.environ.get("ROCM_DSPARK_UPDATE_GOLDENS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("model,gpu,build,conc,tp", GOLDEN_CASES, ids=lambda v: str(v))
def test_golden_plan_per_profile_build_and_concurrency(model, gpu, build, conc, tp):
    """Every (profile, build, concurrency) resolves, and to exactly the reviewed plan in tests/golden/
    (regenerate with ROCM_DSPARK_UPDATE_GOLDENS=1 and review the diff)."""
    plan = resolve(CAT, Selection(model=model, gpu=gpu, build=build, concurrency=conc, tp=tp))
    _check_golden(GOLDEN / golden_name(model, gpu, build, conc, tp), golden_view(plan))


# The notes' full prose (text and short), for a few plans that between them carry every kind of note.
NOTE_SNAPSHOTS = (("DeepSeek-V4.1-Flash", "mi300x", None, None, None), ("DeepSeek-V4.1-Flash", "mi355x", None, 128, 2),
                  ("DeepSeek-V4.1-Flash", "mi355x", "nightly-3df4ae15", None, None),
                  ("DeepSeek-V4-Flash", "mi300x", None, None, None))


@pytest.mark.parametrize("model,gpu,build,conc,tp", NOTE_SNAPSHOTS, ids=lambda v: str(v))
def test_note_prose_snapshot(model, gpu, build, conc, tp):
    plan = resolve(CAT, Selection(model=model, gpu=gpu, build=build, concurrency=conc, tp=tp))
    notes = [n._asdict() for n in plan.notes]
    _check_golden(GOLDEN / "notes" / golden_name(model, gpu, build, conc, tp), notes)


def test_the_note_snapshots_cover_every_note_topic_of_the_goldens():
    seen = set()
    for case in NOTE_SNAPSHOTS:
        seen |= {n["topic"].split(" ")[0] for n in json.loads((GOLDEN / "notes" / golden_name(*case)).read_text())}
    golden = {t.split(" ")[0] for p in GOLDEN.glob("*.json") for t in json.loads(p.read_text())["note_topics"]}
    assert golden <= seen, f"note kinds no snapshot shows in full: {sorted(golden - seen)}"


def _public_mi355x():
    """The public recipe's MI355X command -> (argv of vllm serve, env exported in the container, image tag)."""
    text = (FIXTURES / "public" / "mi355x_benchmark_command.sh").read_text()
    spec = re.search(r"^SPEC_CONFIG='(.*)'$", text, re.M).group(1)
    env = {}
    for line in re.findall(r"^export (.*)$", text, re.M):
        for word in shlex.split(line):
            key, _, value = word.partition("=")
            env[key] = value
    cmd = re.search(r"^exec (vllm serve .*?)\nBASH", text, re.M | re.S).group(1).replace("\\\n", " ")
    cmd = cmd.replace('"$SPEC_CONFIG"', shlex.quote(spec)).replace('"$PORT"', "8000")
    image = re.search(r"--entrypoint /bin/bash (\S+)", text).group(1)
    return shlex.split(cmd), env, image


def test_mi355x_plan_agrees_with_the_public_recipe_command():
    """The public command (recipes #968 / InferenceX #3058) ran nightly-eed1f3d0: the plan for that build matches it."""
    public_argv, public_env, public_image = _public_mi355x()
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", build="nightly-eed1f3d0"))
    assert plan.argv[:3] == tuple(public_argv[:3])
    ours, theirs = flags(plan.argv), flags(public_argv)
    for flag, value in theirs.items():
        assert flag in ours, f"{flag} missing from our MI355X plan"
        if flag == "--speculative-config":
            assert json.loads(ours[flag]) == json.loads(value)
        else:
            assert ours[flag] == value, flag
    # Harness-only variables are left out: GPU pinning is the operator's (HIP_VISIBLE_DEVICES conflicts
    # with ROCm's advice to use CUDA_VISIBLE_DEVICES) and GPU_COUNT is the benchmark script's own.
    for key, value in public_env.items():
        if key in ("HIP_VISIBLE_DEVICES", "GPU_COUNT"):
            continue
        assert plan.env.get(key) == value, key
    assert public_image == CAT.builds["nightly-eed1f3d0"].image_tag == plan.build.image_tag


def test_gfx942_profiles_carry_the_day_zero_differences():
    """docs/deployment.md (gfx942): what InferenceX needed on gfx942 that the generator missed."""
    # On the build InferenceX ran (the defaults are releases that turn replay off by themselves: test_images_defaults).
    mi300 = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", build="nightly-3df4ae15"))
    f = flags(mi300.argv)
    assert f["--tensor-parallel-size"] == "8" and f["--max-num-batched-tokens"] == "8192"
    assert json.loads(f["--compilation-config"]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert mi300.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert "--no-swa-bounded-replay" in f and json.loads(f["--engram-config"]) == {"cpu_offload": False}
    assert f["--moe-backend"] == "aiter"
    mi325 = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi325x", build="nightly-3df4ae15"))
    g = flags(mi325.argv)
    assert g["--tensor-parallel-size"] == "8" and "--moe-backend" not in g
    # InferenceX #3337 repinned MI325X to 3df4ae15 with --no-swa-bounded-replay and explicit Engram placement.
    assert mi325.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1" and "--no-swa-bounded-replay" in g
    assert json.loads(g["--engram-config"]) == {"cpu_offload": False}
    assert "--compilation-config" not in g and g["--max-num-batched-tokens"] == "16384"
    # Engram offload follows TP on MI300X: on at TP4.
    tp4 = flags(resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", tp=4)).argv)
    assert json.loads(tp4["--engram-config"]) == {"cpu_offload": True}


@pytest.mark.parametrize("gpu", sorted(CAT.gpus))
def test_amd_default_is_block_verification_with_a_reason(gpu):
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu=gpu))
    spec = json.loads(flags(plan.argv)["--speculative-config"])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic",
                    "rejection_sample_method": "block", "enable_adaptive_verification": False}
    assert not plan.adaptive_verification and plan.argv == plan.block_argv and plan.adaptive_argv is not None
    notes = {n.topic: n.text for n in plan.notes}
    assert notes["adaptive verification"].startswith("OFF: full 5-token block verification")
    # The default releases accept it natively; the gate still keeps it off until this host proves it.
    assert "supports it natively" in notes["adaptive verification"] and "not been proven on this host" in notes["adaptive verification"]


def test_a_proven_verdict_turns_adaptive_on_and_keeps_a_block_fallback():
    verdict = Verdict(True, "static, kernel and live passed", "rec-123")
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x"), verdict)
    assert plan.adaptive_verification
    assert json.loads(flags(plan.argv)["--speculative-config"])["enable_adaptive_verification"] is True
    block = json.loads(flags(plan.block_argv)["--speculative-config"])
    assert block["enable_adaptive_verification"] is False
    assert [a for a in plan.argv if not a.startswith("{")] == [a for a in plan.block_argv if not a.startswith("{")]
    assert "rec-123" in {n.topic: n.text for n in plan.notes}["adaptive verification"]


def test_native_vllm_still_needs_the_probe():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", vllm_version="0.33.0"))
    assert not plan.adaptive_verification
    note = {n.topic: n.text for n in plan.notes}["adaptive verification"]
    assert "v0.33.0 supports it natively" in note and "it has not been proven on this host" in note


def test_proven_but_not_paying_is_a_verdict_state_not_a_reason_prefix():
    # Was a string contract (reason.startswith("proven on this host")): a gate reason worded otherwise lost the
    # state, and a not-proven reason that happened to start with those words read as "proven, not paying".
    from rocm_dspark.recipe.plan import NOT_PAYING, NOT_PROVEN

    sel = Selection(model="V4.1-Flash", gpu="mi355x")
    not_paying = Verdict.not_paying("holds a proof (record P) but loses 4% at c=64", "p.json")
    assert not_paying.outcome == NOT_PAYING and not not_paying.adaptive_proven
    note = {n.topic: n.text for n in resolve(CAT, sel, not_paying).notes}["adaptive verification"]
    assert note == "OFF: full 5-token block verification. Adaptive verification is holds a proof (record P) but loses 4% at c=64"
    lookalike = Verdict.not_proven("proven on this host by an older record, whose fingerprint no longer matches")
    assert lookalike.outcome == NOT_PROVEN
    note = {n.topic: n.text for n in resolve(CAT, sel, lookalike).notes}["adaptive verification"]
    assert "Run `rocm-dspark probe`" in note and "gate: proven on this host by an older record" in note


@pytest.mark.parametrize("mns,k,expected", [(128, 5, 1024), (64, 5, 512), (1, 1, 8), (256, 3, 1024), (100, 4, 512)])
def test_capture_size_in_the_plan(mns, k, expected):
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", max_num_seqs=mns, num_speculative_tokens=k))
    f = flags(plan.argv)
    assert f["--max-cudagraph-capture-size"] == str(expected)
    assert json.loads(f["--speculative-config"])["num_speculative_tokens"] == k
    assert int(f["--max-num-batched-tokens"]) >= expected


def test_synthetic_only_when_asked_and_said_not_for_serving():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", benchmark_synthetic=3.51))
    spec = json.loads(flags(plan.argv)["--speculative-config"])
    assert spec["rejection_sample_method"] == "synthetic" and spec["synthetic_acceptance_length"] == 3.51
    assert "NOT for serving" in {n.topic: n.text for n in plan.notes}["synthetic"]
    for model, gpu in PROFILES:
        assert "synthetic" not in " ".join(resolve(CAT, Selection(model=model, gpu=gpu)).argv)


def test_user_overrides_come_last_and_replace_in_place():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x",
                                  extra_args=("--max-model-len=65536", "--enforce-eager"),
                                  extra_env=(("VLLM_ENGINE_READY_TIMEOUT_S", "7200"), ("HIP_FORCE_DEV_KERNARG", "1"))))
    f = flags(plan.argv)
    assert f["--max-model-len"] == "65536" and "--enforce-eager" in f
    assert plan.argv.count("--max-model-len") == 1
    assert plan.secret_env == {"VLLM_ENGINE_READY_TIMEOUT_S": "7200", "HIP_FORCE_DEV_KERNARG": "1"}
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in plan.env  # the planned value gives way to the env file's


def test_multi_node_data_parallel():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", nodes=2, dp=4, tp=4, head_address="10.0.0.1"))
    f = flags(plan.argv)
    assert f["--data-parallel-size"] == "4" and f["--data-parallel-size-local"] == "2"
    assert f["--data-parallel-address"] == "10.0.0.1"


def test_expert_parallel():
    f = flags(resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", tp=4, dp=2, ep=8)).argv)
    assert "--enable-expert-parallel" in f and f["--data-parallel-size"] == "2"


@pytest.mark.parametrize("sel,message", [
    (dict(tp=3), "--tp 3 does not divide the 64 query heads"),
    (dict(tp=16), "--tp 16 exceeds the 8 GPUs of one node"),
    (dict(tp=1), "no room for KV cache"),
    (dict(tp=8, dp=2), "needs 16 GPUs per node but a node has 8"),
    (dict(ep=3), "--ep 3 is not possible"),
    (dict(num_speculative_tokens=6), "outside 1..5"),
    (dict(num_speculative_tokens=0), "outside 1..5"),
    (dict(max_num_seqs=0), "--max-num-seqs must be a positive integer"),
    (dict(max_num_seqs=512), "capture size 4096"),
    (dict(max_num_batched_tokens=512), "below the capture size 1024"),
    (dict(nodes=2, dp=2), "--head-address"),
    (dict(vllm_version="0.29.0"), "unknown vLLM build '0.29.0'; known builds: nightly-eed1f3d0"),
    (dict(build="latest"), "unknown vLLM build 'latest'"),
    (dict(build="nightly"), "vLLM build nightly is not shown to contain DeepSeek-V4.1-Flash (vllm#56214"),
    (dict(build="v0.33.0", vllm_version="0.32.0"), "name different builds"),
    (dict(concurrency=0), "--concurrency must be a positive integer"),
    (dict(concurrency=-4), "--concurrency must be a positive integer"),
    (dict(build="nightly-eed1f3d0", extra_args=("--engram-config={}",)),
     "--vllm-arg --engram-config: vLLM build nightly-eed1f3d0 cannot parse it"),
    (dict(build="nightly-eed1f3d0", extra_args=("--no-swa-bounded-replay",)),
     "vLLM build nightly-eed1f3d0 cannot parse it"),
    (dict(benchmark_synthetic=7.0), "must lie in [1, K+1]"),
    (dict(extra_args=("--speculative-config={}",)), "conflicts with what the plan decides"),
    (dict(extra_args=("--max-num-seqs=4",)), "use --max-num-seqs instead"),
    (dict(port=70000), "is not a TCP port"),
])
def test_bad_selection_is_one_clear_line(sel, message):
    with pytest.raises(UsageError) as exc:
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", **sel))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_capture_over_the_cap_suggests_the_fixes():
    with pytest.raises(UsageError) as exc:
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", max_num_seqs=512))
    text = str(exc.value)
    assert "--max-num-seqs 341" in text and "--num-speculative-tokens" in text and "--capture-cap" in text
    ok = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", max_num_seqs=512, capture_cap=4096,
                                max_num_batched_tokens=16384))
    assert flags(ok.argv)["--max-cudagraph-capture-size"] == "4096"


def _compilation(plan):
    argv = list(plan.argv)
    return json.loads(argv[argv.index("--compilation-config") + 1])


@pytest.mark.parametrize("token", ['--compilation-config={"cudagraph_mode":"NONE"}', "--compilation-config.mode=3",
                                   "--compilation_config.cudagraph_mode=PIECEWISE", "-cc.mode=3", "--compilation-config"])
def test_user_compilation_config_cannot_drop_the_plans_graph_mode(token):
    # vLLM keeps the last --compilation-config (dotted keys fold into a last copy), which would silently drop
    # the gfx942 FULL_DECODE_ONLY workaround: these are refused with one line.
    with pytest.raises(UsageError, match="compilation"):
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", extra_args=(token,)))


def test_user_compilation_config_merges_with_the_plans():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", extra_args=('-cc={"mode":3}',)))
    assert _compilation(plan) == {"cudagraph_mode": "FULL_DECODE_ONLY", "mode": 3}
    assert list(plan.argv).count("--compilation-config") == 1
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", extra_args=('--compilation-config={"mode":3}',)))
    assert _compilation(plan) == {"mode": 3}


def test_the_engram_profiling_rule_is_a_recipe_workaround_with_its_evidence():
    # Was a literal in resolve.py's capture layer (6 x 1024 and its evidence in an f-string).
    w = next(w for w in CAT.workarounds if w.id == "engram-profiling")
    assert w.when == {"max_num_batched_tokens_below": 6144} and "InferenceX" in w.evidence and w.remove_when
    low = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", concurrency=128, tp=2))
    assert low.max_num_batched_tokens < 6144 and f"workaround {w.id}" in [n.topic for n in low.notes]
    high = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x"))
    assert high.max_num_batched_tokens >= 6144 and f"workaround {w.id}" not in [n.topic for n in high.notes]
    assert "6 * 1024" not in (Path(__file__).parent.parent / "rocm_dspark/recipe/resolve.py").read_text()


def test_a_user_gpu_memory_utilization_is_what_the_memory_budget_uses():
    # The budget used the profile's 0.9 while vLLM ran the --vllm-arg value (and the group path's redo read the
    # argv's 0.7): two copies of one setting that disagreed.
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", extra_args=("--gpu-memory-utilization=0.7",)))
    assert plan.flag("gpu_memory_utilization") == "0.7"
    assert plan.memory.usable_gib == pytest.approx(plan.memory.hbm_gib * 0.7, abs=0.01)


def test_compact_json_is_json_dumps():
    """resolve writes a plan's flat configs without importing json (the `recipe` start-up path): the same text."""
    import json
    import random

    from rocm_dspark.recipe.resolve import _compact_json

    values = [True, False, None, 0, 1, -5, 10**20, 1.5, float("inf"), "", "a", "FULL_DECODE_ONLY", 'q"', "b\\", "ü",
              "\x7f", "\n", "a b", [1], {"x": 1}]
    keys = ["a", "b c", 'd"', "é", 1, None, True, "num_speculative_tokens", ""]
    rng = random.Random(1)
    for _ in range(3000):
        obj = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 5))}
        assert _compact_json(obj) == json.dumps(obj, separators=(",", ":")), obj
