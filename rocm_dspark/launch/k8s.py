"""A Cluster (recipe/cluster.py's cluster_for, k8s=True) -> Kubernetes manifests: a Deployment for one node, a
LeaderWorkerSet for a multi-node group, Deployments per pool plus vllm-router for prefill/decode, and a Service in
front. What they hold and why: docs/strategies.md and docs/security.md, "Kubernetes".

Sources: LeaderWorkerSet leaderworkerset.x-k8s.io/v1 (kubernetes-sigs/lws; CRD vendored in tests/fixtures/public/lws;
https://docs.vllm.ai/en/latest/deployment/frameworks/lws.html): `size` = pods per group, LWS_LEADER_ADDRESS and
LWS_WORKER_INDEX injected into each pod; GPUs as `amd.com/gpu` (AMD GPU device plugin,
https://instinct.docs.amd.com/projects/k8s-device-plugin/en/latest/).

Pods run the plan's BLOCK-verification argv: the adaptive start-up fallback lives in the bash launcher, which
these manifests do not run, so a pod never serves with a mode nobody proved in the cluster. Commands run through
`/bin/sh -c` so a worker can compute its rank from LWS_WORKER_INDEX; every literal word is POSIX-quoted, and every
`$` is doubled because Kubernetes expands $(VAR) in command, args and env values and turns `$$` into `$`
(https://kubernetes.io/docs/tasks/inject-data-application/define-interdependent-environment-variables/).
"""

from __future__ import annotations

import re
import shlex

from rocm_dspark.errors import UsageError
from rocm_dspark.launch import compile_cache
from rocm_dspark.launch.launch_facts import (
    CANARY_EVERY_MIN,
    CANARY_TIMEOUT_S,
    GROUP_MONO,
    MONO_REFUSAL,
    MONOKERNEL,
    READY_TIMEOUT_S,
    default_name,
)
from rocm_dspark.recipe.plan import Command, flag_for
from rocm_dspark.recipe.strategies import LEADER_PLACEHOLDER, Cluster
from rocm_dspark.recipe.vllm_args import emit

LWS_API = "leaderworkerset.x-k8s.io/v1"
GPU_RESOURCE = "amd.com/gpu"
PROBE_PERIOD_S = 10
# Outside /root: a non-root user cannot traverse the image's /root (mode 0700).
MODEL_CACHE_MOUNT = "/var/lib/rocm-dspark/hf-cache"
STATE_MOUNT = "/var/lib/rocm-dspark/state"  # so a probe run in a pod leaves its record where the gate reads it
HOME_MOUNT = "/var/lib/rocm-dspark/home"  # HOME for vLLM's, torch's and Triton's caches (an emptyDir)
# The router, pinned to a release: vllm-project/router publishes vllm/vllm-router:v<version> for each release
# (.buildkite/scripts/publish-release-images.sh, commit e0c942d4); 0.1.17 is the newest vllm-router on PyPI
# (https://pypi.org/project/vllm-router/0.1.17/, 2026-11). Its digest is not resolved here (no registry access).
ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"
# Non-root, with the GPU device files' groups. video is GID 44 on Debian/Ubuntu (base-passwd's static list);
# render has no fixed GID (a dynamic system group): 109 is a default to check with `getent group render`.
RUN_AS = 1000
GPU_GROUP_IDS = (44, 109)
# Host budget per vLLM pod (not yet run on MI300-class hardware; a budget, not a measurement): CPU for the API
# server and one busy worker process per GPU rank; memory for /dev/shm (a memory emptyDir counts against the
# pod's limit) plus each rank's host-side runtime (torch, ROCm, pinned staging).
HOST_BUDGET = {"cpu_base": 4, "cpu_per_gpu": 2, "mem_base_gib": 16, "mem_per_gpu_gib": 16}
ROUTER_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
MODEL_CACHE_GIB = 1024  # the 511 GB checkpoint, with room for a second revision
STATE_GIB = 1
SHM_GIB = 64  # each vLLM pod's /dev/shm (a memory emptyDir)
# The name also names the Services, and a Service name is a DNS-1035 label: it starts with a letter
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#rfc-1035-label-names).
_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,40}[a-z0-9])?$")
MODEL_CACHE_CLAIM = "rocm-dspark-model-cache"
STATE_CLAIM = "rocm-dspark-probe-state"


