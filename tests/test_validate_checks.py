"""The host checks' decisions, fed the GPU facts parsed from real recorded outputs (tests/fixtures/host) and
the documented amd-smi JSON (tests/fixtures/host/amdsmi_json). No GPU is faked: the inventories below are
what rocm_dspark.runtime (gpus, inventory) parses from those files. Where a failing host is needed (ECC errors, a hot GPU), one
value is changed in memory and the test says so."""

from __future__ import annotations

import grp
import os

import pytest

from rocm_dspark.runtime import inventory, partition
from rocm_dspark.usecase.launch_plan import plan_for
from rocm_dspark.validate import host_checks, server_checks
from rocm_dspark.validate.context import Context, ValidateOptions
from tests.conftest import FIXTURES

HOST = FIXTURES / "host"
JSON = HOST / "amdsmi_json"


def inventory_from_rocminfo_x8(kfd=True) -> inventory.HostInventory:
    text = (HOST / "rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt").read_text()
    gpus = inventory.merge_facts(inventory.rocminfo_facts(text))
    return inventory.HostInventory(tuple(gpus), {"amd-smi": None, "rocminfo": "/opt/rocm/bin/rocminfo"}, kfd, ("rocminfo",))


def ctx_for(tmp_path, inv, gpu="mi300x", **opts) -> Context:
    catalog, selection, plan = plan_for({"model": "V4.1-Flash", "gpu": gpu, "adaptive": "off"})
    options = ValidateOptions(report_dir=tmp_path / "report", host_root=str(tmp_path), **opts)
    return Context(options, catalog, catalog.find_model(plan.model_key), plan, inventory=inv)


def test_mi300x_x8_host_matches_the_mi300x_profile(tmp_path):
    ctx = ctx_for(tmp_path, inventory_from_rocminfo_x8())
    assert host_checks.gpus(ctx).status == "pass"
    out = host_checks.gpu_profile(ctx)
    assert out.status == "pass", out.message
    assert out.value == {"gpu": "mi300x", "count": 8} and out.threshold["count_at_least"] == 8   # TP8 profile
    assert host_checks.hbm(ctx).status == "pass"                  # ~192 GiB each
    assert host_checks.ecc(ctx).status == "warn"                  # rocminfo carries no ECC counts
    assert host_checks.temperature(ctx).status == "warn"          # ... nor temperatures


def test_rocm_smi_host_temperature_and_power(tmp_path):
    # What inventory() merges on a host without amd-smi: rocminfo, then `rocm-smi -a` (one 4-GPU host).
    info = (HOST / "rocminfo_text__mi300x_x4__driver6.7.0__thamada-nvidia-smi.txt").read_text()
    rocminfo = inventory.rocminfo_facts(info)
    smi = inventory.parse_rocm_smi_showall(
        (HOST / "rocm-smi_showall_text__mi300x_x4__driver6.7.0__thamada-nvidia-smi.txt").read_text())
    inv = inventory.HostInventory(tuple(inventory.merge_facts(rocminfo, smi)), {"rocm-smi": "/opt/rocm/bin/rocm-smi"},
                                  True, ("rocminfo", "rocm-smi -a"))
    ctx = ctx_for(tmp_path, inv)
    t = host_checks.temperature(ctx)
    hottest = max(c for s in smi for c in s["temperature_c"].values())
    assert t.status == "pass" and t.value == hottest and 30 < hottest < 100
    assert host_checks.power(ctx).status == "pass"                # 750 W cap = MI300X TDP


def test_wrong_gpu_for_the_profile_fails_with_the_fix(tmp_path):
    out = host_checks.gpu_profile(ctx_for(tmp_path, inventory_from_rocminfo_x8(), gpu="mi355x"))
    assert out.status == "fail"
    assert "the plan assumed mi355x" in out.message and "this host has mi300x" in out.message and "--gpu mi300x" in out.message


def test_too_few_gpus_for_tp8(tmp_path):
    inv = inventory_from_rocminfo_x8()
    inv = inv._replace(gpus=inv.gpus[:4])
    out = host_checks.gpu_profile(ctx_for(tmp_path, inv))
    assert out.status == "fail" and "needs 8 GPUs" in out.message and "4 are visible" in out.message


