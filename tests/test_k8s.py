"""Kubernetes manifests (`rocm-dspark launch --format k8s`), validated offline against real schemas:

* built-in kinds (Deployment, Service) with kubernetes-validate, strict mode, Kubernetes 1.32 schemas;
* LeaderWorkerSet against the openAPIV3Schema of the LWS v0.9.0 CRD (vendored from kubernetes-sigs/lws),
  with unknown fields refused the way a structural schema prunes them;
* kubectl: `kubectl kustomize` parses them without a cluster; `kubectl apply --dry-run=client` needs an API
  server for discovery, so that part is skipped with the reason kubectl gives.
"""

from __future__ import annotations

import json

import copy
import gzip
import shlex
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.errors import UsageError
from rocm_dspark.launch.k8s import GPU_RESOURCE, LWS_API, render_yaml
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec
from tests.helpers.k8s_cluster import k8s_manifests

kv = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

K8S_VERSION = "1.32.0"  # the schema version we validate against (kubectl on the CI machine is 1.32)
CRD = Path(__file__).parent / "fixtures" / "public" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.v0.9.0.yaml.gz"
GPUS = ("mi300x", "mi325x", "mi350x", "mi355x")
MULTI = ("multi_node_tp", "multi_node_tep", "multi_node_dep", "multi_node_tp_dp", "multi_node_tp_pp")


def _strict(schema):
    """Refuse unknown fields: objects with `properties` get additionalProperties false unless the CRD keeps them."""
    if isinstance(schema, dict):
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        for v in schema.values():
            _strict(v)
    elif isinstance(schema, list):
        for v in schema:
            _strict(v)
    return schema


@lru_cache(maxsize=1)
def lws_validator():
    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # metadata is validated by the API server's ObjectMeta, not the CRD; accept its usual fields.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict) -> None:
    if obj["apiVersion"] == LWS_API:
        errors = sorted(lws_validator().iter_errors(obj), key=lambda e: list(e.path))
        assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    else:
        kv.validate(obj, K8S_VERSION, strict=True)


@lru_cache(maxsize=None)
def _plan(gpu: str, served_name: str | None = None):
    cat = load_catalog()
    return resolve(cat, Selection(model="V4.1-Flash", gpu=gpu, served_name=served_name)), cat.find_model("V4.1-Flash").query_heads


def manifests(gpu: str, strategy: str, **kw) -> list[dict]:
    plan, heads = _plan(gpu, kw.pop("served_name", None))
    nodes = kw.pop("nodes", 1 if strategy == "single_node" else 2)
    spec = ClusterSpec(strategy=strategy, nodes=nodes, iface="eth0", **kw)
    return k8s_manifests(plan, spec, heads)


