"""Builds as data: every flag provably accepted by the build it runs on (by the table here; by vLLM's own
parser in tests/slow/test_parser_real.py), per-GPU defaults, the image matching its build, the workload
rules, and the memory model against InferenceX's published KV headroom."""

import json

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.resolve import Selection, flag_verdict, resolve
from tests.conftest import FIXTURES, cli_env
from tests.helpers import run_cli

CAT = load_catalog()
V41 = "DeepSeek-V4.1-Flash"


def flags(argv):
    """{flag: value or None} of a command, read as vLLM reads it (Command.from_words)."""
    return dict(Command.from_words(argv).flags)


# (build, --engram-config emitted, --no-swa-bounded-replay emitted, adaptive verification natively accepted)
# straight from what recipes/vllm.yaml establishes for each build (and why, in the comments).
FEATURE_TABLE = {
    "nightly-eed1f3d0": (False, False, "refused"),        # before #57491 and #56227 (InferenceX notes)
    "nightly-3df4ae15": (True, True, "refused"),          # #57491, #56227 in; #57906 not established
    "nightly-rocm100-ac9126e5": (True, True, "refused"),  # same; also #58671, #53492
    "v0.32.0": (True, False, "refused"),                  # #57906 in the wheel: ROCm turns replay off itself
    "v0.33.0": (True, False, "native"),                   # #58151 in the wheel
    "v0.33.0-rocm72": (True, False, "native"),            # the same release on the legacy ROCm 7.2 stack
    "v0.33.0-rocm100": (True, False, "native"),           # the same release, the ROCm 10.0 variant tag
}


def test_every_build_has_a_row_and_every_row_a_build():
    v41_builds = {b for b in CAT.builds if CAT.contains(CAT.builds[b], "vllm#56214")}
    assert v41_builds == set(FEATURE_TABLE)


@pytest.mark.parametrize("gpu", ["mi300x", "mi325x", "mi350x", "mi355x"])
@pytest.mark.parametrize("build", sorted(FEATURE_TABLE))
def test_feature_gated_flags_follow_the_build(gpu, build):
    engram, no_replay, av = FEATURE_TABLE[build]
    plan = resolve(CAT, Selection(model=V41, gpu=gpu, build=build))
    for argv in (plan.block_argv, plan.adaptive_argv):
        f = flags(argv)
        assert ("--engram-config" in f) is engram
        assert ("--no-swa-bounded-replay" in f) is no_replay
    assert plan.build.name == build and plan.build.adaptive_on_rocm_v41 == av
    # The image always matches the build: the digest where published, else the build's tag.
    b = CAT.builds[build]
    assert plan.image == (b.image if b.digest else b.image_tag)
    assert plan.image.endswith(b.digest) if b.digest else plan.image == b.image_tag
    # a dropped flag is said once: in its workaround's note when one added it, else as a build-flags note
    dropped = [n.text for n in plan.notes if n.topic == "build flags" or n.text.startswith("not applied: ")]
    assert len(dropped) == (not engram) + (not no_replay)
    for text in dropped:
        assert f"build {build}" in text and "vllm#" in text


def test_flag_rules_come_from_the_change_table():
    eed, b033 = CAT.builds["nightly-eed1f3d0"], CAT.builds["v0.33.0"]
    assert flag_verdict(CAT, eed, "--engram-config")[0] is False
    assert "lacks vllm#57491" in flag_verdict(CAT, eed, "--engram-config")[1]
    keep, why = flag_verdict(CAT, b033, "--no-swa-bounded-replay")
    assert not keep and "not needed on build v0.33.0, which contains vllm#57906" in why
    assert flag_verdict(CAT, b033, "--max-model-len") == (True, "")


