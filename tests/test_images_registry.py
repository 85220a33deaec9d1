"""Images against a REAL registry on loopback (tests/registry_rig.py: CNCF distribution + skopeo): present and
absent tags, the -rocm72 / -rocm100 variants, a re-pushed tag, and the registry stopped. The only stand-in is
`docker` (no daemon here): its `pull` asks the real registry through skopeo, its `run` records and serves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_dspark.images import registry as reg_mod
from tests.helpers.launcher_rig import Rig, free_port, start_ready, stop_and_check
from tests.registry_rig import DOCKER, recipes_on, registry  # noqa: F401 (fixture)

ROCM72 = ["PATH=/usr/bin", "ROCM_VERSION=7.2.3"]
ROCM100 = ["PATH=/usr/bin", "ROCM_VERSION=10.0.0"]


def _cli(env, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "rocm_dspark", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def host(registry, tmp_path):  # noqa: F811
    """The recipes pointed at the loopback registry, a state dir, and the CLI's environment."""
    recipes = recipes_on(registry, tmp_path / "recipes")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCM_DSPARK_")}
    env.update(ROCM_DSPARK_RECIPES=str(recipes), ROCM_DSPARK_STATE_DIR=str(tmp_path / "state"),
               PYTHONPATH=os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[1])))
    return registry, env, tmp_path


@pytest.mark.parametrize("use_skopeo", [True, False], ids=["skopeo", "http-api-v2"])
def test_present_and_absent_tags_and_the_stack_variants(registry, use_skopeo):  # noqa: F811
    d72 = registry.push("v0.33.0-rocm72", "seventy-two", ROCM72)
    d100 = registry.push("v0.33.0-rocm100", "one-hundred", ROCM100)
    got72 = reg_mod.resolve(registry.image("v0.33.0-rocm72"), use_skopeo=use_skopeo)
    got100 = reg_mod.resolve(registry.image("v0.33.0-rocm100"), use_skopeo=use_skopeo)
    assert got72["exists"] and got72["digest"] == d72 and got72["stack"]["rocm"] == "7.2.3"
    assert got100["exists"] and got100["digest"] == d100 and got100["stack"]["rocm"] == "10.0.0"
    assert got72["registry"] == registry.host and got72["via"] == ("skopeo" if use_skopeo else "http")
    absent = reg_mod.resolve(registry.image("nightly-3df4ae153eb385e27b52f26c81f8edb9e20b9984"), use_skopeo=use_skopeo)
    assert absent["exists"] is False and absent["digest"] is None
    assert "manifest unknown" in absent["answer"].lower()


