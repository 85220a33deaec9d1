"""`up` in the container modes: run `rocm-dspark probe` inside the pulled image, so one `up` can prove adaptive
verification where vLLM only exists in the image.

The probe must run on the software that will serve (the trust model: only records written there count), so:
1. A wheel of the running toolkit is built from its own source tree with `pip wheel --no-deps --no-index
   --no-build-isolation` (no registry is asked; rocm-dspark is not on PyPI) into `<state>/up/wheel/`.
2. The image runs, with the launcher's GPU flags (launch_facts.DOCKER_RUN_FLAGS), the state directory
   bind-mounted at the same path and the wheel directory read-only:
   `pip install --no-deps --no-index --target /tmp/rocm-dspark-toolkit <wheel>`, then
   `python3 -m rocm_dspark probe <the same selection flags> --state-dir <same> --levels <levels>`. With the wheel on
   PYTHONPATH, the vLLM that the live level starts there loads the plugin through its entry point.
3. `up` then reads the records back with the gate, on the image's software (choice.image_software).
Only the levels that load no model run here, before the first start (a build whose classes refuse adaptive
verification costs no load); the live level runs on `up`'s own adaptive start (up/prove.py).
"""

from __future__ import annotations

import collections
import os
import shlex
import subprocess
import sys
from pathlib import Path

from rocm_dspark.up import choice
from rocm_dspark.up.container import TARGET, WHEEL_MOUNT  # noqa: F401 - re-exported
from rocm_dspark.up.prove import judged
from rocm_dspark.up.serve import probe_cache
from rocm_dspark.up.steps_common import StepFailed