def _k8s_literal(text: str) -> str:
    """Kubernetes expands $(VAR) in command, args and env values and reads $$ as a literal $: doubling every $
    makes any string arrive as written (`x$$(HF_TOKEN)` stays that, never `x$` + the secret)."""
    return text.replace("$", "$$")


def _sh(argv: tuple[str, ...]) -> str:
    """`exec` + argv as one POSIX sh line."""
    return "exec " + " ".join(shlex.quote(a) for a in argv)


def _mono_sh(argv: tuple[str, ...]) -> str:
    """A single server's argv with --monokernel as POSIX sh, the bash launcher's refusal fallback: vLLM's output
    goes to a file that `tail` mirrors to the pod's log; when the start exits with vLLM's refusal
    (launch_facts.MONO_REFUSAL, `raise ValueError(f"--monokernel {why}.")`, vllm 0.33.0 mono_decode.py:384), the
    same argv without the flag starts in its place and one line says why. A TERM or INT is passed on and ends
    the pod, never a second start. The partition check stays with vLLM here: its compute-unit test
    (mono_decode.py:372) refuses a partitioned GPU the same way."""
    words = " ".join(shlex.quote(a) for a in argv)
    return "\n".join(
        [
            "L=$(mktemp) || exit 1",
            'tail -n +1 -f "$L" & T=$!',
            f'{words} >>"$L" 2>&1 & P=$!',
            "S=0; trap 'S=1; kill -TERM \"$P\" 2>/dev/null' TERM INT",
            'wait "$P"; R=$?',
            'while kill -0 "$P" 2>/dev/null; do wait "$P"; R=$?; done',
            'sleep 1; kill "$T" 2>/dev/null',
            "E=$(printf '\\033')",
            f'W=$(sed "s/$E\\[[0-9;]*m//g" "$L" | grep -E -o {shlex.quote(MONO_REFUSAL)} | tail -n 1); rm -f "$L"',
            'if [ "$S" = 0 ] && [ "$R" != 0 ] && [ -n "$W" ]; then',
            f'  echo "rocm-dspark: starting the same plan without {MONOKERNEL}: vLLM refused it (${{W#ValueError: }})" >&2',
            "  " + _sh(tuple(a for a in argv if a != MONOKERNEL)),
            "fi",
            'exit "$R"',
        ]
    )


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(
            f"--name {name!r}: Kubernetes names (and Service names, DNS-1035) start with a lower-case "
            "letter, then lower-case letters, digits and '-', at most 42 characters (LWS appends the "
            "group and worker index)"
        )
    return name


def _env_list(env: dict[str, str], plan, name: str, extra: tuple[dict, ...] = ()) -> list[dict]:
    """A node's env as values; every --env name (plan.secret_env) from the Secret <name>-env, never a value here."""
    names = tuple(plan.secret_env)
    out: list[dict] = [{"name": k, "value": _k8s_literal(v)} for k, v in env.items() if k not in names]
    out += [{"name": k, "valueFrom": {"secretKeyRef": {"name": f"{name}-env", "key": k}}} for k in names]
    if "HF_TOKEN" not in names:
        out.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN", "optional": True}},
            }
        )
    out.append({"name": "HF_HOME", "value": MODEL_CACHE_MOUNT})
    out.append({"name": "HOME", "value": HOME_MOUNT})
    out.append({"name": "ROCM_DSPARK_STATE_DIR", "value": STATE_MOUNT})
    out += [{"name": k, "value": v} for k, v in compile_cache.env(compile_cache.CONTAINER_DIR).items() if k not in env]
    return out + list(extra)


