"""Docker Hub's anonymous token flow through httpx, against recorded response shapes (httpx.MockTransport; no
network). The shapes are the Docker Registry token spec's and Docker Hub's:
- the 401 challenge `WWW-Authenticate: Bearer realm="https://auth.docker.io/token",service="registry.docker.io",
  scope="repository:<name>:pull"` and the token body {"token", "access_token", "expires_in", "issued_at"}
  (https://distribution.github.io/distribution/spec/auth/token/, its example uses these Docker Hub values);
- the error body {"errors": [{"code": "UNAUTHORIZED" | "MANIFEST_UNKNOWN", "message", "detail"}]}
  (https://distribution.github.io/distribution/spec/api/#errors; MANIFEST_UNKNOWN is what the real registry in
  tests/test_images_registry.py answers for an absent tag);
- the blob GET answered by a 307 to a CDN, as Docker Hub serves layers and configs.
"""

import hashlib
import json

import httpx
import pytest

from rocm_dspark.images import registry

CHALLENGE = ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
             'scope="repository:vllm/vllm-openai-rocm:pull"')
CONFIG = json.dumps({"architecture": "amd64", "os": "linux",
                     "config": {"Env": ["PATH=/usr/bin", "ROCM_VERSION=7.2.3"], "Labels": None}}).encode()
CONFIG_DIGEST = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
IMAGE = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": CONFIG_DIGEST,
                               "size": len(CONFIG)}, "layers": []}).encode()
IMAGE_DIGEST = "sha256:" + hashlib.sha256(IMAGE).hexdigest()
INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": IMAGE_DIGEST, "size": len(IMAGE),
     "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
INDEX_DIGEST = "sha256:" + hashlib.sha256(INDEX).hexdigest()
TOKEN = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.recorded-shape.signature"


class Hub:
    """Docker Hub as the recorded shapes say it answers; `seen` keeps every request."""

    def __init__(self, tags: dict, token_key: str = "token"):
        self.tags, self.token_key, self.seen = tags, token_key, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        url = request.url
        if url.host == "auth.docker.io":
            assert url.params["service"] == "registry.docker.io"
            assert url.params["scope"] == "repository:vllm/vllm-openai-rocm:pull"
            return httpx.Response(200, json={self.token_key: TOKEN, "expires_in": 300,
                                             "issued_at": "2026-12-01T12:00:00.000000000Z"})
        if url.host == "cdn.example":
            return httpx.Response(200, content=CONFIG)
        assert url.host == "registry-1.docker.io"
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, headers={"www-authenticate": CHALLENGE}, json={"errors": [{
                "code": "UNAUTHORIZED", "message": "authentication required", "detail": [{
                    "Type": "repository", "Class": "", "Name": "vllm/vllm-openai-rocm", "Action": "pull"}]}]})
        path = url.path
        if path.endswith(f"/blobs/{CONFIG_DIGEST}"):
            return httpx.Response(307, headers={"location": "https://cdn.example/config"})
        ref = path.rsplit("/", 1)[1]
        if ref == IMAGE_DIGEST:
            return httpx.Response(200, content=IMAGE, headers={"docker-content-digest": IMAGE_DIGEST,
                                                                "content-type": "application/vnd.oci.image.manifest.v1+json"})
        if ref in self.tags:
            return httpx.Response(200, content=INDEX, headers={"docker-content-digest": INDEX_DIGEST,
                                                                "content-type": "application/vnd.oci.image.index.v1+json"})
        return httpx.Response(404, json={"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown",
                                                     "detail": f"unknown tag={ref}"}]})


@pytest.mark.parametrize("token_key", ["token", "access_token"])
def test_anonymous_token_flow_digest_of_the_index_and_stack_from_the_config(token_key):
    hub = Hub({"v0.33.0-rocm72"}, token_key)
    with httpx.Client(transport=httpx.MockTransport(hub)) as client:
        got = registry.resolve_http("vllm/vllm-openai-rocm:v0.33.0-rocm72", client=client)
    assert got["exists"] and got["digest"] == INDEX_DIGEST  # what `docker pull` records in RepoDigests
    assert got["stack"] == {"rocm": "7.2.3", "source": "config env ROCM_VERSION"}
    assert got["registry"] == "registry-1.docker.io" and got["via"] == "http"
    first = hub.seen[0]
    assert first.url == "https://registry-1.docker.io/v2/vllm/vllm-openai-rocm/manifests/v0.33.0-rocm72"
    assert "application/vnd.oci.image.index.v1+json" in first.headers["accept"]
    assert sum(r.url.host == "auth.docker.io" for r in hub.seen) == 1  # one token for the whole resolution


def test_an_absent_tag_is_a_definite_answer_with_the_registry_words():
    with httpx.Client(transport=httpx.MockTransport(Hub(set()))) as client:
        got = registry.resolve_http("vllm/vllm-openai-rocm:nightly-3df4ae153eb385e27b52f26c81f8edb9e20b9984", client=client)
    assert got["exists"] is False and got["digest"] is None
    assert got["answer"] == "HTTP 404 MANIFEST_UNKNOWN (manifest unknown)"


def test_a_digest_that_does_not_match_the_bytes_is_refused():
    def lying(request):
        if request.url.host == "auth.docker.io":
            return httpx.Response(200, json={"token": TOKEN})
        return httpx.Response(200, content=INDEX, headers={"docker-content-digest": "sha256:" + "0" * 64})
    with httpx.Client(transport=httpx.MockTransport(lying)) as client:
        with pytest.raises(registry.RegistryUnreachable, match="hashes to"):
            registry.resolve_http("vllm/vllm-openai-rocm:v0.33.0", client=client)


def test_unreachable_and_unsupported_auth_are_no_answer():
    def down(request):
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    with httpx.Client(transport=httpx.MockTransport(down)) as client:
        with pytest.raises(registry.RegistryUnreachable, match="registry-1.docker.io unreachable: ConnectError"):
            registry.resolve_http("vllm/vllm-openai-rocm:v0.33.0", client=client)
    basic = httpx.MockTransport(lambda r: httpx.Response(401, headers={"www-authenticate": 'Basic realm="x"'}))
    with httpx.Client(transport=basic) as client:
        with pytest.raises(registry.RegistryUnreachable, match="Basic authentication"):
            registry.resolve_http("registry.example.com/a/b:1", client=client)


def test_references_split_as_docker_reads_them():
    assert registry.split("vllm/vllm-openai-rocm:v0.33.0") == ("registry-1.docker.io", "vllm/vllm-openai-rocm", "v0.33.0")
    assert registry.split("ubuntu") == ("registry-1.docker.io", "library/ubuntu", "latest")
    assert registry.split("127.0.0.1:5000/vllm/x:t") == ("127.0.0.1:5000", "vllm/x", "t")
    assert registry.split("localhost/x@sha256:" + "a" * 64)[2] == "sha256:" + "a" * 64
    assert registry.loopback("127.0.0.1:5000") and not registry.loopback("registry-1.docker.io")
    with pytest.raises(ValueError):
        registry.split("Bad/Name:tag")
