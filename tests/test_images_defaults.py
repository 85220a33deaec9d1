"""Release-first builds: every GPU's default plan (the goldens) names a release image containing every change
the plan needs; nightlies carry their retention rule; public evidence is shown as evidence for its own build."""

import json
from pathlib import Path

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.images import pick
from rocm_dspark.recipe.resolve import Selection, resolve

CAT = load_catalog()
GOLDEN = Path(__file__).parent / "golden"
V41 = "DeepSeek-V4.1-Flash"


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*__default__*.json")), ids=lambda p: p.name)
def test_every_default_golden_names_a_release_image(path):
    golden = json.loads(path.read_text())
    plan = resolve(CAT, Selection(model=golden["model_key"], gpu=golden["gpu"]))
    assert plan.build.channel == "release" and golden["build"]["channel"] == "release", path.name
    assert plan.image == plan.build.image_tag == golden["image"] and ":v0.33.0" in plan.image
    assert "unresolved" in next(n.text for n in plan.notes if n.topic == "image")


@pytest.mark.parametrize("gpu", sorted(CAT.gpus))
def test_the_default_release_contains_every_change_the_plan_needs(gpu):
    plan = resolve(CAT, Selection(model=V41, gpu=gpu))
    b = plan.build
    assert b.channel == "release" and b.reported_version == "0.33.0"
    assert all(CAT.contains(b, c) is True for c in CAT.models[V41].requires)
    # No flag of the profile is dropped because the build lacks it (only where the build does it itself).
    assert not [n for n in plan.notes if n.topic == "build flags" and "left out: build" in n.text]
    evidence = next(n.text for n in plan.notes if n.topic == "evidence")
    assert f"no public V4.1 run on {gpu} with {b.name}" in evidence and "validate" in evidence


def test_stack_variant_per_architecture():
    got = {g: resolve(CAT, Selection(model=V41, gpu=g)).build.name for g in CAT.gpus}
    assert got == {"mi300x": "v0.33.0-rocm72", "mi325x": "v0.33.0-rocm72", "mi350x": "v0.33.0", "mi355x": "v0.33.0"}
    assert CAT.builds["v0.33.0-rocm72"].rocm == "7.2" and CAT.builds["v0.33.0"].rocm is None
    for arch, d in CAT.arch_defaults.items():
        assert d["reason"] and d["source"].startswith("https://")
    # --vllm-version 0.33.0 takes the arch's variant.
    assert resolve(CAT, Selection(model=V41, gpu="mi300x", vllm_version="0.33.0")).build.name == "v0.33.0-rocm72"


def test_an_old_nightly_says_in_one_line_it_is_probably_gone_and_names_the_release():
    plan = resolve(CAT, Selection(model=V41, gpu="mi300x", build="nightly-3df4ae15", today="2026-12-01"))
    gone = [n.text for n in plan.notes if n.topic == "build gone"]
    assert len(gone) == 1 and "\n" not in gone[0]
    assert "probably gone" in gone[0] and "last 14 nightly builds" in gone[0] and "71 days" in gone[0]
    assert gone[0].endswith("(--build v0.33.0-rocm72)")
    evidence = next(n.text for n in plan.notes if n.topic == "evidence")
    assert "public V4.1 evidence on mi300x with this build" in evidence
    # Within its window (as of the day after it was built) it is not called gone; releases never are.
    fresh = resolve(CAT, Selection(model=V41, gpu="mi300x", build="nightly-3df4ae15", today="2026-09-22"))
    assert not [n for n in fresh.notes if n.topic == "build gone"]
    assert not [n for n in resolve(CAT, Selection(model=V41, gpu="mi300x", today="2027-06-01")).notes
                if n.topic == "build gone"]


def test_day_numbers_match_the_calendar():
    import datetime

    for a, b in (("2026-09-21", "2026-12-01"), ("2024-02-28", "2024-03-01"), ("1999-12-31", "2000-03-01")):
        want = (datetime.date.fromisoformat(b) - datetime.date.fromisoformat(a)).days
        assert pick._day(b) - pick._day(a) == want
    assert pick._day("2026-11") == pick._day("2026-11-01")


def _answer(exists, digest=None, rocm=None):
    return {"exists": exists, "digest": digest, "stack": {"rocm": rocm, "source": "config env ROCM_VERSION"} if rocm else None,
            "answer": "HTTP 200" if exists else "HTTP 404 MANIFEST_UNKNOWN (manifest unknown)",
            "registry": "registry-1.docker.io", "via": "http", "checked_at": "2026-12-01T12:00:00Z"}


def test_resolution_is_an_input_digest_when_held_one_line_error_when_gone():
    d = "sha256:" + "e" * 64
    images = (("vllm/vllm-openai-rocm:v0.33.0-rocm72", _answer(True, d, "7.2.3")),)
    plan = resolve(CAT, Selection(model=V41, gpu="mi300x", images=images))
    assert plan.image == f"vllm/vllm-openai-rocm@{d}" and plan.build.resolution["digest"] == d
    note = next(n.text for n in plan.notes if n.topic == "image")
    assert "resolved on this host" in note and "ROCm 7.2.3" in note
    gone = (("vllm/vllm-openai-rocm:v0.33.0-rocm72", _answer(False)), ("vllm/vllm-openai-rocm:v0.33.0", _answer(False)))
    with pytest.raises(UsageError) as exc:
        resolve(CAT, Selection(model=V41, gpu="mi300x", images=gone))
    assert "\n" not in str(exc.value) and "MANIFEST_UNKNOWN" in str(exc.value)
    # A published digest keeps running whatever its tag does now, and says the tag is gone.
    eed = resolve(CAT, Selection(model=V41, gpu="mi355x", build="nightly-eed1f3d0", images=(
        ("vllm/vllm-openai-rocm:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657", _answer(False)),)))
    assert eed.image.endswith(CAT.builds["nightly-eed1f3d0"].digest)
    assert "gone from the registry" in next(n.text for n in eed.notes if n.topic == "image")


@pytest.mark.parametrize("gpu", sorted(CAT.gpus))
def test_the_stack_variants_run_exactly_the_argv_vllm_033s_parser_checks(gpu):
    """tests/slow/test_parser_real.py parses the v0.33.0 plans with 0.33.0's own parser; the -rocm72/-rocm100
    variants are the same release (same commit and change facts), so their argv must be exactly those."""
    ref = resolve(CAT, Selection(model=V41, gpu=gpu, build="v0.33.0"))
    for name in ("v0.33.0-rocm72", "v0.33.0-rocm100"):
        b = CAT.builds[name]
        assert b.vllm_commit == CAT.builds["v0.33.0"].vllm_commit and b.facts == CAT.builds["v0.33.0"].facts
        plan = resolve(CAT, Selection(model=V41, gpu=gpu, build=name))
        assert (plan.block_argv, plan.adaptive_argv, plan.env) == (ref.block_argv, ref.adaptive_argv, ref.env)


def test_the_recipe_path_never_imports_the_registry_code(tmp_path):
    """`recipe` reads the cache (json, os) and pick (pure); registry, report, pull and httpx stay out."""
    import os
    import subprocess
    import sys

    code = ("import sys; from rocm_dspark.cli import main\n"
            "try:\n    main(['recipe', '--model', 'V4.1-Flash', '--gpu', 'mi300x', '--format', 'docker'])\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('rocm_dspark.images', 'httpx'))), file=sys.stderr)")
    env = dict(os.environ, ROCM_DSPARK_STATE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stderr.strip().splitlines()[-1] == "['rocm_dspark.images', 'rocm_dspark.images.cache', 'rocm_dspark.images.pick']"
