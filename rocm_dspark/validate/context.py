"""What the checks share: the options, the plan the recipe resolved, the server under test, and facts
gathered once (host inventory, software facts) or produced by one check for a later one (counters)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.catalog import Catalog, ModelSpec
from rocm_dspark.recipe.plan import LaunchPlan
from rocm_dspark.runtime.client import VllmClient, base_url
from rocm_dspark.runtime.inventory import HostInventory
from rocm_dspark.runtime.inventory import inventory as gather_inventory
from rocm_dspark.runtime.process import VllmServer

DEFAULT_CONCURRENCIES = (1, 16, 64, 128)
QUICK_CONCURRENCIES = (1, 4)


@dataclass
class ValidateOptions:
    report_dir: Path
    force: bool = False
    endpoint: str | None = None  # validate a running server at this URL
    launch: bool = False  # start the server from the generated launcher, stop it after
    server_json: Path | None = None  # the server actually run, when not the recipe's plan (runtime/server_spec.py)
    quick: bool = False  # small workload for CPU hosts and smoke runs
    concurrencies: tuple[int, ...] | None = None
    requests_per_level: int | None = None  # default: 4 x concurrency, capped
    max_tokens: int | None = None  # output tokens per sweep / acceptance request
    request_timeout_s: float = 120.0
    ready_timeout_s: float = 3600.0
    gsm8k: bool = False
    gsm8k_limit: int | None = None
    acceptance_min: float | None = None  # overrides the recipe floor (a custom server's own floor)
    service_user: str | None = None
    require_gpu: bool = False
    require_gpu_why: str = "--require-gpu"  # what made a GPU required, for the failure message (`up` has no such flag)
    python: str | None = None  # the Python environment vLLM runs in
    server_log: Path | None = None  # the running server's log (--endpoint); --launch writes its own
    host_root: str = ""  # prefix for /proc and /dev paths (tests)
    gate_software: dict | None = None  # the image's software when vLLM runs in one (rocm_dspark.probe.software)
    bench_container: tuple[str, str] | None = None  # (docker|podman, image): the sweep's `vllm bench serve` runs there

    def levels(self) -> tuple[int, ...]:
        if self.concurrencies:
            return tuple(self.concurrencies)
        return QUICK_CONCURRENCIES if self.quick else DEFAULT_CONCURRENCIES

    def requests_for(self, concurrency: int) -> int:
        """Bounded: 4 requests per concurrent stream (2 in quick mode), at most 512 per level."""
        if self.requests_per_level:
            return max(self.requests_per_level, 1)
        return min(concurrency * (2 if self.quick else 4), 512)

    def output_tokens(self) -> int:
        return self.max_tokens or (32 if self.quick else 256)


@dataclass(frozen=True)
class ServerTarget:
    """The server the server/spec/sweep checks talk to."""

    served_name: str
    host: str
    port: int
    recipe_model: bool  # it serves the recipe's model: the recipe's answers and floors apply
    argv: tuple[str, ...] = ()  # for --launch
    env: dict = field(default_factory=dict)
    num_speculative_tokens: int | None = None
    description: str = ""
    notes: tuple[str, ...] = ()  # what the report should say about the --server-json file

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)  # one rule for wildcards and IPv6 brackets


def parse_endpoint(url: str) -> tuple[str, int]:
    """'http://host:port' -> (host, port); anything else is a one-line UsageError."""
    not_a_url = f"--endpoint {url!r}: give the server's base URL, e.g. http://127.0.0.1:8000 (http only)"
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError:  # an unclosed IPv6 bracket: "Invalid IPv6 URL"
        raise UsageError(not_a_url) from None
    bare_port = "://" not in url and url.rpartition(":")[2].isdigit()
    if parts.scheme not in ("http",) or not parts.hostname or ("://" not in url and not bare_port):
        raise UsageError(not_a_url)  # without a scheme only host:port reads as an address ("not-a-url" is no server)
    if parts.path not in ("", "/") or parts.query:
        raise UsageError(f"--endpoint {url!r}: give the base URL without a path (the checks add /health, /v1/...)")
    try:
        port = parts.port or 80
    except ValueError:
        raise UsageError(f"--endpoint {url!r}: the port is not a number in 1..65535") from None
    return parts.hostname, port


@dataclass
class Context:
    options: ValidateOptions
    catalog: Catalog
    model: ModelSpec
    plan: LaunchPlan
    target: ServerTarget | None = None
    client: VllmClient | None = None  # HTTP to the server under test (None: no server given)
    launched: VllmServer | None = None  # the server we started (with --launch), stopped afterwards
    inventory: HostInventory | None = None  # the GPUs' health facts, gathered once
    software: dict | None = None  # facts from the server's Python, gathered once
    data: dict = field(default_factory=dict)
    say: Callable[[str], None] = lambda line: None

    def host(self) -> HostInventory:
        """`inventory`, gathered on first use."""
        if self.inventory is None:
            self.inventory = gather_inventory(self.options.host_root)
        return self.inventory

    def path(self, p: str) -> str:
        """A host path under options.host_root (tests lay out /proc and /dev in a directory)."""
        return os.path.join(self.options.host_root, p.lstrip("/")) if self.options.host_root else p
