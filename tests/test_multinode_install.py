"""The install commands `launch --format systemd` prints, run for real in a throwaway root, and the one rule for
--head-address on every path.

The throwaway root is a directory with a minimal /etc (root, and the video and render groups a ROCm node has)
and a copy of this host's systemd units (sysinit.target and the others a service needs). The printed commands
take the root as a parameter (rocm_dspark.launch.launchers.install_commands `root`); the test checks that they
are the printed ones with the root put in front of each installed path, runs them (as root, `sudo` dropped as
`up` drops it), and then checks what a node would have: the unit's EnvironmentFile= and ExecStart= exist,
root-owned, and `systemd-analyze verify --root` passes on the installed unit.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.launch.launchers import install_commands, write_launchers
from tests.conftest import CLI, cli_env
from tests.test_launchers_run import make_plan

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_root_tools = pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEMD_ANALYZE is None or shutil.which("useradd") is None,
    reason="needs root, useradd and systemd-analyze (install -o root and useradd --prefix)")


def throwaway_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:105:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\nvideo:*::\nrender:*::\n")
    for p in ("etc/shadow", "etc/gshadow"):
        (root / p).chmod(0o600)
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


def run_as_root(commands, cwd: Path) -> None:
    for c in commands:
        assert c.startswith("sudo "), c
        r = subprocess.run(["bash", "-c", c[len("sudo "):]], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{c}\n{r.stdout}{r.stderr}"


def unit_value(text: str, key: str) -> str:
    return re.search(rf"^{key}=(.*)$", text, re.M).group(1).strip('"')


def check_installed(root: Path, unit_name: str, user: str) -> None:
    unit = root / "etc/systemd/system" / unit_name
    text = unit.read_text()
    env_file = unit_value(text, "EnvironmentFile")
    assert not env_file.startswith("-") and env_file.startswith("/etc/rocm-dspark/"), env_file
    for path, mode in ((env_file, 0o600), (unit_value(text, "ExecStart"), 0o755)):
        st = (root / path.lstrip("/")).stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
    assert (root / "etc/systemd/system/multi-user.target.wants" / unit_name).is_symlink()
    assert re.search(rf"^{user}:x:\d+:", (root / "etc/passwd").read_text(), re.M)
    assert re.search(rf"^render:x:105:.*\b{user}\b", (root / "etc/group").read_text(), re.M)
    r = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", f"--root={root}", f"/etc/systemd/system/{unit_name}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def rooted(printed, root: Path):
    """The printed commands with `root` in front of every installed path (what install_commands(root=) gives)."""
    out = []
    for c in printed:
        for d in ("/usr/local/libexec/", "/etc/rocm-dspark/", "/etc/systemd/system/"):
            c = c.replace(f" {d}", f" {root}{d}")
        out.append(c)
    return out


@needs_root_tools
def test_single_node_install_commands_make_a_unit_that_verifies(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    files = write_launchers(make_plan(8000), out, "systemd", user="svc", name="demo")
    root = throwaway_root(tmp_path)
    cmds = install_commands(files, "svc", root=str(root))
    printed = files.install_commands
    assert rooted(printed[1:4], root) == list(cmds[1:4])  # the copies: the printed ones, rooted
    assert printed[4:] == ("sudo systemctl daemon-reload", "sudo systemctl enable --now --no-block demo.service",
                           "journalctl -fu demo.service")
    run_as_root(cmds, tmp_path)
    check_installed(root, "demo.service", "svc")
    # A token put in the node's file survives a second install.
    node_env = root / "etc/rocm-dspark/demo.env"
    node_env.write_text("HF_TOKEN=hf_on_the_node\n")
    run_as_root(cmds, tmp_path)
    assert node_env.read_text() == "HF_TOKEN=hf_on_the_node\n"


@needs_root_tools
def test_each_node_installs_from_its_own_copied_files(tmp_path):
    gen = tmp_path / "generated"
    gen.mkdir()
    proc = subprocess.run([*CLI, "launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--format", "systemd",
                           "--strategy", "multi_node_tp_dp", "--nodes", "2", "--head-address", "10.0.0.1",
                           "--node-addresses", "10.0.0.1,10.0.0.2", "--iface", "eth1", "--output", str(gen),
                           "--name", "grp"], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "node 1 (10.0.0.2), worker: in the directory holding its files, run:" in proc.stdout
    printed = [ln.strip() for ln in proc.stdout.splitlines() if ln.startswith("  ")]
    for node, role in ((0, "head"), (1, "worker")):
        stem = f"grp-node{node}-{role}"
        # "the node": its own directory with only its three files, and its own root.
        here = tmp_path / f"node{node}"
        here.mkdir()
        for ext in ("sh", "service", "env"):
            shutil.copy2(gen / f"{stem}.{ext}", here / f"{stem}.{ext}")
        mine = [c for c in printed if stem in c and "systemctl" not in c and "journalctl" not in c]
        assert len(mine) == 3, mine
        root = throwaway_root(here)
        cmds = [printed[0].replace("id -u vllm >/dev/null 2>&1 || useradd",
                                   f"grep -q '^vllm:' {root}/etc/passwd || useradd --prefix {root}"),
                *rooted(mine, root), f"sudo systemctl --root={root} enable {stem}.service"]
        run_as_root(cmds, here)
        check_installed(root, f"{stem}.service", "vllm")
        text = (root / f"etc/systemd/system/{stem}.service").read_text()
        assert str(gen) not in text and str(gen) not in (root / f"usr/local/libexec/rocm-dspark/{stem}.sh").read_text()


@pytest.mark.parametrize("address", ["head node", "fe80::1%$(touch x)", "http://10.0.0.1:8000"])
def test_head_address_has_one_rule_on_every_path(tmp_path, address):
    common = ["--model", "V4.1-Flash", "--gpu", "mi355x", "--nodes", "2", "--head-address", address]
    paths = {
        "legacy recipe": ["recipe", *common, "--dp", "4", "--tp", "4"],
        "legacy launch": ["launch", *common, "--dp", "4", "--tp", "4", "--output", str(tmp_path)],
        "strategy recipe": ["recipe", *common, "--strategy", "multi_node_dep"],
        "strategy launch": ["launch", *common, "--strategy", "multi_node_tp_dp", "--output", str(tmp_path)],
    }
    lines = set()
    for argv in paths.values():
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, env=cli_env(), timeout=120, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"rocm-dspark: error: --head-address {address!r}"), err
        lines.add(err[0])
    assert len(lines) == 1, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even ./x