def _probes(port: int, startup_budget_s: int) -> dict:
    # Start-up: /health every 10 s for the whole load budget; then ready only when the model is listed.
    def probe(path: str, period: int, failures: int, timeout: int) -> dict:
        return {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": timeout,
        }

    return {
        "startupProbe": probe("/health", PROBE_PERIOD_S, max(1, -(-startup_budget_s // PROBE_PERIOD_S)), 5),
        "readinessProbe": probe("/v1/models", PROBE_PERIOD_S, 3, 5),
        "livenessProbe": probe("/health", 30, 3, 10),
    }


def _volumes(compile_cache_path: str | None) -> list[dict]:
    # The compile cache: the node's directory for this image digest and GPU (type Directory: a pod does not start
    # until it exists, so it never runs with a root-owned one it cannot write); no digest, no key: an emptyDir.
    cache = {"hostPath": {"path": compile_cache_path, "type": "Directory"}} if compile_cache_path else {"emptyDir": {}}
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": MODEL_CACHE_CLAIM}},
        {"name": "probe-state", "persistentVolumeClaim": {"claimName": STATE_CLAIM}},
        {"name": "home", "emptyDir": {}},
        {"name": "compile-cache", **cache},
    ]


_MOUNTS = [
    {"name": "dshm", "mountPath": "/dev/shm"},
    {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT},
    {"name": "probe-state", "mountPath": STATE_MOUNT},
    {"name": "home", "mountPath": HOME_MOUNT},
    {"name": "compile-cache", "mountPath": compile_cache.CONTAINER_DIR},
]


def host_budget(gpus: int) -> dict:
    """CPU and memory requests = limits for one vLLM pod using `gpus` GPUs (HOST_BUDGET)."""
    b = HOST_BUDGET
    budget = {
        GPU_RESOURCE: str(gpus),
        "cpu": str(b["cpu_base"] + b["cpu_per_gpu"] * gpus),
        "memory": f"{SHM_GIB + b['mem_base_gib'] + b['mem_per_gpu_gib'] * gpus}Gi",
    }
    return {"limits": budget, "requests": dict(budget)}


def _container(name: str, image: str, script: str, env: list[dict], gpus: int, port: int | None, budget_s: int) -> dict:
    """A vLLM container; one that serves HTTP (`port`) gets the probes for a start of up to `budget_s`."""
    c = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _k8s_literal(script)],
        "env": env,
        "resources": host_budget(gpus),
        "volumeMounts": [dict(m) for m in _MOUNTS],
        # ROCm needs the device files the plugin hands over (open through the pod's supplemental groups) and
        # unlimited locked memory for RDMA/KV tiers; nothing else is added and no privilege can be gained.
        "securityContext": {
            "capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"], "drop": ["ALL"]},
            "allowPrivilegeEscalation": False,
            "seccompProfile": {"type": "Unconfined"},
        },
    }
    if port is not None:
        c["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        c.update(_probes(port, budget_s))
    return c


POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "supplementalGroups": list(GPU_GROUP_IDS),
}


def _pod_spec(containers: list[dict], volumes: list[dict]) -> dict:
    return {
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": 330,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "securityContext": dict(POD_SECURITY),
        "automountServiceAccountToken": False,
    }


def _claims(shared: bool, labels: dict) -> list[dict]:
    """The PVCs the pods mount. Pods on several nodes mounting one claim need ReadWriteMany."""
    mode = "ReadWriteMany" if shared else "ReadWriteOnce"
    why = (
        "ReadWriteMany: pods on different nodes mount this claim at once; the storage class must support it"
        if shared
        else "ReadWriteOnce: one pod on one node mounts it"
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim,
                "labels": dict(labels),
                "annotations": {"rocm-dspark/access-mode": why, "rocm-dspark/holds": holds},
            },
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": f"{gib}Gi"}}},
        }
        for claim, gib, holds in (
            (MODEL_CACHE_CLAIM, MODEL_CACHE_GIB, "the Hugging Face cache (HF_HOME)"),
            (STATE_CLAIM, STATE_GIB, "probe records (ROCM_DSPARK_STATE_DIR)"),
        )
    ]