def test_each_gpu_defaults_to_a_release_and_its_evidence_builds_are_named():
    got = {g: resolve(CAT, Selection(model=V41, gpu=g)).build.name for g in CAT.gpus}
    assert got == {"mi300x": "v0.33.0-rocm72", "mi325x": "v0.33.0-rocm72", "mi355x": "v0.33.0", "mi350x": "v0.33.0"}
    # The public evidence is shown for what it is: evidence for another build (MI350X has none at all).
    notes = {n.topic: n.text for n in resolve(CAT, Selection(model=V41, gpu="mi300x")).notes}
    assert "is for another build: nightly-3df4ae15" in notes["evidence"]
    notes = {n.topic: n.text for n in resolve(CAT, Selection(model=V41, gpu="mi350x")).notes}
    assert notes["evidence"].startswith("no public V4.1 run on mi350x with v0.33.0;") and "another build" not in notes["evidence"]


def test_vllm_version_maps_onto_builds_and_versions_are_labels():
    by_version = resolve(CAT, Selection(model=V41, gpu="mi355x", vllm_version="0.33.0"))
    by_build = resolve(CAT, Selection(model=V41, gpu="mi355x", build="v0.33.0"))
    assert by_version.image == by_build.image == "vllm/vllm-openai-rocm:v0.33.0"
    assert by_version.argv == by_build.argv and by_version.build.name == "v0.33.0"
    # A nightly's reported version is a label: 0.30.1rc1.dev493 does not make ac9126e5 a 0.30 "feature set".
    ac = CAT.builds["nightly-rocm100-ac9126e5"]
    assert ac.reported_version == "0.30.1rc1.dev493" and "vllm#58151" not in ac.changes
    assert CAT.builds["nightly-eed1f3d0"].reported_version is None  # not "0.30.0.dev" as once assumed


def test_every_change_fact_says_how_it_was_established():
    for b in CAT.builds.values():
        for change, fact in b.facts.items():
            if fact["in"] is not None:
                assert fact["how"] in ("ancestry", "wheel", "parser", "note") and fact["source"], (b.name, change)
        assert b.digest is None or b.digest.startswith("sha256:") and len(b.digest) == 71


def test_unpublished_digests_are_not_invented():
    # Only eed1f3d0's digest is publicly recorded (InferenceX #3058 / recipes #968 commands).
    assert {b.name for b in CAT.builds.values() if b.digest} == {"nightly-eed1f3d0"}


# ---- workload rules (--concurrency) ----

@pytest.mark.parametrize("tp,conc,mnbt,offload", [
    (4, 1, 16384, False), (4, 32, 16384, False), (4, 64, 16384, False), (4, 128, 8192, True),
    (2, 32, 16384, True), (2, 64, 8192, True), (2, 128, 4096, True),
])
def test_mi355x_batch_tokens_and_engram_follow_concurrency(tp, conc, mnbt, offload):
    plan = resolve(CAT, Selection(model=V41, gpu="mi355x", tp=tp, concurrency=conc))
    f = flags(plan.argv)
    assert plan.max_num_batched_tokens == mnbt == int(f["--max-num-batched-tokens"])
    assert json.loads(f["--engram-config"]) == {"cpu_offload": offload}
    assert plan.concurrency == conc
    # Capture stays max_num_seqs x (1+K) rounded up to a power of two.
    assert plan.capture_size >= plan.max_num_seqs * 6 and plan.capture_size & (plan.capture_size - 1) == 0
    assert plan.max_num_seqs == max(128, 2 * conc)


def test_explicit_limits_beat_the_workload_rules():
    plan = resolve(CAT, Selection(model=V41, gpu="mi355x", tp=2, concurrency=128, max_num_batched_tokens=16384,
                                  max_num_seqs=128))
    assert (plan.max_num_batched_tokens, plan.max_num_seqs) == (16384, 128)


def test_small_batch_tokens_keep_max_num_seqs_at_the_capture_shape():
    plan = resolve(CAT, Selection(model=V41, gpu="mi355x", tp=2, concurrency=128))
    assert plan.max_num_batched_tokens == 4096 and plan.max_num_seqs * 6 <= plan.capture_size <= 4096
    note = {n.topic: n.text for n in plan.notes}["workaround engram-profiling"]  # recipes/workarounds.yaml
    assert "engram projection faults" in note.lower()