def _script(container: dict) -> str:
    assert container["command"][:2] == ["/bin/sh", "-c"]
    return container["command"][2].replace("$$", "$")  # what Kubernetes hands the pod


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("strategy", ("single_node",) + MULTI + ("pd_cluster",))
def test_every_manifest_validates(gpu, strategy):
    objs = manifests(gpu, strategy)
    for obj in objs:
        validate(obj)
    kinds = [o["kind"] for o in objs]
    claims = ["PersistentVolumeClaim"] * 2
    if strategy == "single_node":
        assert kinds == claims + ["Deployment", "Service", "CronJob"]
    elif strategy == "pd_cluster":
        assert kinds == claims + ["Deployment", "Service"] * 3
    else:
        assert kinds == claims + ["LeaderWorkerSet", "Service", "CronJob"]
        objs = objs[2:]
        assert objs[0]["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert objs[0]["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    for obj in objs:
        validate(obj)


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_tp"))
def test_the_canary_is_a_cronjob_never_two_at_once_bounded_and_checking_the_service(strategy):
    from rocm_dspark.launch.launch_facts import CANARY_EVERY_MIN, CANARY_TIMEOUT_S

    plan, _ = _plan("mi300x")
    job = manifests("mi300x", strategy)[-1]
    validate(job)
    assert job["kind"] == "CronJob" and job["spec"]["schedule"] == f"*/{CANARY_EVERY_MIN} * * * *"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"  # the lock, in a cluster
    spec = job["spec"]["jobTemplate"]["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == CANARY_TIMEOUT_S + 60
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["image"] == plan.image and c["command"] == [
        "python3", "-m", "rocm_dspark", "canary", "--endpoint", f"http://v41:{plan.port}", "--timeout",
        str(CANARY_TIMEOUT_S), "--state-dir", "/tmp/rocm-dspark", "--capture-size", str(plan.capture_size),
        "--max-num-batched-tokens", str(plan.max_num_batched_tokens)]
    bad = json.loads(json.dumps(job))
    bad["spec"]["jobTemplate"]["spec"]["backoffLimit"] = "never"  # the schema checks this kind too
    with pytest.raises(Exception, match="never"):
        validate(bad)


def test_lws_validation_can_fail():
    lws = manifests("mi300x", "multi_node_tp")[2]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(AssertionError):
        validate(bad)
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(AssertionError):
        validate(bad)
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["volumeMounts"][0]["mountpath"] = "/x"
    with pytest.raises(AssertionError):
        validate(bad)


def test_builtin_validation_can_fail():
    dep = manifests("mi300x", "single_node")[2]
    dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["paht"] = "/health"
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, K8S_VERSION, strict=True)


def _pods(objs):
    for o in objs:
        if o["kind"] == "Deployment":
            yield o["spec"]["template"]["spec"]
        elif o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            yield t["leaderTemplate"]["spec"]
            yield t["workerTemplate"]["spec"]


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_dep", "multi_node_tp", "pd_cluster"))
def test_pods_get_gpus_shm_cache_state_secret_and_probes(strategy):
    objs = manifests("mi355x", strategy)
    for pod in _pods(objs):
        c = pod["containers"][0]
        if c["name"] == "vllm-router":
            continue
        assert int(c["resources"]["limits"][GPU_RESOURCE]) >= 1
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/dev/shm", "/var/lib/rocm-dspark/hf-cache", "/var/lib/rocm-dspark/state"} <= mounts
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
        env = {e["name"]: e for e in c["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
        assert env["ROCM_DSPARK_STATE_DIR"]["value"] == "/var/lib/rocm-dspark/state"
        if "startupProbe" in c:
            sp = c["startupProbe"]
            assert sp["httpGet"]["path"] == "/health"
            assert sp["periodSeconds"] * sp["failureThreshold"] >= 3600  # a 511 GB load
            assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
            assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        # The image is the plan's build's: by digest where one is published, else its tag (with a note).
        plan, _ = _plan("mi355x", None)
        assert c["image"] == plan.image and ("@sha256:" in c["image"]) == (plan.build.digest is not None)


def test_block_verification_runs_in_pods_and_k_is_the_same_everywhere():
    objs = manifests("mi300x", "multi_node_dep")[2:]
    scripts = [_script(p["containers"][0]) for p in _pods(objs)]
    specs = set()
    for s in scripts:
        argv = shlex.split(s)
        specs.add(argv[argv.index("--speculative-config") + 1])
    assert len(specs) == 1
    assert '"enable_adaptive_verification":false' in specs.pop()


def test_worker_rank_and_leader_address_come_from_lws_env():
    lws = manifests("mi300x", "multi_node_dep")[2]
    worker = _script(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0])
    assert '--data-parallel-start-rank "$((LWS_WORKER_INDEX * 8))"' in worker
    assert '--data-parallel-address "${LWS_LEADER_ADDRESS}"' in worker
    tp = manifests("mi300x", "multi_node_tp")[2]["spec"]["leaderWorkerTemplate"]
    w = _script(tp["workerTemplate"]["spec"]["containers"][0])
    assert '--node-rank "${LWS_WORKER_INDEX}"' in w and "--headless" in w
    assert '--master-addr "${LWS_LEADER_ADDRESS}"' in _script(tp["leaderTemplate"]["spec"]["containers"][0])
    # The shell really computes the rank: run the worker's words through sh with the LWS env.
    words = subprocess.run(["sh", "-c", worker.replace("exec ", "printf '%s\\n' ", 1)], capture_output=True, text=True,
                           env={"LWS_WORKER_INDEX": "3", "LWS_LEADER_ADDRESS": "10.1.2.3", "PATH": "/usr/bin:/bin"}).stdout.split("\n")
    assert words[words.index("--data-parallel-start-rank") + 1] == "24"
    assert words[words.index("--data-parallel-address") + 1] == "10.1.2.3"


def test_ray_variant_in_lws():
    lws = manifests("mi355x", "multi_node_tp_dp", backend="ray")[2]["spec"]["leaderWorkerTemplate"]
    leader = _script(lws["leaderTemplate"]["spec"]["containers"][0])
    worker = _script(lws["workerTemplate"]["spec"]["containers"][0])
    assert leader.startswith("ray start --head --port=6379 && exec vllm serve")
    assert "--data-parallel-backend ray" in leader
    assert worker == 'exec ray start --address="${LWS_LEADER_ADDRESS}":6379 --block'


def test_hostile_strings_reach_vllm_literally():
    name = "x $(touch /tmp/pwned) `id` 'q' \"d\" ${HOME} $$"
    objs = manifests("mi300x", "multi_node_tp", served_name=name)
    for pod in _pods(objs):
        c = pod["containers"][0]
        script = c["command"][2]
        assert "$(touch" not in script.replace("$$(", "")  # Kubernetes would expand $(VAR) otherwise
        argv = shlex.split(_script(c))
        assert argv[argv.index("--served-model-name") + 1] == name
        validate_ok = [o for o in objs if o["kind"] == "LeaderWorkerSet"]
        for o in validate_ok:
            validate(o)


def test_pd_router_and_side_channel_from_pod_ip():
    objs = manifests("mi355x", "pd_cluster")[2:]
    names = [o["metadata"]["name"] for o in objs]
    assert names == ["v41-prefill", "v41-prefill", "v41-decode", "v41-decode", "v41-router", "v41"]
    router = objs[4]["spec"]["template"]["spec"]["containers"][0]
    argv = shlex.split(_script(router))
    assert argv[1:4] == ["vllm-router", "--vllm-pd-disaggregation", "--prefill"] or "--vllm-pd-disaggregation" in argv
    assert "http://v41-prefill:8001" in argv and "http://v41-decode:8002" in argv
    for o in objs[0], objs[2]:
        env = {e["name"]: e for e in o["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert "UCX_TLS" in env and "NCCL_SOCKET_IFNAME" not in env
    with pytest.raises(UsageError, match="MoRIIO"):
        manifests("mi355x", "pd_cluster", connector="moriio")


def test_bad_name_is_refused():
    plan, heads = _plan("mi300x")
    with pytest.raises(UsageError, match="--name"):
        k8s_manifests(plan, ClusterSpec(), heads, name="Bad_Name")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_parses_them_offline(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "no-kubeconfig"), "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)}
    for strategy, count in (("single_node", 5), ("multi_node_dep", 5), ("pd_cluster", 8)):
        d = tmp_path / strategy
        d.mkdir()
        (d / "all.yaml").write_text(render_yaml(manifests("mi300x", strategy)))
        (d / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["all.yaml"]}))
        r = subprocess.run(["kubectl", "kustomize", str(d)], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert len(list(yaml.safe_load_all(r.stdout))) == count
    # `apply --dry-run=client` still asks an API server for discovery; with none (loopback only) it fails.
    r = subprocess.run(["kubectl", "apply", "--dry-run=client", "-f", str(tmp_path / "single_node" / "all.yaml")],
                       capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0 and ("connection refused" in r.stderr or "openapi" in r.stderr):
        pytest.skip(f"kubectl apply --dry-run=client needs a cluster for discovery: {r.stderr.strip().splitlines()[-1][:200]}")
    assert r.returncode == 0, r.stderr


# ---- issue 22: what an SRE would apply ----------------------------------------------------------------

def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command/args/env values (kubernetes third_party/forked/golang/expansion):
    $$ -> $, $(NAME) -> NAME's value when defined (else kept as written), any other $ kept."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, text[i:end + 1]))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_tp", "pd_cluster"))
def test_dollar_strings_reach_the_pod_literally_after_kubernetes_expansion(strategy):
    name = "x$$(HF_TOKEN) $(HF_TOKEN) $$ $"
    objs = manifests("mi355x", strategy, served_name=name)
    pod_env = {"HF_TOKEN": "hf_SECRET", "HOME": "/h"}
    seen = 0
    for pod in _pods(objs):
        c = pod["containers"][0]
        if c["name"] == "vllm-router":
            continue
        script = k8s_expand(c["command"][2], pod_env)
        argv = shlex.split(script.replace('"${LWS_LEADER_ADDRESS}"', "leader").replace('"${LWS_WORKER_INDEX}"', "1"))
        if "--served-model-name" in argv:
            assert argv[argv.index("--served-model-name") + 1] == name
            seen += 1
        assert "hf_SECRET" not in script
    assert seen


def test_env_values_yaml_would_read_as_numbers_are_quoted():
    plan, heads = _plan("mi300x")
    plan = plan._replace(env={**plan.env, "A": "0o17", "B": "1e5", "C": ".5", "D": "on", "E": "0x1F", "F": "plain"})
    text = render_yaml(k8s_manifests(plan, ClusterSpec(), heads))
    for key, value in (("A", "0o17"), ("B", "1e5"), ("C", ".5"), ("D", "on"), ("E", "0x1F")):
        assert f'- name: {key}\n          value: "{value}"' in text, key
    assert "- name: F\n          value: plain" in text
    env = {e["name"]: e.get("value") for e in list(yaml.safe_load_all(text))[2]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["A"] == "0o17" and env["B"] == "1e5"


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_dep", "pd_cluster"))
def test_pods_have_requests_limits_non_root_and_their_claims(strategy):
    objs = manifests("mi355x", strategy)
    claims = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
    assert set(claims) == {"rocm-dspark-model-cache", "rocm-dspark-probe-state"}
    shared = strategy != "single_node"
    for c in claims.values():
        assert c["spec"]["accessModes"] == (["ReadWriteMany"] if shared else ["ReadWriteOnce"])
        assert c["metadata"]["annotations"]["rocm-dspark/access-mode"].startswith(c["spec"]["accessModes"][0])
        validate(c)
    for pod in _pods(objs):
        c = pod["containers"][0]
        res = c["resources"]
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res[part]), part
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        if c["name"] != "vllm-router":
            assert pod["securityContext"]["supplementalGroups"] == [44, 109]      # video, render
            gpus = int(res["limits"][GPU_RESOURCE])
            assert res["limits"]["cpu"] == str(4 + 2 * gpus) and res["limits"]["memory"] == f"{64 + 16 + 16 * gpus}Gi"
            for v in pod["volumes"]:
                if "persistentVolumeClaim" in v:
                    assert v["persistentVolumeClaim"]["claimName"] in claims


def test_router_image_is_a_release_not_nightly():
    objs = manifests("mi355x", "pd_cluster")
    (router,) = [p["containers"][0] for p in _pods(objs) if p["containers"][0]["name"] == "vllm-router"]
    assert router["image"] == "vllm/vllm-router:v0.1.17" and "vllm-router:nightly" not in render_yaml(objs)


def test_env_values_given_by_the_operator_come_from_a_secret():
    cat = load_catalog()
    plan = resolve(cat, Selection(model="V4.1-Flash", gpu="mi300x",
                                  extra_env=(("HF_TOKEN", "hf_PLANTED"), ("MY_VAR", "planted-2"))))
    for strategy in ("single_node", "multi_node_tp", "pd_cluster"):
        objs = k8s_manifests(plan, ClusterSpec(strategy=strategy, nodes=1 if strategy == "single_node" else 2),
                             cat.find_model("V4.1-Flash").query_heads)
        text = render_yaml(objs)
        assert "PLANTED" not in text and "planted-2" not in text
        for pod in _pods(objs):
            env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
            if not env:
                continue
            for k in ("HF_TOKEN", "MY_VAR"):
                assert env[k]["valueFrom"]["secretKeyRef"] == {"name": "v41-env", "key": k}


@pytest.mark.parametrize("strategy", ("single_node", "multi_node_tp"))
def test_the_compile_cache_is_a_hostpath_per_image_digest_and_gpu_and_validates(strategy):
    from rocm_dspark.launch import compile_cache as cc

    plan, heads = _plan("mi355x")
    spec = ClusterSpec(strategy=strategy, nodes=1 if strategy == "single_node" else 2, iface="eth0")
    paths = []
    for digest in ("1" * 64, "2" * 64):
        objs = k8s_manifests(plan._replace(image="r/vllm@sha256:" + digest), spec, heads)
        for obj in objs:
            validate(obj)
        for pod in _pods(objs):
            vol = next(v for v in pod["volumes"] if v["name"] == "compile-cache")
            assert vol["hostPath"]["type"] == "Directory"
            paths.append(vol["hostPath"]["path"])
            for c in pod["containers"]:
                assert {"name": "compile-cache", "mountPath": cc.CONTAINER_DIR} in c["volumeMounts"]
                assert {"name": "VLLM_CACHE_ROOT", "value": f"{cc.CONTAINER_DIR}/vllm"} in c["env"]
    assert set(paths) == {f"/var/cache/rocm-dspark/v41/img-{d * 12}-gfx950-c1" for d in "12"}
    unpinned = k8s_manifests(plan._replace(image="r/vllm:latest"), spec, heads)
    for pod in _pods(unpinned):
        assert next(v for v in pod["volumes"] if v["name"] == "compile-cache") == {"name": "compile-cache", "emptyDir": {}}