def test_documented_amdsmi_json_host(tmp_path):
    static = inventory.parse_amdsmi_facts((JSON / "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example.json").read_text())
    metric = inventory.parse_amdsmi_facts((JSON / "metric_ecc_temperature_power__x8__amdsmi-docs-examples.json").read_text())
    inv = inventory.HostInventory(tuple(inventory.merge_facts(static, metric)[:1]), {"amd-smi": "/usr/bin/amd-smi"}, True, ())
    ctx = ctx_for(tmp_path, inv)
    assert host_checks.ecc(ctx).status == "pass"                  # the documented zero counts
    t = host_checks.temperature(ctx)
    assert t.status == "pass" and t.value == 33                   # below the documented 100 C / 105 C limits
    assert host_checks.gpu_profile(ctx).status == "fail"          # an MI300A is no catalog part
    assert host_checks.power(ctx).status == "warn"                # 550 W cap < MI300X 750 W TDP


def test_uncorrectable_ecc_fails_and_hot_gpu_warns(tmp_path):
    metric = inventory.parse_amdsmi_facts((JSON / "metric_ecc_temperature_power__x8__amdsmi-docs-examples.json").read_text())
    static = inventory.parse_amdsmi_facts((JSON / "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example.json").read_text())
    gpus = inventory.merge_facts(static, metric)
    # Changed in memory for this test: GPU 3 with 2 uncorrectable errors, GPU 0 at its slowdown limit.
    gpus[3] = gpus[3]._replace(ecc_uncorrectable=2)
    gpus[0] = gpus[0]._replace(temperature_c={"hotspot": 100.0, "mem": 40.0})
    ctx = ctx_for(tmp_path, inventory.HostInventory(tuple(gpus), {"amd-smi": "x"}, True, ()))
    e = host_checks.ecc(ctx)
    assert e.status == "fail" and e.value == {3: 2} and "amd-smi bad-pages" in e.message
    t = host_checks.temperature(ctx)
    assert t.status == "warn" and "GPU 0 hotspot 100 C >= slowdown 100 C" in t.message


@pytest.mark.parametrize("fixture, mono, status", [
    ("amd-smi_static_partition_text__mi300x-vf_x2-spx__rocm7.2.4__fleet-amd-task.txt", True, "pass"),
    ("amd-smi_static_partition_text__mi300x_x8-cpx-nps4__amdgpu-docs.txt", True, "warn"),
    ("amd-smi_static_partition_text__mi300x-cpx__amdgpu-docs-1512eb0__partial.txt", True, "warn"),
    ("amd-smi_static_partition_text__mi300x_x8-cpx-nps4__amdgpu-docs.txt", False, "pass"),
])
def test_a_split_gpu_drops_monokernel(tmp_path, fixture, mono, status):
    """The partition modes as parsed from recorded `amd-smi static --partition` output (SOURCES.md)."""
    inv = inventory_from_rocminfo_x8()._replace(partitions=partition.parse_partitions((HOST / fixture).read_text()))
    ctx = ctx_for(tmp_path, inv)
    if mono:  # the plan with the flag, as the resolver emits it for vLLM 0.33.0 (arg_utils.py:1842)
        ctx.plan = ctx.plan._replace(argv=(*ctx.plan.argv, "--monokernel"))
    out = host_checks.compute_partition(ctx)
    assert out.status == status, out.message
    if status == "warn":
        assert "CPX" in out.message and "starts the plan without it" in out.message
    assert host_checks.compute_partition(ctx_for(tmp_path, inventory_from_rocminfo_x8())).status == "not_applicable"


def test_no_amd_gpu_is_not_applicable_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    ctx = ctx_for(tmp_path, None)
    for check in (host_checks.gpus, host_checks.gpu_profile, host_checks.hbm, host_checks.ecc, host_checks.temperature,
                  host_checks.power, host_checks.devices, host_checks.numa_balancing, host_checks.memlock, host_checks.disk,
                  host_checks.compute_partition):
        out = check(ctx)
        assert out.status == "not_applicable", (check.__name__, out)
        assert out.message.startswith("no AMD GPU: amd-smi and rocminfo absent and no /dev/kfd")