# ---- memory model ----

def _kv(point):
    sel = Selection(model=V41, gpu=point["gpu"], tp=point["tp"], max_num_batched_tokens=point["max_num_batched_tokens"],
                    build="v0.33.0", memory_override=True)
    # Engram placement as published: resident = cpu_offload false.
    cat = CAT
    model = cat.models[V41]
    prof = model.profiles[point["gpu"]]
    engram = {**(prof.engram_cpu_offload or {}), str(point["tp"]): point["engram"] == "offload"}
    model.profiles[point["gpu"]] = prof._replace(engram_cpu_offload=engram)
    try:
        return resolve(cat, sel).memory
    finally:
        model.profiles[point["gpu"]] = prof


def test_memory_model_reproduces_the_published_kv_headroom_within_its_stated_error():
    points = json.loads((FIXTURES / "public" / "kv_headroom.json").read_text())["points"]
    err = CAT.models[V41].memory["error_gib"]
    residuals = []
    for p in points:
        mem = _kv(p)
        residuals.append(mem.kv_gib - p["kv_gib"])
        assert abs(mem.kv_gib - p["kv_gib"]) <= err, (p, mem.kv_gib)
    # The stated error is not padding: the worst point uses most of it.
    assert max(abs(r) for r in residuals) > 0.8 * err


def test_mi300x_tp2_is_refused_with_the_numbers():
    with pytest.raises(UsageError) as exc:
        resolve(CAT, Selection(model=V41, gpu="mi300x", tp=2))
    text = str(exc.value)
    assert "no room for KV cache" in text and "mi300x TP2" in text and "172.8 GiB usable" in text
    assert "KV -27.6 GiB" in text and "--memory-override" in text and "\n" not in text
    plan = resolve(CAT, Selection(model=V41, gpu="mi300x", tp=2, memory_override=True))
    assert plan.memory.override and plan.memory.kv_gib < 0
    assert "OVERRIDDEN" in {n.topic: n.text for n in plan.notes}["memory"]


def test_feasible_layouts_say_their_kv_capacity():
    plan = resolve(CAT, Selection(model=V41, gpu="mi355x"))
    mem = plan.memory
    assert mem.kv_gib > 0 and mem.kv_tokens > 0 and mem.kv_multiples == round(mem.kv_tokens / 1048576, 2)
    assert f"{mem.kv_tokens:,} tokens" in {n.topic: n.text for n in plan.notes}["memory"]


# ---- the CLI: each bad input is one line and exit 2 ----

