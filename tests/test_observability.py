"""The generated Prometheus and Grafana files (rocm_dspark/launch/observability.py) and the A/B band
(rocm_dspark/probe/ab_band.py), checked with the real promtool (Debian's prometheus 2.42): `check config` and
`check rules` for every plan form, `test rules` with series for each alert firing or staying quiet. Skipped, with
the reason, where promtool is absent (.ci/run installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from rocm_dspark.launch import observability as obs
from rocm_dspark.probe.ab_band import AcceptanceBand, acceptance_band
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec, expand

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
BAND = AcceptanceBand(64, 3.1, 3.9, "block", "20261201T000000Z-abcdef01")
EP = "http://127.0.0.1:8000"


@cache
def _plan(gpu="mi300x"):
    return resolve(load_catalog(), Selection(model="V4.1-Flash", gpu=gpu))


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60)


def _forms():
    plan = _plan()
    heads = load_catalog().find_model("V4.1-Flash").query_heads
    group = expand(ClusterSpec(strategy="multi_node_dep", nodes=2, head_address="10.0.0.1", dp_lb="hybrid"),
                   plan.argv, plan.env, query_heads=heads, port=plan.port)
    pd = expand(ClusterSpec(strategy="pd_cluster", nodes=3, node_addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3")),
                plan.argv, plan.env, query_heads=heads, port=plan.port)
    return {"single": {"target_list": obs.targets(plan), "ready": "127.0.0.1:8001", "bands": {"block": BAND}},
            "single-no-ready-no-band": {"target_list": obs.targets(plan)},
            "multi_node_dep": {"target_list": obs.targets(plan, group), "bands": {"block": BAND}},
            "pd_cluster": {"target_list": obs.targets(plan, pd)},
            "k8s": {"target_list": [], "k8s": True, "bands": {"block": BAND}}}


def _write(tmp_path: Path, name: str = "svc", **kw) -> dict[str, Path]:
    files = obs.render(_plan(), name, **kw)
    if kw.get("k8s"):  # the ConfigMaps' data, as Prometheus would mount it
        docs = list(yaml.safe_load_all(next(iter(files.values()))))
        files = {**docs[0]["data"], **docs[1]["data"]}
        files[f"{name}.prometheus.yml"] = files.pop("prometheus.yml").replace(f"/etc/prometheus/rocm-dspark/{name}.rules.yml",
                                                                           f"{name}.rules.yml")
    out = {}
    for n, text in files.items():
        (tmp_path / n).write_text(text)
        out[n.split(".", 1)[1]] = tmp_path / n
    return out


@needs_promtool
@pytest.mark.parametrize("form", list(_forms()))
def test_promtool_checks_every_form(tmp_path, form):
    files = _write(tmp_path, **_forms()[form])
    r = _promtool("check", "config", files["prometheus.yml"].name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _promtool("check", "rules", files["rules.yml"].name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    dash = json.loads(files["grafana.json"].read_text())
    assert all(t["expr"] for p in dash["panels"] for t in p["targets"])


def test_targets_cover_every_node_and_the_labels_say_what_ran():
    forms = _forms()
    group = forms["multi_node_dep"]["target_list"]
    assert [(t.node, t.role) for t in group] == [(0, "head"), (1, "worker")]
    assert group[1].address == "rocm-dspark-node1.invalid:8000"  # address unknown: never a wrong host
    pd = forms["pd_cluster"]["target_list"]
    assert [t.address for t in pd] == ["10.0.0.1:8001", "10.0.0.2:8002", "10.0.0.3:8002"]  # the router is left out
    config = yaml.safe_load(obs.render(_plan(), "svc", pd)["svc.prometheus.yml"])
    labels = [s["labels"] for s in config["scrape_configs"][0]["static_configs"]]
    assert {lab["endpoint"] for lab in labels} == {f"http://{t.address}" for t in pd}
    assert {lab["plan_hash"] for lab in labels} == {obs.plan_hash(_plan())}
    rules = yaml.safe_load(obs.render(_plan(), "svc", pd)["svc.rules.yml"])["groups"][0]["rules"]
    assert all("group_left (image_digest, verification)" in r["expr"] for r in rules)


def test_k8s_configmaps_validate():
    kv = pytest.importorskip("kubernetes_validate")
    for doc in yaml.safe_load_all(obs.render(_plan(), "v41", [], k8s=True, bands={"block": BAND})["v41.observability.k8s.yaml"]):
        kv.validate(doc, "1.32.0", strict=True)
        assert doc["kind"] == "ConfigMap"


def _alert(rules: dict, name: str, mode: str | None = None) -> dict:
    for g in rules["groups"]:
        for r in g["rules"]:
            if r.get("alert") == name and (mode is None or r["labels"].get("mode_seen") == mode):
                return r
    raise AssertionError(f"no alert {name} {mode}")


def _expect(rule: dict, labels: dict, value: str = "") -> dict:
    fill = lambda s: (s.replace("{{ $labels.endpoint }}", labels.get("endpoint", ""))
                      .replace('{{ $value | printf "%.3f" }}', value))
    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()}}


@needs_promtool
def test_alerts_fire_and_stay_quiet(tmp_path):
    """promtool test rules: acceptance inside the band (quiet) and below it (fires, with the mode the readiness
    server reports, and as "unknown" without it), vLLM gone, a canary violation (fires, then goes quiet)."""
    files = _write(tmp_path, target_list=obs.targets(_plan()), ready="127.0.0.1:8001", bands={"block": BAND})
    rules = yaml.safe_load(files["rules.yml"].read_text())
    h = obs.plan_hash(_plan())
    base = f'job="{obs.VLLM_JOB}",instance="127.0.0.1:8000",endpoint="{EP}",plan_hash="{h}"'
    spec = lambda accepted: [
        {"series": f'vllm:spec_decode_num_drafts_total{{{base},engine="0",model_name="m"}}', "values": "0+100x60"},
        {"series": f'vllm:spec_decode_num_accepted_tokens_total{{{base},engine="0",model_name="m"}}',
         "values": f"0+{accepted}x60"}]
    info = {"series": f'rocm_dspark_service_info{{job="{obs.READY_JOB}",instance="127.0.0.1:8001",endpoint="{EP}",'
                      f'plan_hash="{h}",image_digest="sha256:ab",verification="block"}}', "values": "1x60"}
    seen = {"endpoint": EP, "plan_hash": h}
    below = _alert(rules, "RocmDsparkAcceptanceBelowBand", "block")
    unknown = _alert(rules, "RocmDsparkAcceptanceBelowBand", "unknown")
    down, canary = _alert(rules, "RocmDsparkServerDown"), _alert(rules, "RocmDsparkCanaryViolation")
    at = lambda t, name, exp: {"eval_time": t, "alertname": name, "exp_alerts": exp}
    tests = [
        {"interval": "1m", "input_series": spec(250) + [info],  # AL 3.5, inside [3.1, 3.9]
         "alert_rule_test": [at("40m", "RocmDsparkAcceptanceBelowBand", [])]},
        {"interval": "1m", "input_series": spec(150) + [info],  # AL 2.5, below
         "alert_rule_test": [
             at("10m", "RocmDsparkAcceptanceBelowBand", []),  # not for 15 minutes yet
             at("40m", "RocmDsparkAcceptanceBelowBand",
                [_expect(below, {**seen, "alertname": below["alert"], "verification": "block",
                                 "image_digest": "sha256:ab"}, "2.500")])]},
        {"interval": "1m", "input_series": spec(150),  # no readiness server: verification unknown, the start mode's band
         "alert_rule_test": [at("40m", "RocmDsparkAcceptanceBelowBand",
                                [_expect(unknown, {**seen, "alertname": unknown["alert"], "verification": "unknown",
                                                   "image_digest": "unknown"}, "2.500")])]},
        {"interval": "1m", "input_series": [{"series": f"up{{{base}}}", "values": "1x10 0x20"}],
         "alert_rule_test": [at("5m", "RocmDsparkServerDown", []),
                             at("11m", "RocmDsparkServerDown", []),  # gone, not yet for 2 minutes
                             at("15m", "RocmDsparkServerDown",
                                [_expect(down, {**seen, "job": obs.VLLM_JOB, "instance": "127.0.0.1:8000",
                                                "alertname": down["alert"]})])]},
        {"interval": "1m", "input_series": [
            {"series": f'rocm_dspark_canary_runs_total{{job="{obs.READY_JOB}",instance="127.0.0.1:8001",result="violation"}}',
             "values": "0x10 1x80"},
            {"series": f'rocm_dspark_canary_runs_total{{job="{obs.READY_JOB}",instance="127.0.0.1:8001",result="pass"}}',
             "values": "0+1x90"}],
         "alert_rule_test": [
             at("5m", "RocmDsparkCanaryViolation", []),
             at("20m", "RocmDsparkCanaryViolation",
                [_expect(canary, {"job": obs.READY_JOB, "instance": "127.0.0.1:8001", "result": "violation",
                                  "alertname": canary["alert"]})]),
             at("85m", "RocmDsparkCanaryViolation", [])]},  # an hour without a new violation: quiet again
        {"interval": "1m", "input_series": [  # born with the violation counted: increase() alone would miss it
            {"series": f'rocm_dspark_canary_runs_total{{job="{obs.READY_JOB}",instance="127.0.0.1:8001",result="violation"}}',
             "values": "1x30"}],
         "alert_rule_test": [at("5m", "RocmDsparkCanaryViolation",
                                [_expect(canary, {"job": obs.READY_JOB, "instance": "127.0.0.1:8001",
                                                  "result": "violation", "alertname": canary["alert"]})])]},
    ]
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": [files["rules.yml"].name],
                                                       "evaluation_interval": "1m", "tests": tests}))
    r = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # The check can fail: the same series with AL inside the band expected to fire is refused.
    tests[0]["alert_rule_test"][0]["exp_alerts"] = tests[1]["alert_rule_test"][1]["exp_alerts"]
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": [files["rules.yml"].name],
                                                       "evaluation_interval": "1m", "tests": tests[:1]}))
    assert _promtool("test", "rules", "test.yml", cwd=tmp_path).returncode != 0


def _record(arms: dict, concurrency: int = 8):
    from rocm_dspark.probe import ab_record
    from tests.helpers.ab_records import workload

    return ab_record.parse_data(ab_record.build(
        record_id="20261201T000000Z-abcdef01", created_at="2026-12-01T00:00:00Z", finished_at="2026-12-01T00:10:00Z",
        toolkit_version="0", host={}, selection={}, fingerprint={}, concurrency=concurrency,
        workload=workload(arms["block"]["requests"]), arms=arms, override=None))


def _arm(al, requests=64, k=5):
    from tests.helpers.ab_records import arm

    return arm(100.0, al=al, concurrency=8, requests=requests,
               argv=["vllm", "serve", "m", "--speculative-config", json.dumps({"num_speculative_tokens": k})])


def test_band_width_is_k_over_sqrt_n():
    rec = _record({"block": _arm(3.5, 64), "adaptive": _arm(3.0, 64)})
    b = acceptance_band(rec, "block")
    assert b == AcceptanceBand(8, 2.875, 4.125, "block", rec.id)  # 3.5 +- 5/sqrt(64)
    a = acceptance_band(_record({"block": _arm(3.5, 16), "adaptive": _arm(3.0, 16)}), "adaptive")
    assert (a.low, a.high) == (1.75, 4.25)  # 3.0 +- 5/4
    wide = acceptance_band(_record({"block": _arm(1.5, 4), "adaptive": _arm(None, 4)}), "block")
    assert wide.low == 1.0  # clipped: never below one token per step; such a band raises no alert
    assert acceptance_band(_record({"block": _arm(1.5, 4), "adaptive": _arm(None, 4)}), "adaptive") is None
    rules = obs.render(_plan(), "svc", obs.targets(_plan()), bands={"block": wide})["svc.rules.yml"]
    assert "RocmDsparkAcceptanceBelowBand" not in rules and "too wide to alert on" in rules


def test_launch_writes_the_files(tmp_path):
    from click.testing import CliRunner

    from rocm_dspark.cli import cli

    r = CliRunner().invoke(cli, [
        "launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--output", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    written = json.loads(r.output)["observability"]
    assert sorted(Path(p).name.split(".", 1)[1] for p in written) == ["grafana.json", "prometheus.yml", "rules.yml"]


def test_trusted_record_is_the_gates_own_choice(tmp_path):
    """Through the store: a signed record for this plan at c=8 gives its band; the same record at another
    concurrency, or one whose fingerprint names another host, gives none (and the note says why)."""
    from rocm_dspark.probe import ab_record
    from rocm_dspark.probe.ab_band import bands_for, trusted_record
    from tests.helpers.ab_records import workload

    plan = _plan()._replace(concurrency=8)
    fp = {"host_id": "machine-test", "gpu": plan.gpu}
    data = ab_record.build(record_id="20261201T000000Z-abcdef02", created_at="2026-12-01T00:00:00Z",
                           finished_at="2026-12-01T00:10:00Z", toolkit_version="0", host={}, selection={},
                           fingerprint=fp, concurrency=8, workload=workload(), override=None,
                           arms={"block": _arm(3.5, 64), "adaptive": _arm(3.0, 64)})
    ab_record.write(tmp_path, data)
    rec, _ = trusted_record(load_catalog(), plan, 8, tmp_path, current=fp)
    assert rec is not None and rec.id == data["id"]
    bands, _ = bands_for(load_catalog(), plan, tmp_path, current=fp)
    assert bands["block"].low == 2.875 and bands["adaptive"].record_id == data["id"]
    assert trusted_record(load_catalog(), plan, 16, tmp_path, current=fp)[0] is None
    rec, notes = trusted_record(load_catalog(), plan, 8, tmp_path, current={**fp, "host_id": "machine-other"})
    assert rec is None and any("ignored" in n for n in notes)


@pytest.mark.parametrize("strategy", [[], ["--strategy", "multi_node_tp_dp", "--nodes", "2"]])
def test_launch_k8s_scrapes_the_manifests_service(tmp_path, strategy):
    """`launch --format k8s`: Prometheus scrapes the Service the manifests define (`<name>:<port>`), reached by name
    in the namespace; never the plan's bind address or a `.invalid` node placeholder (both came through before)."""
    from tests.helpers import run_cli

    res = run_cli(["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--format", "k8s", "--name", "svc",
                   "--output", str(tmp_path), "--state-dir", str(tmp_path / "state"), *strategy])
    assert res.returncode == 0, res.stderr
    docs = list(yaml.safe_load_all((tmp_path / "svc.k8s.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "svc")
    port = service["spec"]["ports"][0]["port"]
    maps = {d["metadata"]["name"]: d for d in yaml.safe_load_all((tmp_path / "svc.observability.k8s.yaml").read_text())}
    config = yaml.safe_load(maps["svc-prometheus"]["data"]["prometheus.yml"])
    vllm = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert vllm == [f"svc:{port}"], vllm