def test_require_gpu_turns_no_gpu_into_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = host_checks.gpus(ctx_for(tmp_path, None, require_gpu=True))
    assert out.status == "fail" and "--require-gpu" in out.message


def _dev_tree(root, mode=0o660, group="video"):
    (root / "dev" / "dri").mkdir(parents=True)
    gid = grp.getgrnam(group).gr_gid
    for p in (root / "dev" / "kfd", root / "dev" / "dri" / "renderD128"):
        p.write_text("")
        os.chown(p, 0, gid)
        p.chmod(mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="sets device-node ownership (chown) in a temp tree; needs root")
def test_device_access_for_a_user_outside_video(tmp_path):
    _dev_tree(tmp_path)
    out = host_checks.devices(ctx_for(tmp_path, inventory_from_rocminfo_x8(), service_user="nobody"))
    assert out.status == "fail"
    assert "user nobody cannot open" in out.message and "usermod -aG video nobody" in out.message
    ok = host_checks.devices(ctx_for(tmp_path, inventory_from_rocminfo_x8(), service_user="root"))
    assert ok.status == "pass" and "1 render node" in ok.message


def test_unknown_service_user_is_a_usage_error(tmp_path):
    from rocm_dspark.errors import UsageError

    _dev_tree(tmp_path, group="root")
    with pytest.raises(UsageError, match="no such user"):
        host_checks.devices(ctx_for(tmp_path, inventory_from_rocminfo_x8(), service_user="no-such-user-xyz"))


@pytest.mark.parametrize("value,status", [("1", "warn"), ("0", "pass")])
def test_numa_balancing_read_from_proc(tmp_path, value, status):
    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "numa_balancing").write_text(value + "\n")
    out = host_checks.numa_balancing(ctx_for(tmp_path, inventory_from_rocminfo_x8()))
    assert out.status == status and out.value == value


def test_disk_counts_a_present_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = host_checks.disk(ctx_for(tmp_path, inventory_from_rocminfo_x8()))
    # 511 GB cannot fit on this test machine's disk, and nothing is present.
    assert out.status == "fail" and "needs 511 GB more" in out.message
    assert out.value["checkpoint_dir"].endswith("models--deepseek-ai--DeepSeek-V4.1-Flash")


@pytest.mark.parametrize("raw,clean", [("323", "323"), ("  **323**.", "323"), ("`323`\n", "323"), ("3 23", "3 23"),
                                       ("The answer is 323", "The answer is 323")])
def test_answer_normalisation(raw, clean):
    assert server_checks.normalise_answer(raw) == clean


def test_the_mono_decode_check_reads_the_launched_servers_log(tmp_path):
    """The log holds lines formatted from vLLM 0.33.0's own format strings (tests/test_mono_log.py)."""
    from types import SimpleNamespace

    from tests.helpers.mono_lines import GFX950_WHOLE, START, line

    ctx = ctx_for(tmp_path, inventory_from_rocminfo_x8())
    assert server_checks.mono_decode(ctx).status == "not_applicable"          # no --monokernel, no server
    ctx.plan = ctx.plan._replace(argv=(*ctx.plan.argv, "--monokernel"))
    out = server_checks.mono_decode(ctx)
    assert out.status == "not_applicable" and "--endpoint" in out.message
    log = tmp_path / "server.log"
    ctx.launched = SimpleNamespace(log_path=log)
    for lines, status, says in [
        (GFX950_WHOLE, "pass", "whole layer, active (decode steps of <= 48 rows)"),
        (GFX950_WHOLE[:5], "warn", "whole layer, not active yet"),
        ([START, line(427, "sequence-parallel layer")], "warn", "off: sequence-parallel layer"),
        ([START, "INFO ready"], "warn", "no 'DSv4.1 mono decode' line"),
    ]:
        log.write_text("\n".join(lines) + "\n")
        out = server_checks.mono_decode(ctx)
        assert out.status == status and says in out.message, (lines, out)