def toolkit_source() -> Path | None:
    """The source tree of the running toolkit (its pyproject.toml names rocm-dspark), or None."""
    import rocm_dspark

    root = Path(rocm_dspark.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        return None
    return root if 'name = "rocm-dspark"' in text else None


def build_wheel(out_dir: Path, *, python: str = sys.executable, timeout_s: float = 600.0) -> Path:
    """Build this toolkit's wheel into out_dir (cleared first); RuntimeError with one line on failure."""
    src = toolkit_source()
    if src is None:
        raise RuntimeError(
            "the running rocm-dspark has no source tree beside it (installed from a wheel?), so no "
            "wheel can be built for the image; install it with `pip install -e <checkout>`"
        )
    import shutil
    import tempfile

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="rocm-dspark-wheel-src-") as tmp:
        # setuptools writes build/ and *.egg-info beside the sources: build from a copy (symlinks such as
        # rocm_dspark/recipes copied as the files they point to), never in the checkout.
        copy = Path(tmp) / "src"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(src / name, copy / name)
        shutil.copytree(
            src / "rocm_dspark",
            copy / "rocm_dspark",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
        )
        argv = [
            python,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out_dir),
            str(copy),
        ]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=tmp,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    wheels = sorted(out_dir.glob("rocm_dspark-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`pip wheel --no-deps {src}` failed (exit {proc.returncode}): {last}")
    return wheels[0]


def probe_command(
    tool: str,
    image: str,
    wheel: Path,
    state_dir: Path,
    flags: list[str],
    levels: tuple[str, ...],
    *,
    hf_cache: str | None = None,
    run_flags: tuple[str, ...] | None = None,
    compile_cache_dir: str | None = None,
    model_path: str | None = None,
) -> list[str]:
    """The `docker run` argv of the in-image probe (see the module docstring); run_flags: the CPU image's
    (rocm_dspark.up.container) instead of the GPU flags; model_path: the selection's --model-path (typed, never
    read back out of `flags`)."""
    from rocm_dspark.launch.launch_facts import DOCKER_RUN_FLAGS, PASSED_ENV, hf_cache_mounts, hf_home, hf_hub_cache

    state = str(Path(state_dir).absolute())
    probe = ["python3", "-m", "rocm_dspark", "probe", *flags, "--state-dir", state, "--levels", ",".join(levels)]
    script = "; ".join(
        [
            "set -e",
            f"python3 -m pip install -q --no-deps --no-index --target {TARGET} {WHEEL_MOUNT}/{shlex.quote(wheel.name)} "
            "|| { echo 'pip in the image could not install the rocm-dspark wheel (the line above says why)' >&2; exit 4; }",
            f"export PYTHONPATH={TARGET}${{PYTHONPATH:+:$PYTHONPATH}}",
            "python3 -c 'import click, yaml' || { echo 'the image lacks click or pyyaml, which rocm-dspark needs' >&2; "
            "exit 3; }",
            shlex.join(probe),
        ]
    )
    argv = [
        tool,
        "run",
        *(DOCKER_RUN_FLAGS if run_flags is None else run_flags),
        "-v",
        f"{state}:{state}",
        "-v",
        f"{wheel.parent}:{WHEEL_MOUNT}:ro",
        *hf_cache_mounts(hf_cache or hf_home(), hf_hub_cache() if hf_cache is None else f"{hf_cache}/hub"),
    ]
    # The fingerprint names the host by machine-id (probe/fingerprint.host_id): the record written in the
    # container must name this host, or it never counts here.
    if os.path.isfile("/etc/machine-id"):
        argv += ["-v", "/etc/machine-id:/etc/machine-id:ro"]
    if model_path:  # a local checkpoint: mounted read-only at the same path, as the launcher does
        argv += ["-v", f"{model_path}:{model_path}:ro"]
    if compile_cache_dir:  # the served container's key directory: the probe's kernels are kept for the start
        from rocm_dspark.launch.compile_cache import docker_args

        argv += docker_args(compile_cache_dir)
    for name in PASSED_ENV:
        argv += ["-e", name]
    return argv + ["--entrypoint", "bash", image, "-c", script]


def run_probe_in_image(
    tool: str,
    image: str,
    wheel: Path,
    state_dir: Path,
    flags: list[str],
    levels: tuple[str, ...],
    *,
    say=lambda line: None,
    timeout_s: float = 7200.0,
    run_flags: tuple[str, ...] | None = None,
    compile_cache_dir: str | None = None,
    model_path: str | None = None,
) -> dict:
    """Run the in-image probe; its output lines go to `say`. Returns {argv, exit_code, last (its last non-empty
    line), tail (its last lines)}."""
    argv = probe_command(
        tool,
        image,
        wheel,
        state_dir,
        flags,
        levels,
        run_flags=run_flags,
        compile_cache_dir=compile_cache_dir,
        model_path=model_path,
    )
    say(
        f"  [in image] {shlex.join(argv[:2])} ... --entrypoint bash {image} -c '<pip install --no-deps the wheel; "
        f"rocm-dspark probe --levels {','.join(levels)}>'"
    )
    tail: collections.deque = collections.deque(maxlen=20)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            for line in proc.stdout:
                say(f"  [in image] {line.rstrip()}")
                if line.strip():
                    tail.append(line.rstrip())
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
    return {"argv": argv, "exit_code": code, "last": " ".join(tail[-1].split()) if tail else "", "tail": list(tail)}


# -- the `up` probe step's container-mode path --------------------------------------------------------------


WHEEL_FIX = (
    "install rocm-dspark from a source checkout (`pip install -e .`), or run `rocm-dspark probe` inside the "
    "image yourself (docs/adaptive-verification.md)"
)


def node_skip_reason(run) -> str | None:
    """The node target's answer: container modes with an adaptive command still to prove."""
    from rocm_dspark.images import pull

    if run.mode == "foreground":
        return "vLLM runs on this host in the foreground mode"
    if run.plan.adaptive_verification:
        return "the plan already runs adaptive verification"
    if not run.plan.adaptive_argv:
        return "the plan has no adaptive command to prove"
    if run.options.selection.get("adaptive") == "off":
        return "--adaptive off"
    if pull.runtime() is None:
        return "no docker or podman to run the image"
    proof = judged(run).proof
    if proof.adaptive_proven:
        return f"a record already proves adaptive verification here ({proof.reason})"
    return None


def selection_args(run, levels: tuple[str, ...]) -> list[str]:
    """The selection as probe flags (the state dir is passed on its own), and what the target adds."""
    return choice.selection_argv(run, ("state_dir",)) + run.target.inimage_probe_args(run, levels)


def probe_step(run) -> dict:
    """Run the levels that load no model (static, kernel) inside the image, before the first start, and read the
    records back with the gate. RuntimeError (one line; fix: WHEEL_FIX) when no wheel can be built."""
    from rocm_dspark.images import pull
    from rocm_dspark.probe import store

    tool = pull.runtime()
    image = (run.outputs.get("image") or {}).get("pinned") or run.plan.image
    levels = tuple(run.options.probe_levels)
    wheel = build_wheel(run.dir / "wheel")
    run.display.say(f"  built {wheel.name} (pip wheel --no-deps, no registry) for the image")
    directory = store.records_dir(run.options.state_dir)
    before = set(store.record_names(directory))
    res = run_probe_in_image(
        tool,
        image,
        wheel,
        run.options.state_dir,
        selection_args(run, levels),
        levels,
        say=run.display.say,
        run_flags=run.target.inimage_run_flags(run),
        compile_cache_dir=probe_cache(run, image),
        model_path=run.options.selection.get("model_path"),
    )
    new = sorted(set(store.record_names(directory)) - before)
    if res["exit_code"] not in (
        0,
        1,
    ):  # 1: a level failed (its record says why); 2: a usage error, 3: no click, 4: no pip
        raise StepFailed(
            f"the probe inside {image} exited {res['exit_code']}: {res['last'] or 'no output'}",
            "fix what its last line says, then rerun `rocm-dspark up`",
            log_tail="\n".join(res["tail"]),
        )
    run.chosen = None  # the image is pulled and records written: the gate reads them on its software
    verdict = judged(run).verdict
    out = {
        "in_image": {
            "image": image,
            "wheel": str(wheel),
            "exit_code": res["exit_code"],
            "levels": list(levels),
            "argv": res["argv"],
            "new_records": new,
        },
        "gate": verdict.outcome,
        "gate_reason": verdict.reason,
    }
    run.display.say(
        f"  the probe inside the image exited {res['exit_code']} and wrote {len(new)} record(s); gate: {verdict.reason}"
    )
    return out


def probe_actions(run) -> list:
    """What the container-mode probe step runs."""
    from rocm_dspark.images import pull
    from rocm_dspark.runtime.actions import Run, Say

    tool = pull.runtime() or "docker"
    image = run.plan.image
    levels = tuple(run.options.probe_levels)
    wheel = run.dir / "wheel" / "rocm_dspark-<version>-py3-none-any.whl"
    src = toolkit_source() or "<the toolkit's source tree>"
    return [
        Run(
            (
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-index",
                "--no-build-isolation",
                "-w",
                str(run.dir / "wheel"),
                str(src),
            )
        ),
        Run(
            tuple(
                probe_command(
                    tool,
                    image,
                    wheel,
                    run.options.state_dir,
                    selection_args(run, levels),
                    levels,
                    run_flags=run.target.inimage_run_flags(run),
                    compile_cache_dir=probe_cache(run, image, check=False),
                    model_path=run.options.selection.get("model_path"),
                )
            )
        ),
        Say("reads the records back with the gate (no model load: the live level runs on the adaptive start, step 8)"),
    ]
