"""Ask a registry what a tag is now: exists or not, its digest, and the ROCm stack its config reports.

Two ways, same answer (a cache entry, rocm_dspark.images.cache):
- `skopeo inspect` when skopeo is installed (it reads the host's registry configuration and credentials);
- else the Docker Registry HTTP API v2 through httpx (the `validate` extra): GET /v2/<name>/manifests/<tag>
  with the manifest media types in Accept (https://distribution.github.io/distribution/spec/api/), and on a 401
  Docker Hub's anonymous token flow: the `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge,
  a GET of the realm with service and scope, then the request again with `Authorization: Bearer <token>`
  (https://distribution.github.io/distribution/spec/auth/token/).
The digest is the SHA-256 of the manifest bytes the registry serves for the tag (for a multi-arch image, the
index), which is what `docker pull` records in RepoDigests. Loopback registries are spoken to over plain HTTP,
as docker allows for 127.0.0.0/8; every other registry over HTTPS.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
import time

from rocm_dspark.images.pick import REPO_PATH, ref_parts
from rocm_dspark.inputs import parse_json

DOCKER_HUB = "registry-1.docker.io"
INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFESTS = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join((*INDEXES, *MANIFESTS))
# Where an image's config may say its ROCm stack: vLLM's Dockerfiles set no label for it, so these are read when
# present (ROCm's own base images set ROCM_VERSION), and otherwise `up` reads torch.version.hip inside the image.
STACK_ENV = ("ROCM_VERSION", "ROCM_SDK_VERSION")
STACK_LABELS = ("com.amd.rocm.version", "org.opencontainers.image.rocm.version")


class RegistryUnreachable(Exception):
    """No answer about the tag (network, TLS, auth or server error): nothing is recorded."""


def split(image: str) -> tuple[str, str, str]:
    """'vllm/vllm-openai-rocm:v0.33.0' -> ('registry-1.docker.io', 'vllm/vllm-openai-rocm', 'v0.33.0').
    The host by docker's rule (pick.ref_parts), else Docker Hub, whose one-word names live under library/."""
    host, path, tag, digest = ref_parts(image)
    if not host:
        host, path = DOCKER_HUB, path if "/" in path else f"library/{path}"
    ref = digest or tag or "latest"
    if not re.fullmatch(REPO_PATH, path):
        raise ValueError(f"{image!r} is not an image reference (repository {path!r})")
    return host, path, ref


def loopback(host: str) -> bool:
    h = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return h in ("localhost", "[::1]") or h.startswith("127.")


def stack_from(labels: dict | None, env: list | None) -> dict | None:
    """{"rocm": "7.2.3", "source": "..."} from an image config's labels or env, or None."""
    for key in STACK_LABELS:
        if (labels or {}).get(key):
            return {"rocm": str(labels[key]), "source": f"label {key}"}
    for item in env or ():
        key, _, value = str(item).partition("=")
        if key in STACK_ENV and value:
            return {"rocm": value, "source": f"config env {key}"}
    return None


# A vLLM version label, where an image's config has one: vLLM's release images set none (`up` then reads the
# version inside the image); scripts/build_cpu_test_image.sh sets it.
VERSION_LABEL = "vllm.version"


