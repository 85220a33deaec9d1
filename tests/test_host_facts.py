"""Host facts (rocm_dspark.runtime.gpus and .inventory) against real recorded outputs of AMD hosts (tests/fixtures/host, sources in
SOURCES.md) and the amd-smi JSON fixtures built from the amd-smi documentation's published examples
(tests/fixtures/host/amdsmi_json/README.md). Where two recordings come from one host, they are checked
against each other (independent tools agreeing), not only against numbers typed here."""

from __future__ import annotations


import pytest

from rocm_dspark.runtime import gpus, inventory, partition
from tests.conftest import FIXTURES

HOST = FIXTURES / "host"
JSON = HOST / "amdsmi_json"


def text(name: str) -> str:
    return (HOST / name).read_text()


@pytest.mark.parametrize("name,count", [
    ("rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt", 8),
    ("rocminfo_text__mi300x_x4__driver6.7.0__thamada-nvidia-smi.txt", 4),
    ("rocminfo_text__mi300x-vf__rocm7.2.4__msp-amd-droplet.txt", 1),   # a VM guest, ANSI colour on line 1
])
def test_rocminfo_hbm_per_bare_metal_mi300x(name, count):
    facts = inventory.rocminfo_facts(text(name))
    sizes = [f["vram_mb"] for f in facts]
    assert len(sizes) == len(gpus.parse_rocminfo(text(name))) == count
    # 192 GB parts: ~192 GiB visible to HSA.
    assert all(190 * 1024 < s < 193 * 1024 for s in sizes)


def test_rocm_smi_showall_of_a_four_gpu_host():
    showall = inventory.parse_rocm_smi_showall(text("rocm-smi_showall_text__mi300x_x4__driver6.7.0__thamada-nvidia-smi.txt"))
    assert [s["index"] for s in showall] == [0, 1, 2, 3]
    for s in showall:
        assert s["power_cap_w"] == 750.0 and 100 < s["power_w"] < 200
        assert s["marketing_name"] == "AMD Instinct MI300X OAM" and "mem" in s["temperature_c"]
        assert 20 < s["temperature_c"]["hotspot"] < 100


@pytest.mark.parametrize("name,market,arch", [
    ("amd-smi_static_text__mi350x__amdgpu6.18.3__rocm-systems-pr2987__partial.txt", "AMD Instinct MI350X", "gfx950"),
    ("amd-smi_static_text__mi325x-vf__rocm-unknown__device-metrics-exporter__partial.txt", "AMD Instinct Mi325X VF", "gfx942"),
])
def test_amdsmi_static_text_tree(name, market, arch):
    facts = inventory.parse_amdsmi_facts(text(name), "amd-smi static")
    assert [(f["marketing_name"], f["arch"]) for f in facts] == [(market, arch)]


def test_amdsmi_version_lines():
    vm = inventory.parse_amdsmi_version(text("amd-smi_version_text__mi300x-vm__rocm6.4.1__amdsmi-issue91.txt"))
    assert vm == {"tool": "25.4.2+aca1101", "library": "25.4.0", "rocm": "6.4.1", "amdgpu": "6.12.12"}
    k8s = inventory.parse_amdsmi_version(text("amd-smi_version_text__mi300x__rocm6.4.0__k8s-device-plugin-issue157.txt"))
    assert k8s["rocm"] == "6.4.0" and "amd_hsmp" not in k8s


def test_amdsmi_static_json_both_shapes_give_the_same_facts():
    listed = inventory.parse_amdsmi_facts((JSON / "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example.json").read_text())
    wrapped = inventory.parse_amdsmi_facts(
        (JSON / "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example__gpu_data.json").read_text())
    assert listed == wrapped
    f = listed[0]
    # The documentation's example values: MI300A, gfx942, 96432 MB, 550 W, slowdown hotspot 100 C, vram 105 C.
    assert (f["marketing_name"], f["arch"], f["vram_mb"], f["power_cap_w"]) == ("AMD Instinct MI300A", "gfx942", 96432, 550)
    assert f["temperature_limits_c"] == {"slowdown_hotspot": 100, "slowdown_vram": 105,
                                         "shutdown_hotspot": 110, "shutdown_vram": 115}
    # The existing detection parser reads the same files.
    for name in ("static_asic_limit_driver_vram__mi300a__amdsmi-docs-example.json",
                 "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example__gpu_data.json"):
        assert gpus.parse_amdsmi_static_json((JSON / name).read_text())[0].arch == "gfx942"


def test_amdsmi_metric_json_matches_the_published_monitor_table():
    facts = inventory.parse_amdsmi_facts((JSON / "metric_ecc_temperature_power__x8__amdsmi-docs-examples.json").read_text())
    # amd-smi monitor -ptumv example: POWER and GPU_TEMP/MEM_TEMP per GPU.
    table = [(171, 32, 33), (175, 33, 34), (177, 31, 33), (172, 33, 32), (178, 32, 32), (176, 33, 35), (176, 32, 32), (175, 34, 32)]
    assert [(f["power_w"], f["temperature_c"]["hotspot"], f["temperature_c"]["mem"]) for f in facts] == table
    assert all("edge" not in f["temperature_c"] for f in facts)          # "N/A" is no reading
    assert {(f["ecc_correctable"], f["ecc_uncorrectable"], f["ecc_deferred"]) for f in facts} == {(0, 0, 0)}
    power = inventory.parse_amdsmi_facts((JSON / "metric_power__amdsmi-changelog-units-example.json").read_text())
    assert power == [{"index": 0, "power_w": 10.0, "source": "amd-smi --json"}]