@pytest.mark.parametrize("args,message", [
    (["--build", "nightly-deadbeef"], "unknown vLLM build 'nightly-deadbeef'"),
    (["--build", "nightly"], "is not shown to contain DeepSeek-V4.1-Flash"),
    (["--build", "nightly-eed1f3d0", "--vllm-arg", "--engram-config={}"], "nightly-eed1f3d0 cannot parse it"),
    (["--gpu", "mi300x", "--tp", "2"], "no room for KV cache"),
    (["--concurrency", "0"], "'--concurrency': every level must be at least 1"),
    (["--gpu", "h100"], "unknown GPU 'h100'; known GPUs: mi300x, mi325x, mi350x, mi355x"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run_cli(["recipe", "--model", "V4.1-Flash", *args], capture_output=True, text=True,
                          env=cli_env(), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_prints_the_0_33_0_image():
    for args in (["--vllm-version", "0.33.0"], ["--build", "v0.33.0"]):
        proc = run_cli(["recipe", "--model", "V4.1-Flash", *args, "--format", "json"], capture_output=True,
                              text=True, env=cli_env())
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["image"] == "vllm/vllm-openai-rocm:v0.33.0"


def test_list_shows_the_builds():
    proc = run_cli(["list", "--json"], capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    builds = json.loads(proc.stdout)["builds"]
    assert builds["v0.33.0"]["digest"] is None and builds["v0.33.0"]["image"] == "vllm/vllm-openai-rocm:v0.33.0"
    assert builds["nightly-3df4ae15"]["evidence_on"].keys() == {"mi300x", "mi325x"}


def test_docker_form_says_when_the_image_is_unresolved():
    from rocm_dspark.launch.render import render_docker

    text = render_docker(resolve(CAT, Selection(model=V41, gpu="mi355x", build="v0.33.0")))
    assert "# image: vllm/vllm-openai-rocm:v0.33.0\n# unresolved here: `rocm-dspark images`" in text
    assert "unresolved here" not in render_docker(resolve(CAT, Selection(model=V41, gpu="mi355x",
                                                                          build="nightly-eed1f3d0")))


def test_concurrency_without_rules_says_it_changes_nothing():
    plan = resolve(CAT, Selection(model="V4-Flash", gpu="mi300x", concurrency=64))
    base = resolve(CAT, Selection(model="V4-Flash", gpu="mi300x"))
    assert plan.argv == base.argv and plan.concurrency == 64
    assert "changes nothing" in {n.topic: n.text for n in plan.notes}["workload"]


def test_memory_budget_adds_up():
    mem = resolve(CAT, Selection(model=V41, gpu="mi300x")).memory
    parts = mem.margin_gib + mem.weights_gib + mem.engram_gib + mem.indexer_gib + mem.kv_gib
    assert abs(parts - mem.usable_gib) < 0.05 and mem.engram_gib > 0  # TP8 keeps the tables resident


@pytest.mark.parametrize("token", ['--engram_config={"cpu_offload":true}', "--engram-config.cpu_offload=true"])
def test_a_flag_the_build_cannot_parse_is_refused_in_every_spelling_vllm_reads(token):
    with pytest.raises(UsageError, match="nightly-eed1f3d0 cannot parse it"):
        resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x", build="nightly-eed1f3d0", extra_args=(token,)))


def test_a_workaround_whose_flag_the_build_drops_says_it_is_not_applied():
    """v0.33.0 contains vllm#57906, so --no-swa-bounded-replay is left out; its workaround note must not claim
    the flag (it did: 'workaround rocm-no-swa-bounded-replay: --no-swa-bounded-replay' next to 'left out')."""
    notes = {n.topic: n for n in resolve(CAT, Selection(model=V41, gpu="mi355x", build="v0.33.0")).notes}
    w = notes["workaround rocm-no-swa-bounded-replay"]
    assert w.short.startswith("not applied: v0.33.0 has the fix")
    assert w.text.startswith("not applied: --no-swa-bounded-replay left out: not needed on build v0.33.0")
    assert "build flags" not in notes  # said once, in the workaround's own note
    kept = {n.topic: n for n in resolve(CAT, Selection(model=V41, gpu="mi355x", build="nightly-3df4ae15")).notes}
    assert "not applied" not in kept["workaround rocm-no-swa-bounded-replay"].text


def test_a_workarounds_vllm_range_is_read_against_the_builds_reported_version(recipes_copy):
    """recipes/workarounds.yaml `applies.vllm`: the range is matched against the plan's build (its reported
    version); a build with no recorded version keeps the workaround, as the data file says of an unknown one."""
    from tests.helpers.recipes import _break

    _break(
        recipes_copy,
        "workarounds.yaml",
        "    applies: {models: [DeepSeek-V4.1-Flash], gpus: [mi300x]}\n",
        "    applies: {models: [DeepSeek-V4.1-Flash], gpus: [mi300x], vllm: '<0.33.0'}\n",
    )
    cat = load_catalog(recipes_copy)
    topic = "workaround gfx942-full-decode-only"

    def has(build):
        plan = resolve(cat, Selection(model=V41, gpu="mi300x", build=build))
        return topic in {n.topic for n in plan.notes}

    assert cat.builds["v0.32.0"].reported_version == "0.32.0" and has("v0.32.0")
    assert cat.builds["v0.33.0"].reported_version == "0.33.0" and not has("v0.33.0")