def _entry(image: str, exists: bool, digest: str | None, answer: str, via: str, config: dict | None = None) -> dict:
    """A cache entry (rocm_dspark.images.cache); `config`: the image config read, with its Labels and Env."""
    labels = (config or {}).get("Labels") or {}
    out = {
        "exists": exists,
        "digest": digest,
        "stack": stack_from(labels, (config or {}).get("Env")),
        "answer": answer,
        "registry": split(image)[0],
        "via": via,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if labels.get(VERSION_LABEL):
        out.update(vllm_version=str(labels[VERSION_LABEL]), vllm_source=f"label {VERSION_LABEL}")
    return out


# ---- the HTTP API v2 ------------------------------------------------------------------------------------


def _challenge(header: str) -> dict:
    """`Bearer realm="...",service="...",scope="..."` -> {"realm": ..., "service": ..., "scope": ...}."""
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise RegistryUnreachable(
            f"the registry asks for {scheme or 'unknown'} authentication; only anonymous "
            f"Bearer tokens are supported here (install skopeo to use your credentials)"
        )
    return dict(re.findall(r'(\w+)="([^"]*)"', params))


class _Http:
    def __init__(self, client, host: str, path: str):
        self.client, self.host, self.path, self.token = client, host, path, None
        self.base = f"{'http' if loopback(host) else 'https'}://{host}/v2/{path}"

    def get(self, url: str, accept: str = ACCEPT):
        headers = {"Accept": accept}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        resp = self.client.get(url, headers=headers, follow_redirects=True)
        if resp.status_code == 401 and not self.token and "www-authenticate" in resp.headers:
            self.token = self._token(_challenge(resp.headers["www-authenticate"]))
            return self.get(url, accept)
        return resp

    def _token(self, ch: dict) -> str:
        if not ch.get("realm"):
            raise RegistryUnreachable(f"{self.host} sent a Bearer challenge without a realm")
        params = {"service": ch.get("service"), "scope": ch.get("scope") or f"repository:{self.path}:pull"}
        resp = self.client.get(ch["realm"], params={k: v for k, v in params.items() if v})
        if resp.status_code != 200:
            raise RegistryUnreachable(f"token service {ch['realm']} answered HTTP {resp.status_code}")
        body = resp.json()
        token = body.get("token") or body.get("access_token")  # the spec allows either name
        if not isinstance(token, str) or not token:
            raise RegistryUnreachable(f"token service {ch['realm']} returned no token")
        return token


def _errors(resp) -> str:
    try:
        errs = resp.json().get("errors") or []
        return "; ".join(f"{e.get('code')} ({e.get('message')})" for e in errs if isinstance(e, dict))
    except (ValueError, AttributeError):
        return ""


def resolve_http(image: str, client=None, timeout_s: float = 15.0) -> dict:
    """One tag through the HTTP API v2 (httpx); RegistryUnreachable when there is no definite answer."""
    import httpx

    host, path, ref = split(image)
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    try:
        http = _Http(client, host, path)
        resp = http.get(f"{http.base}/manifests/{ref}")
        if resp.status_code == 404:
            why = _errors(resp) or "not found"
            return _entry(image, False, None, f"HTTP 404 {why}", "http")
        if resp.status_code != 200:
            raise RegistryUnreachable(
                f"{host} answered HTTP {resp.status_code} for {path}:{ref} {_errors(resp)}".strip()
            )
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        said = resp.headers.get("docker-content-digest")
        if said and said != digest:
            raise RegistryUnreachable(f"{host} says {said} for {path}:{ref} but its manifest hashes to {digest}")
        return _entry(image, True, digest, "HTTP 200", "http", _config_http(http, resp))
    except httpx.HTTPError as exc:
        raise RegistryUnreachable(f"{host} unreachable: {type(exc).__name__}: {exc}") from None
    finally:
        if own:
            client.close()


def _config_http(http: _Http, resp) -> dict | None:
    """The image config from its blob (for an index: its linux/amd64 image's); None where there is none."""
    manifest = resp.json()
    if manifest.get("mediaType") in INDEXES or "manifests" in manifest:
        amd64 = [
            m
            for m in manifest.get("manifests", [])
            if (m.get("platform") or {}).get("architecture") == "amd64"
            and (m.get("platform") or {}).get("os") == "linux"
        ]
        if not amd64:
            return None
        manifest = http.get(f"{http.base}/manifests/{amd64[0]['digest']}").json()
    config = (manifest.get("config") or {}).get("digest")
    if not config:
        return None
    blob = http.get(f"{http.base}/blobs/{config}", accept="*/*")
    return (blob.json() or {}).get("config") if blob.status_code == 200 else None


# ---- skopeo ---------------------------------------------------------------------------------------------


def _skopeo(args: list[str], image: str, timeout_s: float) -> subprocess.CompletedProcess:
    tls = ["--tls-verify=false"] if loopback(split(image)[0]) else []
    try:
        return subprocess.run(
            ["skopeo", "inspect", *tls, *args, f"docker://{image}"], capture_output=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RegistryUnreachable(f"skopeo inspect {image}: {exc}") from None


def _skopeo_error(stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    msg = re.sub(r'^time="[^"]*" level=\w+ msg="?', "", text[0]).rstrip('"').replace('\\"', '"')
    return re.sub(r'^Error parsing image name "[^"]*": ', "", msg)


def resolve_skopeo(image: str, timeout_s: float = 60.0) -> dict:
    raw = _skopeo(["--raw"], image, timeout_s)
    if raw.returncode != 0:
        msg = _skopeo_error(raw.stderr)
        if "manifest unknown" in msg.lower() or "not found" in msg.lower():
            return _entry(image, False, None, msg.split(": ")[-1], "skopeo")
        raise RegistryUnreachable(f"{split(image)[0]} unreachable: skopeo: {msg}")
    digest = "sha256:" + hashlib.sha256(raw.stdout).hexdigest()
    info = _skopeo([], image, timeout_s)  # the image for this platform: its labels and env
    config = None
    if info.returncode == 0:
        with contextlib.suppress(ValueError):
            config = parse_json(info.stdout, "skopeo inspect")
    return _entry(image, True, digest, "manifest found", "skopeo", config)


def resolve(image: str, *, use_skopeo: bool | None = None, client=None) -> dict:
    """skopeo when installed (or asked), else the HTTP API; RegistryUnreachable when there is no answer."""
    if use_skopeo if use_skopeo is not None else shutil.which("skopeo") is not None:
        return resolve_skopeo(image)
    return resolve_http(image, client=client)
