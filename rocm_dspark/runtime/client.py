"""HTTP client for a running vLLM server's OpenAI-compatible API, /health, /version and /metrics.

The standard library only (no optional dependency), with proxies disabled: these are loopback calls.
It knows nothing about processes: rocm_dspark.runtime.process starts and stops servers, validation and
the probe talk to a server, started by us or not, through this client.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from rocm_dspark.errors import EnvironmentFailure


@dataclass
class HttpResult:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self):
        """The body as strict JSON (inputs.parse_json; its error is a ValueError, one line)."""
        from rocm_dspark.inputs import parse_json

        return parse_json(self.body, "the server's answer")


def one_line(text: str, limit: int = 300) -> str:
    """An error body (vLLM's JSON, or a proxy's HTML page) as one line for a report or an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def loopback_host(host: str) -> str:
    """The address to reach a server bound to `host` at: a wildcard bind over this host's loopback of the same
    family (0.0.0.0 -> 127.0.0.1, :: -> ::1, since an IPv6-only socket never answers on 127.0.0.1)."""
    host = host.strip()
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def base_url(host: str, port: int) -> str:
    """http://host:port for a server bound to `host` (loopback_host), an IPv6 address in brackets."""
    h = loopback_host(host)
    return f"http://[{h}]:{int(port)}" if ":" in h else f"http://{h}:{int(port)}"


class ServerError(EnvironmentFailure):
    """A request to the server failed (connection, status or timeout); the message says which and why."""


class VllmClient:
    """Requests to the server at http://host:port (a server bound to all interfaces is reached over loopback)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8000):
        self.host = loopback_host(host)
        self.port = int(port)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)

    def request(self, method: str, path: str, body: dict | None = None, timeout_s: float = 60.0) -> HttpResult:
        """One HTTP request; HTTP error statuses are returned, transport failures raise ServerError."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=timeout_s) as resp:
                return HttpResult(resp.status, resp.read(), dict(resp.headers))
        except urllib.error.HTTPError as exc:
            return HttpResult(exc.code, exc.read(), dict(exc.headers or {}))
        except (OSError, http.client.HTTPException) as exc:  # URLError (connecting) or reset / closed mid-response
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(why, ConnectionRefusedError):
                why = f"connection refused at {self.base_url}"
            elif isinstance(why, TimeoutError):
                why = f"no answer within {timeout_s:g} s"
            raise ServerError(f"{method} {path}: {why}") from None

    def get(self, path: str, timeout_s: float = 30.0) -> HttpResult:
        return self.request("GET", path, timeout_s=timeout_s)

    def _get_ok(self, path: str, timeout_s: float) -> HttpResult:
        res = self.get(path, timeout_s)
        if res.status != 200:
            raise ServerError(f"GET {path}: HTTP {res.status}")
        return res

    def models(self, timeout_s: float = 30.0) -> list[str]:
        return model_ids(self._get_ok("/v1/models", timeout_s))

    def _model(self, model: str | None) -> str:
        if model:
            return model
        ids = self.models()
        if not ids:
            raise ServerError("the server lists no model: pass model= explicitly")
        return ids[0]

    def complete(self, prompt: str, max_tokens: int = 16, **kw) -> dict:
        """POST /v1/completions (greedy by default) and return the response JSON."""
        return self._generate("/v1/completions", {"prompt": prompt}, max_tokens, **kw)

    def chat(self, messages: list[dict] | str, max_tokens: int = 64, **kw) -> dict:
        """POST /v1/chat/completions; a plain string becomes one user message."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self._generate("/v1/chat/completions", {"messages": messages}, max_tokens, **kw)

    def _generate(
        self,
        path: str,
        what: dict,
        max_tokens: int,
        *,
        model: str | None = None,
        temperature: float = 0.0,
        ignore_eos: bool = False,
        timeout_s: float = 120.0,
        **extra,
    ) -> dict:
        body = {
            "model": self._model(model),
            **what,
            "max_tokens": max_tokens,
            "temperature": temperature,
            **({"ignore_eos": True} if ignore_eos else {}),
            **extra,
        }
        res = self.request("POST", path, body, timeout_s=timeout_s)
        if res.status != 200:
            raise ServerError(f"POST {path}: HTTP {res.status}: {one_line(res.body.decode(errors='replace'))}")
        return res.json()

    def metrics_text(self, timeout_s: float = 30.0) -> str:
        return self._get_ok("/metrics", timeout_s).body.decode()


def model_ids(res: HttpResult) -> list[str]:
    """The model ids a /v1/models answer lists ([] when it is not the expected JSON)."""
    try:
        return [m["id"] for m in res.json().get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        return []
