"""`up`'s image pin on a REAL Docker daemon (the private dockerd of test_container_real.py, stopped by pid) and a
REAL loopback registry (tests/registry_rig.py): an image whose only RepoDigest names another repository (pushed to
a mirror under another name), and one built here with none, are pinned by their image ID, which docker runs from
this host and never pulls; never as `requested-repo@<another repo's digest>`, a reference no registry holds.

The image is a one-file `docker import` (no vLLM, no shell): `up` gets past the pin and stops at the in-image probe,
which must then fail inside the container, not on a pull. Where docker.io or the registry is missing, it skips.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.registry_rig import Registry, missing
from tests.slow.test_container_real import REPO, _docker, docker_env  # noqa: F401 (docker_env: the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.container]

REQUESTED = "rocm-dspark/vllm-cpu-test"


def _up(env, tmp: Path, image: str, name: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`up` as an operator pastes it, through bash; the state file's image step."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    state = tmp / f"state-{name}"
    cmd = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "rocm_dspark", "up", "--model", "V4.1-Flash", "--target", "local-cpu",
        "--mode", "container", "--image", image, "--model-path", str(model), "--port", str(free_port()),
        "--state-dir", str(state), "--name", f"rocm-dspark-pintest-{name}", "--probe-levels", "static"])
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)},
                       timeout=900)
    st = json.loads((state / "up" / "up-state.json").read_text())
    return r, st["steps"]


@pytest.fixture
def images(docker_env, tmp_path):  # noqa: F811 (the fixture imported above)
    if missing():
        pytest.skip(f"{' and '.join(missing())} not installed (apt-get install docker-registry skopeo)")
    for which in ("built", "mirrored"):  # two contents: two image IDs (RepoDigests belong to an ID)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = f"pin test {which} {tmp_path}\n".encode()
            info = tarfile.TarInfo("content.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        (tmp_path / f"{which}.tar").write_bytes(buf.getvalue())
    tag = f"pin-{os.getpid()}"
    built, mirrored = f"{REQUESTED}:{tag}-built", f"{REQUESTED}:{tag}"
    reg = Registry(tmp_path / "registry")
    reg.root.mkdir()
    reg.start()
    other = f"{reg.host}/other/name:{tag}"
    made = [built, mirrored, other]
    try:
        _docker(docker_env, "import", str(tmp_path / "built.tar"), built)
        # Imported under the requested name, then pushed to the mirror under another: its only RepoDigest is the mirror's.
        _docker(docker_env, "import", str(tmp_path / "mirrored.tar"), mirrored)
        _docker(docker_env, "tag", mirrored, other)
        _docker(docker_env, "push", other)
        yield {"env": docker_env, "built": built, "mirrored": mirrored, "other": other}
    finally:
        for ref in made:
            _docker(docker_env, "rmi", "-f", ref, check=False)
        for name in ("built", "mirrored", "other"):
            _docker(docker_env, "rm", "-f", f"rocm-dspark-pintest-{name}", check=False)
        reg.stop()
        reg.log.close()


def _inspect(env, ref: str) -> dict:
    return json.loads(_docker(env, "image", "inspect", ref).stdout)[0]


@pytest.mark.parametrize("which", ["mirrored", "built"])
def test_an_image_without_a_digest_of_its_repository_is_pinned_by_its_id(images, tmp_path, which):
    env, image = images["env"], images[which]
    held = _inspect(env, image)
    if which == "mirrored":
        assert [d.split("@")[0] for d in held["RepoDigests"]] == [images["other"].rsplit(":", 1)[0]], held
    else:
        assert held["RepoDigests"] == [], held
    r, steps = _up(env, tmp_path, image, which)
    out = r.stdout + r.stderr
    img = steps["image"]
    assert img["status"] == "done", (img, out[-3000:])
    assert img["output"]["pinned"] == held["Id"], img["output"]  # not rocm-dspark/vllm-cpu-test@<the mirror's digest>
    assert "pinned its image ID" in out and "never pulls" in out, out[-3000:]
    # docker runs the pin from this host: `create --pull never` resolves it with no registry.
    c = _docker(env, "create", "--pull", "never", img["output"]["pinned"], "/none")
    _docker(env, "rm", c.stdout.strip())
    # The launchers run the ID as it is: no first-start pin from RepoDigests, which it has none of.
    launcher = (tmp_path / f"state-{which}" / "up" / "launch" / "block" / f"rocm-dspark-pintest-{which}.sh").read_text()
    assert held["Id"] in launcher and "pin_image" not in launcher
    # The in-image probe ran the pinned image (it fails inside: this image has no shell), never a pull.
    probe = steps["probe"]
    assert probe["status"] == "failed" and f"the probe inside {held['Id']} exited 127" in probe["message"], probe
    assert "Unable to find image" not in out, out[-3000:]


def test_an_image_with_a_digest_of_its_repository_is_pinned_by_it(images, tmp_path):
    env, image = images["env"], images["other"]
    r, steps = _up(env, tmp_path, image, "other")
    img = steps["image"]["output"]
    want = next(d for d in _inspect(env, image)["RepoDigests"])
    assert img["pinned"] == want, (img, (r.stdout + r.stderr)[-3000:])