def _canary(name: str, plan, port: int) -> dict:
    """A CronJob running `rocm-dspark canary` against the Service every CANARY_EVERY_MIN minutes, in the plan's
    image (it holds rocm-dspark: the plugin is installed there). Forbid: never two at once (the canary's lock in
    a cluster). Its record lives in the Job's own /tmp (an emptyDir would be world-writable, which the state
    dir's trust rules refuse): the result is the Job's exit status and log. These pods serve block only, so there
    is nothing to switch."""
    argv = ["python3", "-m", "rocm_dspark", "canary", "--endpoint", f"http://{name}:{port}"]
    argv += ["--timeout", str(CANARY_TIMEOUT_S), "--state-dir", "/tmp/rocm-dspark"]
    if plan.capture_size:
        argv += ["--capture-size", str(plan.capture_size)]
    if plan.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(plan.max_num_batched_tokens)]
    labels = app_labels(name, "canary")
    c = {
        "name": "canary",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [_k8s_literal(w) for w in argv],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod = {
        "containers": [c],
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY),
    }
    job = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": CANARY_TIMEOUT_S + 60,
        "ttlSecondsAfterFinished": 3600,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": f"{name}-canary", "labels": labels},
        "spec": {
            "schedule": f"*/{CANARY_EVERY_MIN} * * * *",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 60 * CANARY_EVERY_MIN,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 5,
            "jobTemplate": {"spec": job},
        },
    }


def app_labels(name: str, component: str) -> dict:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "rocm-dspark",
    }


def _service(name: str, selector: dict, port: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(selector)},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def _deployment(name: str, labels: dict, replicas: int, pod: dict, annotations: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels), "annotations": annotations},
        # Recreate: a rolling update would need a second set of GPUs while the old pod still holds them.
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def _leader_word(word: str) -> str:
    """One word as sh, the leader's placeholder in it (a reserved .invalid name: nothing else holds it) read from
    the LWS env: `--master-addr` and `--data-parallel-address`'s values, `ray start`'s --address=HOST:PORT."""
    return '"${LWS_LEADER_ADDRESS}"'.join(shlex.quote(part) if part else "" for part in word.split(LEADER_PLACEHOLDER))


def _pod_sh(argv: tuple[str, ...], rank_values: dict[str, str] | None = None) -> str:
    """`exec` + a group node's command as one sh line, the leader's address from the LWS env. `rank_values`
    (dest -> a shell expression) set those flags of a `vllm serve` Command from the pod's own rank."""
    if not isinstance(argv, Command):  # `ray start`: run as given
        return "exec " + " ".join(_leader_word(w) for w in argv)
    exprs = {flag_for(dest): expr for dest, expr in (rank_values or {}).items()}
    words = [_leader_word(w) for w in argv.head]
    for flag, value in argv.flags:
        words += (
            [flag, exprs[flag]] if flag in exprs and value is not None else [_leader_word(w) for w in emit(flag, value)]
        )
    return "exec " + " ".join(words)


def _worker_script(argv: tuple[str, ...], dp_local: int) -> str:
    """Node 1's command for every worker pod, its rank's flags computed from the LWS env."""
    return _pod_sh(
        Command.from_words(argv) if tuple(argv[:2]) == ("vllm", "serve") else argv,
        {
            "node_rank": '"${LWS_WORKER_INDEX}"',
            "data_parallel_start_rank": f'"$((LWS_WORKER_INDEX * {int(dp_local)}))"',
        },
    )


def _block_argv(cmd) -> tuple[str, ...]:
    """What a pod runs: a node's block-verification argv (its adaptive start's fallback lives in the bash launcher)."""
    return cmd.block_argv or cmd.argv


