"""Kubernetes' --monokernel fallback (rocm_dspark/launch/k8s.py _mono_sh), run through the real POSIX sh
(/bin/sh, dash here) with a stand-in `vllm` on PATH that exits with vLLM 0.33.0's own refusal line
(`raise ValueError(f"--monokernel {why}.")`, mono_decode.py:384, coloured as vLLM's ERROR log prints it): the pod
starts the same argv again without the flag and says why in one line, as the bash launcher does. The stand-in is
there because no MI300-class GPU is here (not yet run on such hardware)."""

from __future__ import annotations

import os
import select
import signal
import subprocess

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.resolve import Selection, resolve
from rocm_dspark.recipe.strategies import ClusterSpec
from tests.helpers.k8s_cluster import k8s_manifests

CAT = load_catalog()
WHY = "--monokernel needs 256 compute units, the GPU has 38."


def _script(concurrency: int | None) -> str:
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", concurrency=concurrency))
    ms = k8s_manifests(plan, ClusterSpec(strategy="single_node", nodes=1), CAT.find_model("V4.1-Flash").query_heads)
    (dep,) = [m for m in ms if m["kind"] == "Deployment"]
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["/bin/sh", "-c"]
    return cmd[2].replace("$$", "$")  # what Kubernetes hands the pod


def _stand_in(tmp_path, body: str):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "vllm").write_text("#!/bin/sh\n" + body)
    (bin_ / "vllm").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


REFUSES = ("for a in \"$@\"; do [ \"$a\" = --monokernel ] && { echo 'INFO loading'; "
           f"printf '(Worker_TP0 pid=7) ERROR \\033[31mValueError: {WHY}\\033[0m\\n' >&2; exit 1; }}; done\n"
           "echo \"serving: $*\"\n")


def test_a_refused_monokernel_starts_the_same_plan_without_it(tmp_path):
    script = _script(4)
    assert "--monokernel" in script
    out = subprocess.run(["/bin/sh", "-c", script], env=_stand_in(tmp_path, REFUSES), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("rocm-dspark:")]
    assert said == [f"rocm-dspark: starting the same plan without --monokernel: vLLM refused it ({WHY})"]
    assert "INFO loading" in out.stdout and WHY in out.stdout  # the first start's log reaches the pod's log
    (served,) = [ln for ln in out.stdout.splitlines() if ln.startswith("serving:")]
    assert "--monokernel" not in served and "--kv-cache-dtype fp8_ds_mla" in served


def test_another_failure_is_not_retried_and_keeps_its_status(tmp_path):
    out = subprocess.run(["/bin/sh", "-c", _script(4)], env=_stand_in(tmp_path, "echo 'out of memory' >&2; exit 3\n"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "rocm-dspark:" not in out.stderr and "out of memory" in out.stdout


def test_a_stop_is_passed_on_and_never_restarts_without_the_flag(tmp_path):
    env = _stand_in(tmp_path, "trap 'echo got-term; exit 143' TERM\necho up\nwhile :; do sleep 0.1; done\n")
    proc = subprocess.Popen(["/bin/sh", "-c", _script(4)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # The stand-in's "up" on the pod's log: it runs, so the script's TERM trap (set as it started it) is in place.
    assert select.select([proc.stdout], [], [], 30)[0] and proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "got-term" in stdout and "rocm-dspark:" not in stderr


def test_a_plan_without_mono_runs_vllm_directly():
    script = _script(64)  # 64 x 6 rows > 48: mono off
    assert "--monokernel" not in script and script.startswith("exec vllm serve")


def test_the_fallback_script_passes_shellcheck_as_posix_sh(tmp_path):
    from tests.helpers.launcher_rig import SHELLCHECK

    path = tmp_path / "pod.sh"
    path.write_text(_script(4) + "\n")
    res = subprocess.run([SHELLCHECK, "-S", "style", "-s", "sh", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_group_with_a_forced_monokernel_says_in_one_note_why_it_keeps_it(tmp_path):
    """Groups never get the flag from `recipe` (recipe/mono.py); forced with --vllm-arg, the launchers and the
    LeaderWorkerSet keep it and say why, once."""
    import json

    from click.testing import CliRunner

    from rocm_dspark.cli import cli
    from rocm_dspark.launch.launch_facts import GROUP_MONO

    base = ["launch", "--model", "V4.1-Flash", "--gpu", "mi355x", "--strategy", "multi_node_tp_pp", "--nodes", "2",
            "--head-address", "10.0.0.1", "--vllm-arg", "--monokernel", "--json"]
    for d in ("sh", "k8s", "plain"):
        (tmp_path / d).mkdir()
    r = CliRunner().invoke(cli, [*base, "--output", str(tmp_path / "sh")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["next"].count(GROUP_MONO) == 1
    for sh in (tmp_path / "sh").glob("*.sh"):
        assert "drop_monokernel" not in sh.read_text()
    r = CliRunner().invoke(cli, [*base, "--output", str(tmp_path / "k8s"), "--format", "k8s"])
    assert r.exit_code == 0, r.output
    import yaml

    text = (tmp_path / "k8s" / "rocm-dspark-deepseek-v4-1-flash-mi355x.k8s.yaml").read_text()
    (lws,) = [m for m in yaml.safe_load_all(text) if m and m["kind"] == "LeaderWorkerSet"]
    assert lws["metadata"]["annotations"]["rocm-dspark/monokernel"] == GROUP_MONO
    r = CliRunner().invoke(cli, [*base[:-3], "--json", "--output", str(tmp_path / "plain")])
    assert r.exit_code == 0 and GROUP_MONO not in r.output
