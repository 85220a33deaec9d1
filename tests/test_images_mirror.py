"""--image REF and --registry HOST[:PORT] (issue 27): the pure mapping, the plan's notes, the build the plan follows
from the image's own vLLM, `images` against a mirror (the registry answer is an input: a resolver function)."""


import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.images import pick, report
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.usecase.launch_plan import plan_for
from tests.helpers import run_cli


@pytest.mark.parametrize("image,mirror,want", [
    ("vllm/vllm-openai-rocm:v0.33.0", "harbor:5000", "harbor:5000/vllm/vllm-openai-rocm:v0.33.0"),
    ("ubuntu:24.04", "m.example.com", "m.example.com/library/ubuntu:24.04"),
    ("127.0.0.1:5000/a/b:1", "127.0.0.1:6000", "127.0.0.1:6000/a/b:1"),
    ("localhost/a:1", "m:1", "m:1/a:1"),
    ("ghcr.io/x/y@sha256:" + "a" * 64, "m:1", "m:1/x/y@sha256:" + "a" * 64),
    ("vllm/x:1", None, "vllm/x:1"),
])
def test_on_mirror_keeps_repository_and_tag(image, mirror, want):
    assert pick.on_mirror(image, mirror) == want


@pytest.mark.parametrize("bad", ["http://m:5000", "m:5000/path", "", "m:port", "-m"])
def test_a_bad_mirror_is_one_line(bad):
    with pytest.raises(UsageError, match=r"^--registry .*HOST or HOST:PORT"):
        pick.check_mirror(bad)


@pytest.mark.parametrize("bad", ["Upper/Case:1", "a/b:bad tag", "a/b@sha256:12", "a//b"])
def test_a_bad_image_reference_is_one_line(bad):
    with pytest.raises(UsageError, match=r"^--image .* is not an image reference"):
        pick.check_ref(bad)


def _plan(**opts):
    return plan_for({"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": "/nonexistent-i27", **opts})


def test_registry_maps_the_builds_image_and_says_so():
    _, _, plain = _plan()
    _, _, plan = _plan(registry="mirror.local:5000")
    assert plan.image == pick.on_mirror(plain.image, "mirror.local:5000") != plain.image
    assert plan.build.image_tag == pick.on_mirror(plain.build.image_tag, "mirror.local:5000")
    note = next(n.text for n in plan.notes if n.topic == "registry")
    assert note.startswith("--registry mirror.local:5000: every image maps to the same repository and tag there")


def test_image_without_its_software_assumes_the_selected_build_and_says_so():
    _, _, plan = _plan(image="127.0.0.1:5000/rocm-dspark/vllm-cpu-test:0.32.0", registry="127.0.0.1:6000")
    assert plan.image == "127.0.0.1:6000/rocm-dspark/vllm-cpu-test:0.32.0" and plan.build.digest is None
    note = next(n.text for n in plan.notes if n.topic == "image source")
    assert "its own vLLM version is not read on this host yet" in note and "assumes" in note


def test_image_follows_the_vllm_the_in_image_probe_read():
    facts = {"vllm_version": "0.32.0+cpu", "vllm_commit": None, "torch_version": "2.13.0+cpu", "hip_version": None,
             "rocm_version": None}
    _, _, plan = _plan(image="r:1/x/y:1", image_software=facts)
    assert plan.build.name == load_catalog().find_build("0.32.0").name
    note = next(n.text for n in plan.notes if n.topic == "image source")
    assert "planned as build v0.32.0 because the in-image probe" in note and "is 0.32.0+cpu" in note


def test_image_with_a_vllm_no_build_is_planned_as_the_selected_one_and_said():
    _, _, plan = _plan(image="r:1/x/y:1", image_software={"vllm_version": "0.29.9"})
    note = next(n.text for n in plan.notes if n.topic == "image source")
    assert "says vLLM 0.29.9, which no build in recipes/vllm.yaml is" in note


def test_images_asks_the_mirror_and_reads_a_version_label(tmp_path):
    asked = []

    def resolver(tag):  # a registry's answer, as registry.resolve returns it
        asked.append(tag)
        return {"exists": True, "digest": "sha256:" + "c" * 64, "stack": None, "answer": "manifest found",
                "registry": tag.split("/")[0], "via": "skopeo", "checked_at": "2026-12-01T00:00:00Z",
                "vllm_version": "0.32.0", "vllm_source": "label vllm.version"}

    cat = load_catalog()
    result = report.run(cat, tmp_path, cat.find_gpu("mi300x"), resolver=resolver, mirror="m:5000")
    assert asked and all(t.startswith("m:5000/") for t in asked)
    assert result["runs"]["image"].startswith("m:5000/") and "@sha256:" + "c" * 64 in result["runs"]["image"]
    one = report.run(cat, tmp_path, None, resolver=resolver, image="m:5000/rocm-dspark/vllm-cpu-test:0.32.0")
    assert [r["tag"] for r in one["images"]] == ["m:5000/rocm-dspark/vllm-cpu-test:0.32.0"]
    assert one["runs"]["image"] == "m:5000/rocm-dspark/vllm-cpu-test@sha256:" + "c" * 64
    assert any("vLLM 0.32.0" in ln for ln in report.lines(one))
    # The recorded answer reaches the plan: --image follows the label's vLLM.
    _, _, plan = plan_for({"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path),
                           "image": "m:5000/rocm-dspark/vllm-cpu-test:0.32.0"})
    assert plan.image == "m:5000/rocm-dspark/vllm-cpu-test@sha256:" + "c" * 64
    assert "`rocm-dspark images` (label vllm.version)" in next(n.text for n in plan.notes if n.topic == "image source")


def test_cli_bad_registry_is_one_line_exit_2(tmp_path):
    r = run_cli(["recipe", "-m", "V4.1-Flash", "--gpu", "mi300x",
                        "--registry", "https://m:5000"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--registry" in r.stderr, r.stderr