def test_images_records_what_the_registry_holds_and_plans_run_the_digest(host):
    registry, env, tmp = host
    d72 = registry.push("v0.33.0-rocm72", "seventy-two", ROCM72)
    registry.push("v0.33.0", "default-stack", ROCM100)
    before = _cli(env, "recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "docker")
    assert before.returncode == 0 and "unresolved" in before.stdout and "@sha256:" not in before.stdout
    out = _cli(env, "images", "--gpu", "mi300x", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {r["build"]: r for r in result["images"]}
    assert rows["v0.33.0-rocm72"]["answer"]["digest"] == d72
    assert rows["v0.33.0-rocm100"]["answer"]["exists"] is False  # not pushed here
    assert rows["nightly-3df4ae15"]["answer"]["exists"] is False
    pinned = f"{registry.host}/vllm/vllm-openai-rocm@{d72}"
    assert result["runs"]["build"] == "v0.33.0-rocm72" and result["runs"]["image"] == pinned
    docker = _cli(env, "recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "docker")
    assert docker.returncode == 0 and f" {pinned} " in docker.stdout.replace("\\\n", " ")
    assert "unresolved" not in docker.stdout
    plan = json.loads(_cli(env, "recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--format", "json").stdout)
    assert plan["image"] == pinned and plan["build"]["resolution"]["stack"]["rocm"] == "7.2.3"
    # A nightly the registry no longer holds: one line, the registry's answer and the replacement, exit 2.
    gone = _cli(env, "recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--build", "nightly-3df4ae15")
    assert gone.returncode == 2 and gone.stdout == ""
    line = gone.stderr.strip()
    assert "\n" not in line and "nightly-3df4ae15" in line and "manifest unknown" in line.lower()
    assert line.endswith("use --build v0.33.0-rocm72")


def test_gfx942_falls_back_to_the_default_stack_where_no_rocm72_variant_exists(host):
    registry, env, _ = host
    d = registry.push("v0.33.0", "default-stack", ROCM72)
    assert _cli(env, "images", "--gpu", "mi325x").returncode == 0
    plan = json.loads(_cli(env, "recipe", "--model", "V4.1-Flash", "--gpu", "mi325x", "--format", "json").stdout)
    assert plan["build"]["name"] == "v0.33.0" and plan["image"].endswith(d)
    build_note = next(n["text"] for n in plan["notes"] if n["topic"] == "build")
    assert "v0.33.0-rocm72 is not in the registry" in build_note
    # The asked build alone, absent: the table, then one line and exit 2.
    asked = _cli(env, "images", "--build", "v0.33.0-rocm100", "--gpu", "mi355x")
    assert asked.returncode == 2 and "v0.33.0-rocm100" in asked.stdout
    assert asked.stderr.count("\n") == 1 and "is not in the registry" in asked.stderr


def _registry_docker(rig: Rig, store: Path) -> None:
    """Replace the rig's docker with the registry-backed one (tests/registry_rig.py DOCKER)."""
    recording = rig.root / "docker-recording"
    shutil.copy(rig.root / "bin" / "docker", recording)
    (rig.root / "bin" / "docker").write_text(DOCKER.format(python=sys.executable, standin=str(recording)))
    (rig.root / "bin" / "docker").chmod(0o755)
    store.mkdir(exist_ok=True)


def _docker_calls(store: Path) -> list[list[str]]:
    return [json.loads(line) for line in (store / "calls.jsonl").read_text().splitlines()]


def test_pull_once_then_restarts_run_the_recorded_digest_through_a_repush_and_an_outage(host):
    """`launch --pull --container` pulls once and writes the digest into the launcher; the tag is then re-pushed
    to a new digest and later the registry stops: each start runs the recorded digest and none pulls."""
    registry, env, tmp = host
    rig = Rig(tmp / "rig")
    store = tmp / "images"
    _registry_docker(rig, store)
    first = registry.push("v0.33.0-rocm72", "first", ROCM72)
    port = free_port()
    env = dict(env, PATH=f"{rig.root / 'bin'}{os.pathsep}{env['PATH']}", STANDIN_IMAGE_STORE=str(store))
    model = tmp / "ckpt"
    model.mkdir()
    # --max-num-seqs 2: a warm-up of 3 requests per start, not the profile's 255 (tests/test_launchers.py checks it).
    out = _cli(env, "launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--container", "--pull", "--output",
               str(rig.root / "out"), "--host", "127.0.0.1", "--port", str(port), "--model-path", str(model),
               "--max-num-seqs", "2")
    assert out.returncode == 0, out.stderr
    pinned = f"{registry.host}/vllm/vllm-openai-rocm@{first}"
    script = rig.root / "out" / "rocm-dspark-deepseek-v4-1-flash-mi300x.sh"
    assert f"IMAGE={pinned}" in script.read_text()
    assert [c[0] for c in _docker_calls(store)].count("pull") == 1
    registry.push("v0.33.0-rocm72", "second", ROCM72)  # the tag moves
    assert reg_mod.resolve(registry.image("v0.33.0-rocm72"), use_skopeo=True)["digest"] != first
    for outage in (False, True):
        if outage:
            registry.stop()
        proc = start_ready(rig, script, port, **{k: v for k, v in env.items() if k.startswith(("STANDIN_", "PATH"))})
        assert stop_and_check(proc, rig, who="docker") == 143
        run = [a.decode() for a in [r for r in rig.records("docker") if r["argv"][1] == b"run"][-1]["argv"]]
        assert pinned in run and f"{model}:{model}:ro" in run
        assert run[run.index(f"{model}:{model}:ro") - 1] == "-v" and str(model) in run[run.index(pinned) + 1:]
    assert [c[0] for c in _docker_calls(store)].count("pull") == 1, "a start pulled"
    provenance = (rig.root / "state" / "vllm_command.txt").read_text()
    assert f"# image: {registry.image('v0.33.0-rocm72')}, run as {pinned}" in provenance


def test_a_new_up_says_why_it_cannot_resolve_when_the_registry_is_down(host, monkeypatch):
    """up's image step (rocm_dspark.images.pull.pin) with the registry stopped: with no local copy, a stop that
    names the tag and the reason; with the copy an earlier pull left, the digest this host holds."""
    registry, env, tmp = host
    held = registry.push("v0.33.0-rocm72", "first", ROCM72)
    registry.push("v0.33.0", "other", ROCM72)
    monkeypatch.setenv("ROCM_DSPARK_RECIPES", env["ROCM_DSPARK_RECIPES"])
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.resolve import Selection, resolve
    from rocm_dspark.images.pull import PullFailed, pin

    cat = load_catalog(env["ROCM_DSPARK_RECIPES"])
    rig = Rig(tmp / "rig")
    _registry_docker(rig, tmp / "images")
    monkeypatch.setenv("PATH", f"{rig.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_IMAGE_STORE", str(tmp / "images"))
    subprocess.run(["docker", "pull", registry.image("v0.33.0-rocm72")], check=True, capture_output=True)
    registry.stop()
    other = resolve(cat, Selection(model="V4.1-Flash", gpu="mi300x", build="v0.33.0"))
    with pytest.raises(PullFailed) as exc:
        pin(other, tmp / "state", tool="docker", replacement="v0.33.0-rocm72")
    assert exc.value.message.startswith(f"cannot resolve {registry.image('v0.33.0')}: {registry.host} unreachable")
    assert "this host holds no copy" in exc.value.message and "registry reachable" in exc.value.fix
    assert not (tmp / "state" / "images" / "resolved.json").exists()  # no answer, nothing recorded
    said = []
    got = pin(resolve(cat, Selection(model="V4.1-Flash", gpu="mi300x")), tmp / "state", tool="docker", say=said.append)
    assert got["pinned"] == f"{registry.host}/vllm/vllm-openai-rocm@{held}" and got["resolved"] is None
    assert any("using the copy this host holds" in line for line in said)
    assert not any(c[0] == "pull" for c in _docker_calls(tmp / "images")[1:])


def test_a_tag_only_launcher_without_a_local_copy_stops_before_starting_and_never_pulls(tmp_path):
    """No registry needed: the host holds no copy, so the first start says how to get one; and a --model-path
    removed after the launcher was written is refused before anything starts."""
    from tests.helpers.launcher_rig import make_plan

    rig = Rig(tmp_path / "rig")
    store = tmp_path / "images"
    _registry_docker(rig, store)
    plan = make_plan(free_port(), adaptive=False)._replace(image="vllm/vllm-openai-rocm:v0.33.0")
    r = rig.run(rig.write(plan, container=True), STANDIN_IMAGE_STORE=str(store))
    assert r.returncode == 1 and b"is not on this host and the launcher never pulls" in r.stderr
    calls = _docker_calls(store)
    assert calls and all(c[0] != "pull" and c[0] != "run" for c in calls)
    model = tmp_path / "ckpt"
    model.mkdir()
    pinned = make_plan(free_port(), adaptive=False)._replace(model_path=str(model))
    script = rig.write(pinned, container=True)
    model.rmdir()
    r = rig.run(script, STANDIN_IMAGE_STORE=str(store))
    assert r.returncode == 1 and f"--model-path {model} does not exist on this host".encode() in r.stderr
    assert not [c for c in _docker_calls(store) if c[0] == "run"]