def manifests_for(
    plan, cluster: Cluster, *, name: str | None = None, startup_budget_s: int = READY_TIMEOUT_S
) -> list[dict]:
    """The manifests for `cluster` (its leader's address LEADER_PLACEHOLDER, a pool node's a .invalid name: what
    cluster_for gives with k8s=True), as dicts in apply order; `plan` is node 0's plan."""
    name = _check_name(k8s_name(plan, name))
    if startup_budget_s <= 0:
        raise UsageError(f"--ready-timeout {startup_budget_s}: give a positive number of seconds")
    notes = {
        "rocm-dspark/profile": plan.profile,
        "rocm-dspark/status": f"{plan.status} ({plan.status_date})",
        "rocm-dspark/verification": "block (the adaptive fallback lives in the bash launcher, not in these pods)",
        "rocm-dspark/hardware": "not yet run on MI300-class hardware",
    }
    image = plan.image
    if "@sha256:" not in image:
        notes["rocm-dspark/image"] = (
            "not pinned by digest: unresolved here; run `rocm-dspark images` and regenerate (the plan then names the digest)"
        )
    notes["rocm-dspark/gpu-groups"] = (
        f"pods run as uid {RUN_AS} with supplementalGroups {list(GPU_GROUP_IDS)} (video, "
        "render): set them to `getent group video render` on the nodes"
    )
    if plan.secret_env:
        notes["rocm-dspark/secret"] = (
            f"Secret {name}-env holds {', '.join(plan.secret_env)} (given by --env; not in "
            f"this file): kubectl create secret generic {name}-env --from-env-file=FILE"
        )
    key = compile_cache.image_key(image, plan.arch)
    cache_path = f"{compile_cache.UNIT_ROOT}/{name}/{key}" if key else None
    notes["rocm-dspark/compile-cache"] = (
        f"hostPath {cache_path}, one per image digest and GPU: on each node run sudo install -d -o {RUN_AS} -g "
        f"{RUN_AS} {cache_path} (pods wait until it exists); old keys beside it are yours to remove"
        if cache_path
        else "an emptyDir: the image has no digest, so there is no key and every start compiles cold"
    )
    vols = _volumes(cache_path)
    port = int(plan.port)
    head = cluster.commands[0]

    if cluster.strategy == "single_node":
        argv = _block_argv(head)
        labels = app_labels(name, "server")
        script = _mono_sh(argv) if MONOKERNEL in argv else _sh(argv)
        c = _container("vllm", image, script, _env_list(head.env, plan, name), _gpus_used(argv), port, startup_budget_s)
        return [
            *_claims(False, labels),
            _deployment(name, labels, 1, _pod_spec([c], vols), notes),
            _service(name, labels, port),
            _canary(name, plan, port),
        ]

    if cluster.strategy == "pd_cluster":
        return [
            *_claims(True, app_labels(name, "storage")),
            *_pd_manifests(plan, cluster, name, vols, notes, startup_budget_s),
        ]

    worker, g = cluster.commands[1], cluster.layout["gpus_per_node"]
    labels = app_labels(name, "group")
    if MONOKERNEL in _block_argv(head):
        notes = {**notes, "rocm-dspark/monokernel": GROUP_MONO}
    setup = "".join(" ".join(shlex.quote(w) for w in s) + " && " for s in head.setup)
    leader_script, leader_env = setup + _pod_sh(_block_argv(head)), _env_list(head.env, plan, name)
    leader_c = _container("vllm-leader", image, leader_script, leader_env, g, port, startup_budget_s)
    worker_script = _worker_script(_block_argv(worker), cluster.layout["dp_local"] or 1)
    worker_port = port if worker.serves_http else None
    worker_env = _env_list(worker.env, plan, name)
    worker_c = _container("vllm-worker", image, worker_script, worker_env, g, worker_port, startup_budget_s)
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "labels": dict(labels),
            "annotations": {**notes, "rocm-dspark/strategy": cluster.strategy},
        },
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": cluster.nodes,
                # One failed pod restarts the whole group: every node comes back with the same argv together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, "role": "leader"}},
                    "spec": _pod_spec([leader_c], vols),
                },
                "workerTemplate": {
                    "metadata": {"labels": {**labels, "role": "worker"}},
                    "spec": _pod_spec([worker_c], [dict(v) for v in vols]),
                },
            },
        },
    }
    # The Service selects the leader only: its /v1/models answers once every rank of the group is up.
    svc = _service(name, {**labels, "role": "leader"}, port)
    if worker.serves_http:
        svc["spec"]["selector"] = dict(labels)  # hybrid LB: every node serves its own ranks
    return [*_claims(True, labels), lws, svc, _canary(name, plan, port)]


def _gpus_used(argv: tuple[str, ...]) -> int:
    return Command.from_words(argv).gpus_per_node_used