def test_merge_prefers_the_first_source_and_keeps_the_rest():
    static = inventory.parse_amdsmi_facts((JSON / "static_asic_limit_driver_vram__mi300a__amdsmi-docs-example.json").read_text())
    metric = inventory.parse_amdsmi_facts((JSON / "metric_ecc_temperature_power__x8__amdsmi-docs-examples.json").read_text())
    merged = inventory.merge_facts(static, metric)
    assert len(merged) == 8
    assert merged[0].vram_mb == 96432            # static's VRAM size wins over metric's total_vram
    assert merged[0].power_w == 171 and merged[0].power_cap_w == 550
    assert merged[1].vram_mb == 196300 and merged[1].marketing_name == ""


@pytest.mark.parametrize("bad", ["", "not json", "[1, 2", '"a string"'])
def test_bad_amdsmi_json_raises_value_error(bad):
    with pytest.raises(ValueError):
        gpus.amdsmi_json_entries(bad)


# `amd-smi static --partition` as recorded (tests/fixtures/host/SOURCES.md): SPX on an MI300X VM, CPX on an 8 x MI300X
# node (the older COMPUTE_PARTITION key) and CPX where only each GPU's first partition names its mode.
SPX = "amd-smi_static_partition_text__mi300x-vf_x2-spx__rocm7.2.4__fleet-amd-task.txt"
CPX = "amd-smi_static_partition_text__mi300x_x8-cpx-nps4__amdgpu-docs.txt"
CPX_NA = "amd-smi_static_partition_text__mi300x-cpx__amdgpu-docs-1512eb0__partial.txt"


@pytest.mark.parametrize("name, modes", [(SPX, {0: "SPX", 1: "SPX"}), (CPX, {i: "CPX" for i in range(64)}),
                                         (CPX_NA, {0: "CPX", 8: "CPX"})])
def test_the_compute_partition_is_read_from_recorded_amdsmi_output(name, modes):
    assert partition.parse_partitions((HOST / name).read_text()) == modes


def test_an_amdsmi_without_partition_output_leaves_the_mode_unknown():
    # the JSON of another amd-smi command, and amd-smi's usage error, name no partition
    assert partition.parse_partitions((JSON / "metric_power__amdsmi-changelog-units-example.json").read_text()) == {}
    assert partition.parse_partitions("usage: amd-smi static [-h] ...\n") == {}


def _instrument(bindir, name, script):
    """A stand-in for an AMD tool on PATH: prints a recorded/documented output (an instrument, not a GPU)."""
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_inventory_runs_amdsmi_json_then_rocminfo(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _instrument(bindir, "amd-smi", f'case "$1 $2" in "static --partition") /bin/cat {HOST}/{SPX};;'
                                   f' static*) /bin/cat {JSON}/static_asic_limit_driver_vram__mi300a__amdsmi-docs-example__gpu_data.json;;'
                                   f' metric*) /bin/cat {JSON}/metric_power__amdsmi-changelog-units-example.json;; *) exit 2;; esac\n')
    monkeypatch.setenv("PATH", str(bindir))
    inv = inventory.inventory(str(tmp_path))
    assert [g.marketing_name for g in inv.gpus] == ["AMD Instinct MI300A"]
    assert inv.gpus[0].power_w == 10 and inv.gpus[0].vram_mb == 96432
    assert inv.commands == ("amd-smi static --asic --vram --limit --json", "amd-smi metric --ecc --temperature --power --json",
                            "amd-smi static --partition")
    assert inv.partitions == {0: "SPX", 1: "SPX"}
    assert inv.tools["rocminfo"] is None and not inv.kfd_present and inv.amd_host


def test_inventory_falls_back_to_rocminfo(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _instrument(bindir, "rocminfo", f"/bin/cat {HOST}/rocminfo_text__mi300x_x8__rocm6.2.3__rocm-issue4021.txt\n")
    monkeypatch.setenv("PATH", str(bindir))
    inv = inventory.inventory(str(tmp_path))
    assert len(inv.gpus) == 8 and {g.arch for g in inv.gpus} == {"gfx942"}
    assert {g.marketing_name for g in inv.gpus} == {"AMD Instinct MI300X"}


def test_host_without_amd_gpu_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no amd-smi, no rocminfo
    inv = inventory.inventory(str(tmp_path))         # and no <root>/dev/kfd
    assert inv.gpus == () and not inv.amd_host
    assert inv.no_gpu_reason() == "no AMD GPU: amd-smi and rocminfo absent and no /dev/kfd"
    assert gpus.detect_gpus() == []


def test_a_failing_tool_is_a_problem_not_a_crash(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _instrument(bindir, "amd-smi", "/bin/echo 'not json at all'\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kfd").write_text("")
    monkeypatch.setenv("PATH", str(bindir))
    inv = inventory.inventory(str(tmp_path))
    assert inv.gpus == () and inv.kfd_present and inv.amd_host
    assert any("reported no GPU" in p for p in inv.problems)
    assert "report no GPU" in inv.no_gpu_reason()
