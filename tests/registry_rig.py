"""A real OCI registry on loopback for the image tests: CNCF distribution 2.8 (Debian's `docker-registry`),
started on 127.0.0.1 with a temp config, and small images pushed to it by `skopeo copy` from OCI layouts made
here. Tests using it skip, saying why, where either binary is missing (.ci/run installs both with apt)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port

BINARIES = ("docker-registry", "skopeo")
REPO = "vllm/vllm-openai-rocm"


def missing() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def _blob(root: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return "sha256:" + digest


def oci_layout(root: Path, tag: str, content: str, env: list[str]) -> str:
    """An OCI image layout with one tiny layer and a config carrying `env`; returns the manifest's digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = content.encode()
        info = tarfile.TarInfo("content.txt")
        info.size, info.mtime = len(data), 0
        t.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    layer = gzip.compress(raw, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": env, "Labels": {"content": content}},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _blob(root, config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _blob(root, layer),
                    "size": len(layer)}]}).encode()
    digest = _blob(root, manifest)
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    return digest


class Registry:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc = None
        self.n = 0

    def start(self) -> None:
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n")
        self.log = open(self.root / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the registry did not answer on {self.host}: {(self.root / 'registry.log').read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def image(self, tag: str) -> str:
        return f"{self.host}/{REPO}:{tag}"

    def push(self, tag: str, content: str, env: list[str] = ()) -> str:
        """Push a fresh image to `tag` (replacing what it held); returns its digest."""
        self.n += 1
        layout = self.root / f"layout-{self.n}"
        digest = oci_layout(layout, tag, content, list(env))
        subprocess.run(["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{layout}:{tag}",
                        f"docker://{self.image(tag)}"], check=True, capture_output=True, timeout=60)
        return digest


@pytest.fixture
def registry(tmp_path):
    gone = missing()
    if gone:
        pytest.skip(f"{' and '.join(gone)} not installed (apt-get install docker-registry skopeo; .ci/run does)")
    reg = Registry(tmp_path / "registry")
    reg.root.mkdir()
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()
        reg.log.close()


def recipes_on(registry: Registry, dest: Path) -> Path:
    """A copy of recipes/ whose images live on the loopback registry (ROCM_DSPARK_RECIPES points at it)."""
    from rocm_dspark.recipe.catalog import recipes_dir

    shutil.copytree(recipes_dir(), dest)
    vllm = dest / "vllm.yaml"
    vllm.write_text(vllm.read_text().replace(f"image: {REPO}:", f"image: {registry.host}/{REPO}:"))
    return dest


# `docker` for the launcher and `up`, backed by the real registry: `pull` asks it through skopeo and keeps what
# the tag held then (as docker's image store does), `image inspect` answers from that store as docker prints it,
# anything else (run, stop, rm) goes to the recording stand-in of tests/helpers/launcher_rig.py.
DOCKER = r'''#!{python}
import hashlib, json, os, subprocess, sys
a = sys.argv[1:]
store = os.environ["STANDIN_IMAGE_STORE"]
os.makedirs(store, exist_ok=True)
with open(os.path.join(store, "calls.jsonl"), "a") as f:
    f.write(json.dumps(a) + "\n")
def key(ref):
    return os.path.join(store, ref.replace("/", "_").replace(":", "_").replace("@", "_"))
if a[0] == "pull":
    p = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "docker://" + a[1]], capture_output=True)
    if p.returncode != 0:
        sys.stderr.write("Error response from daemon: " + p.stderr.decode(errors="replace"))
        sys.exit(1)
    ref = a[1].rsplit(":", 1)[0] + "@sha256:" + hashlib.sha256(p.stdout).hexdigest()
    open(key(a[1]), "w").write(ref)
    open(key(ref), "w").write(ref)
    print(a[1].rsplit(":", 1)[1] + ": Pulling from " + a[1].rsplit(":", 1)[0] + "\nDigest: " + ref.split("@")[1])
    sys.exit(0)
if a[:2] == ["image", "inspect"]:
    ref = a[-1]
    if not os.path.exists(key(ref)):
        print("Error: No such image: " + ref, file=sys.stderr)
        sys.exit(1)
    digests = [open(key(ref)).read()]
    fmt = a[a.index("--format") + 1] if "--format" in a else None
    if fmt == "{{{{.Id}}}}":
        print("sha256:" + hashlib.sha256(digests[0].encode()).hexdigest())
    elif fmt:
        print(json.dumps(digests))
    else:
        print(json.dumps([{{"Id": "sha256:" + "a" * 64, "RepoTags": [ref], "RepoDigests": digests}}], indent=4))
    sys.exit(0)
os.execv({standin!r}, [{standin!r}, *a])
'''