def _pd_manifests(plan, cluster: Cluster, name: str, vols: list[dict], notes: dict, budget: int) -> list[dict]:
    assert cluster.spec is not None  # expand() keeps what was asked
    if (cluster.spec.connector or "nixl") != "nixl":
        raise UsageError(
            "--format k8s emits prefill/decode with --connector nixl only: MoRIIO instances register "
            "with the proxy's IP at start; use --format shell or systemd for MoRIIO"
        )
    out: list[dict] = []
    router = next(c for c in cluster.commands if c.role == "router")
    for role in ("prefill", "decode"):
        pool = [c for c in cluster.commands if c.role == role]
        cmd, argv = pool[0], _block_argv(pool[0])
        assert cmd.port is not None  # every pool command serves HTTP
        labels = app_labels(name, role)
        env = {k: v for k, v in cmd.env.items() if k != "VLLM_NIXL_SIDE_CHANNEL_HOST"}
        pod_ip = {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        env_list = _env_list(env, plan, name, (pod_ip,))
        c = _container("vllm", plan.image, _sh(argv), env_list, _gpus_used(argv), cmd.port, budget)
        pod = _pod_spec([c], vols)
        out.append(
            _deployment(f"{name}-{role}", labels, len(pool), pod, {**notes, "rocm-dspark/strategy": "pd_cluster"})
        )
        out.append(_service(f"{name}-{role}", labels, cmd.port))
    # The router reaches each pool through its Service (NIXL hands the prefill pod's side channel to decode).
    pools = {i for i, a in enumerate(router.argv) if a in ("--prefill", "--decode")}
    r_argv = [a for i, a in enumerate(router.argv) if i not in pools and i - 1 not in pools]
    ports = {c.role: c.port for c in cluster.commands}
    r_argv[2:2] = [
        "--prefill",
        f"http://{name}-prefill:{ports['prefill']}",
        "--decode",
        f"http://{name}-decode:{ports['decode']}",
    ]
    labels = app_labels(name, "router")
    rc = {
        "name": "vllm-router",
        "image": ROUTER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _k8s_literal(_sh(tuple(r_argv)))],
        "ports": [{"name": "http", "containerPort": router.port, "protocol": "TCP"}],
        "resources": {k: dict(v) for k, v in ROUTER_RESOURCES.items()},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "readinessProbe": {"tcpSocket": {"port": router.port}, "periodSeconds": 10},
    }
    router_pod = {
        "containers": [rc],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS},
    }
    pin = f"{ROUTER_IMAGE}: a vllm-project/router release tag; pin its digest (docker buildx imagetools inspect) before production"
    out.append(_deployment(f"{name}-router", labels, 1, router_pod, {**notes, "rocm-dspark/image": pin}))
    assert router.port is not None
    out.append(_service(name, labels, router.port))
    return out


def k8s_name(plan, name: str | None = None) -> str:
    return (name or default_name(plan.profile))[:42].rstrip("-")


def apply_needs(plan, name: str | None = None) -> str:
    """What the cluster must hold before `kubectl apply` of these manifests: the objects they name."""
    name = k8s_name(plan, name)
    needs = [f"the PVCs {MODEL_CACHE_CLAIM} and {STATE_CLAIM}", "the LWS controller for multi-node"]
    if plan.secret_env:
        needs.insert(
            0,
            f"the Secret {name}-env with {', '.join(plan.secret_env)} (kubectl create secret generic "
            f"{name}-env --from-env-file=FILE)",
        )
    if "HF_TOKEN" not in plan.secret_env:
        needs.append("optionally a Secret hf-token with HF_TOKEN")
    return "needs " + ", ".join(needs)


_LOOKS_TYPED = re.compile(r"[-+]?(\.?[0-9]|\.(inf|nan)\b)|(y|yes|n|no|on|off|true|false|null|~)$", re.IGNORECASE)


def render_yaml(manifests: list[dict]) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # no &id001 anchors: each manifest reads on its own
            return True

    def _str(dumper, data):
        # PyYAML quotes only what YAML 1.1 reads as non-strings; Kubernetes' YAML 1.2 reader also takes 0o17,
        # 1e5 or .5 as numbers. Quote every string that starts like a number, bool or null.
        style = '"' if _LOOKS_TYPED.match(data) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)

    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


__all__ = ["manifests_for", "apply_needs", "k8s_name", "render_yaml", "LWS_API", "GPU_RESOURCE"]
