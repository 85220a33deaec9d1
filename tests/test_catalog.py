"""recipes/ loads, validates, and a broken file fails with one line naming file, key and problem."""

import shutil

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.recipe import catalog
from rocm_dspark.recipe.catalog import CatalogError, load_catalog, version_in_range
from tests.conftest import cli_env
from tests.helpers import run_cli
from tests.helpers.recipes import _break


def test_catalog_has_the_models_and_gpus_the_brief_names():
    cat = load_catalog()
    v41 = cat.find_model("V4.1-Flash")
    assert v41 is cat.find_model("deepseek-ai/DeepSeek-V4.1-Flash")
    assert v41.block_size == 5 and v41.query_heads == 64 and v41.architecture["layers"] == 40
    assert v41.architecture["context_length"] == 1048576 and v41.weights_gb == 511
    assert v41.fallback == "DeepSeek-V4-Flash" and cat.find_model("V4-Flash").key == "DeepSeek-V4-Flash"
    assert {g: (cat.gpus[g].arch, cat.gpus[g].fp8_format, cat.gpus[g].native_fp4) for g in cat.gpus} == {
        "mi300x": ("gfx942", "fnuz", False), "mi325x": ("gfx942", "fnuz", False),
        "mi350x": ("gfx950", "ocp", True), "mi355x": ("gfx950", "ocp", True)}
    for model in cat.models.values():
        assert set(model.profiles) == set(cat.gpus)
        for p in model.profiles.values():
            assert p.status in ("verified", "experimental", "unverified") and p.evidence and p.status_date
            # Images come from builds: the profile shows its build's (digest where published, else the tag).
            b = cat.builds[p.vllm_build]
            assert p.image == b.image and (b.digest is None or p.image.endswith("@" + b.digest))


def test_unknown_model_and_gpu_list_the_known_ones():
    cat = load_catalog()
    with pytest.raises(UsageError, match=r"known models: DeepSeek-V4-Flash .*DeepSeek-V4.1-Flash \(V4.1-Flash"):
        cat.find_model("Llama-3")
    with pytest.raises(UsageError, match="known GPUs: mi300x, mi325x, mi350x, mi355x"):
        cat.find_gpu("h100")


@pytest.mark.parametrize("version,spec,expected", [
    ("0.32.0", ">=0.32.0,<0.33.0", True), ("0.32.9+rocm", "<0.33.0", True), ("0.33.0", "<0.33.0", False),
    ("0.33.0rc1", ">=0.33.0", True), ("0.30.0.dev", ">=0.30.0", True), ("0.29.1", ">=0.30.0", False),
])
def test_version_ranges(version, spec, expected):
    assert version_in_range(version, spec) is expected


def test_capability_table_by_version():
    cat = load_catalog()
    assert cat.vllm_capability("0.32.0").refuses_adaptive_on_rocm_v41
    assert not cat.vllm_capability("0.32.0").native_adaptive_on_rocm_v41
    assert cat.vllm_capability("0.33.0").native_adaptive_on_rocm_v41
    assert not cat.vllm_capability("0.29.0").supports_v41
    assert not hasattr(cat, "min_version_for_v41")  # loaded and never read: gone from recipes/vllm.yaml too
    assert cat.dynamic_k_change == "vllm#32374" and set(cat.channels) == {"release", "nightly", "nightly-rocm100"}


@pytest.mark.parametrize("rel,old,new,expect", [
    ("models/deepseek-v4.1-flash.yaml", "    tp: 8\n", "    tp: eight\n", "profiles.mi300x.tp: expected int, got 'eight'"),
    ("models/deepseek-v4.1-flash.yaml", "    status: experimental            # InferenceX day-zero arm, not vLLM-recipe verified\n    status_date: \"2026-09-21\"",
     "    status: great\n    status_date: \"2026-09-21\"", "profiles.mi300x.status: expected one of verified, experimental, unverified"),
    ("models/deepseek-v4.1-flash.yaml", "  - [--tokenizer-mode, deepseek_v41]", "  - [tokenizer-mode, deepseek_v41]", "base_args: item 1 must be"),
    ("models/deepseek-v4.1-flash.yaml", "  block_size: 5", "  block_size: 0", "speculative.block_size: expected a positive integer"),
    ("gpus.yaml", "    fp8_format: fnuz               # e4m3fnuz, max 224", "    fp8_format: e5m2", "gpus.mi300x.fp8_format: expected fnuz or ocp"),
    ("workarounds.yaml", "    reason: \"On gfx942 every worker", "    reasonx: \"On gfx942 every worker", "workarounds[1].reason: missing key"),
    ("vllm.yaml", "  - versions: \">=0.33.0\"", "  - versions: \"about 0.33\"", "capabilities[4].versions: bad version range"),
    ("models/deepseek-v4.1-flash.yaml", "    tp: 4\n    dp: 1\n", "    image: vllm/vllm-openai-rocm:nightly\n    tp: 4\n    dp: 1\n",
     "profiles.mi355x.image: the image and vLLM come from the build now"),
    ("vllm.yaml", "    digest: sha256:960228cf", "    digest: sha256:960228cX", "builds.nightly-eed1f3d0.digest: expected sha256:"),
    ("vllm.yaml", "    image: vllm/vllm-openai-rocm:v0.33.0", "    image: vllm/vllm-openai-rocm@sha256:" + "0" * 64,
     "builds.v0.33.0.image: expected repo:tag"),
    ("vllm.yaml", "      vllm#57491: {in: true, how: parser", "      vllm#57491: {in: maybe, how: parser",
     "`in` must be true, false or null"),
    ("vllm.yaml", "      vllm#56227: {in: true, how: note,", "      vllm#56227: {in: true, how: hearsay,",
     "expected one of ancestry, wheel, parser, note, got 'hearsay'"),
    ("vllm.yaml", "    needs: [vllm#57491]", "    needs: [vllm#99999]", "flags.--engram-config: unknown change 'vllm#99999'"),
    ("models/deepseek-v4.1-flash.yaml", "requires: [vllm#56214]", "requires: [vllm#1]", "requires: unknown change 'vllm#1'"),
])
def test_broken_recipe_names_file_key_and_problem(recipes_copy, rel, old, new, expect):
    path = _break(recipes_copy, rel, old, new)
    with pytest.raises(CatalogError) as exc:
        load_catalog(recipes_copy)
    message = str(exc.value)
    assert message.startswith(str(path)) and expect in message and "\n" not in message


def test_malformed_yaml_through_the_cli_is_one_line_exit_2(recipes_copy):
    path = _break(recipes_copy, "gpus.yaml", "  mi325x:\n", "  mi325x: [\n")
    proc = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x"], capture_output=True,
                          text=True, env=cli_env(ROCM_DSPARK_RECIPES=str(recipes_copy)))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "malformed YAML" in lines[0] and "line " in lines[0]
    assert "Traceback" not in proc.stderr


# --- loading (from test_catalog_load.py) ----------------------------------------------------------

# catalog.load_yaml, the one strict reader of recipes/ files: no parsed snapshot stands in for a file, so an
# edited recipe is read as edited, with its errors.


def test_no_parsed_snapshot_ships():
    # The snapshot bought 1.30x against 1.33x start-up (README); the budget is now 1.5x (benchmarks/recipe_latency.py).
    assert not (catalog.Path(catalog.__file__).parent / "recipes_parsed.json").exists()
    assert not hasattr(catalog, "PARSED")


def _standard_load(text: str):
    """The strict loader with PyYAML's own SafeConstructor building the objects (what catalog._plain replaces)."""
    import yaml

    class Standard(catalog._strict_loader()):
        def construct_document(self, node):
            return yaml.constructor.BaseConstructor.construct_document(self, node)

    return yaml.load(text, Loader=Standard)


def _shared(obj) -> list:
    """Where one collection object appears twice (an alias): (later path, first path)."""
    first, out = {}, []

    def walk(x, path):
        if isinstance(x, (dict, list)):
            if id(x) in first:
                out.append((path, first[id(x)]))
                return
            first[id(x)] = path
            for k, v in (x.items() if isinstance(x, dict) else enumerate(x)):
                walk(v, (*path, k))
    walk(obj, ())
    return out


def _outcome(load, text):
    try:
        return "ok", repr(load(text))
    except Exception as exc:  # the same error, message and line, is part of the contract
        return "error", type(exc).__name__, str(exc)


@pytest.mark.parametrize("path", sorted(catalog.recipes_dir().rglob("*.yaml")), ids=lambda p: p.name)
def test_recipe_yaml_builds_the_objects_pyyaml_builds(path):
    text = path.read_text()
    fast, standard = catalog.load_yaml(path), _standard_load(text)
    assert repr(fast) == repr(standard) and _shared(fast) == _shared(standard)


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n", "{a: 1, 'a': 2}\n", "1: a\n'1': b\n", "<<: {x: 1}\ny: 2\n", "a: &x {b: 1}\nc: *x\n",
    "a: &r [1, *r]\n", "a: &m {b: *m}\n", "a: !!str {b: 1}\n", "!!map [1]\n", "a: 2026-01-01\n", "? [1]\n: 2\n",
    "? 2026-01-01\n: x\n", "=: 1\n", "a: !foo 1\n", "'<<': 1\n", "a: .inf\nb: yes\nc: ~\nd: 0x1F\ne: 1_000\n", "",
    "- &s x\n- *s\n", "a: !!binary aGk=\n", "a: !!set {x, y}\n", "a: !!int '3'\n", "yes: 1\ntrue: 2\n",
])
def test_the_direct_build_gives_pyyaml_s_result_or_error(text):
    import yaml

    assert _outcome(lambda t: yaml.load(t, Loader=catalog._strict_loader()), text) == _outcome(_standard_load, text)


def test_an_edited_recipe_is_read_as_edited_with_its_errors(tmp_path):
    root = tmp_path / "recipes"
    shutil.copytree(catalog.recipes_dir(), root)
    gpus = root / "gpus.yaml"
    gpus.write_text(gpus.read_text().replace("hbm_gb: 192", "hbm_gb: 193", 1))
    assert catalog.load_yaml(gpus)["gpus"]["mi300x"]["hbm_gb"] == 193
    gpus.write_text(gpus.read_text() + "\ngpus: {}\n")  # a duplicate key: the strict loader refuses it
    try:
        catalog.load_yaml(gpus)
    except catalog.CatalogError as exc:
        assert "duplicate key 'gpus'" in str(exc)
    else:
        raise AssertionError("a duplicate key was accepted")


# --- strict keys (from test_catalog_strict.py) ----------------------------------------------------

# Strict recipe data (issue #14, item 4): type, range, unknown keys, duplicate keys and encoding, each a one-line
# error naming the file and the key, through the library and through the CLI (exit 2, no traceback).


V41 = "models/deepseek-v4.1-flash.yaml"


@pytest.mark.parametrize("rel,old,new,expect", [
    ("gpus.yaml", "    hbm_bandwidth_tbps: 5.3\n", "    hbm_bandwidth_tbps: 0\n",
     "gpus.mi300x.hbm_bandwidth_tbps: expected a number > 0, got 0"),         # was a ZeroDivisionError
    ("gpus.yaml", "    hbm_bandwidth_tbps: 5.3\n", "    hbm_bandwidth_tbps: .nan\n",
     "gpus.mi300x.hbm_bandwidth_tbps: expected a finite number"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: .inf\n", "gpus.mi300x.hbm_gb: expected a finite number"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: -192\n", "gpus.mi300x.hbm_gb: expected a number > 0"),
    ("gpus.yaml", "    tdp_w: 750\n", "    tdp_w: 750\n    tdp_watts: 750\n", "gpus.mi300x.tdp_watts: unknown key"),
    ("gpus.yaml", "    hbm_gb: 192\n", "    hbm_gb: 192\n    hbm_gb: 1\n", "malformed YAML: duplicate key 'hbm_gb'"),
    (V41, "  golden_acceptance_length: 3.51", "  golden_acceptance_length: high",
     "speculative.golden_acceptance_length: expected int/float, got 'high'"),  # was a traceback in the planner
    (V41, "  golden_acceptance_length: 3.51", "  golden_acceptance_length: 0.5",
     "speculative.golden_acceptance_length: expected a number >= 1"),
    (V41, "weights_gb: 511", "weights_gb: -1", "weights_gb: expected a number > 0"),
    (V41, "    max_num_seqs: 128               # not", "    max_num_seq: 64\n    max_num_seqs: 128   # not",
     "profiles.mi355x.max_num_seq: unknown key"),
    (V41, "    gpu_memory_utilization: 0.9\n", "    gpu_memory_utilization: 1.5\n",
     "profiles.mi355x.gpu_memory_utilization: expected a number > 0 and <= 1"),
    (V41, "  port: 8000\n", "  port: 80000\n", "serve.port: expected a TCP port"),
    (V41, "hf_id: deepseek-ai/DeepSeek-V4.1-Flash\n", "hf_id: ' '\n", "hf_id: must not be empty"),
    (V41, "  active_output_token_b: 16\n", "  active_output_token_b: .nan\n", "params.active_output_token_b: expected a finite"),
    (V41, "key: DeepSeek-V4.1-Flash\n", "key: DeepSeek-V4.1-Flash\nkey: other\n", "duplicate key 'key'"),
    ("vllm.yaml", "    commit: eed1f3d0c6043bd494424a22443ee198dd56f657\n",
     "    commit: eed1f3d0c6043bd494424a22443ee198dd56f657\n    comit: x\n", "builds.nightly-eed1f3d0.comit: unknown key"),
    ("workarounds.yaml", "  - id: amd-block-verification\n", "  - id: amd-block-verification\n    idd: x\n",
     "workarounds[0].idd: unknown key"),
])
def test_bad_recipe_values_name_file_and_key(recipes_copy, rel, old, new, expect):
    path = _break(recipes_copy, rel, old, new)
    with pytest.raises(CatalogError) as exc:
        load_catalog(recipes_copy)
    message = str(exc.value)
    assert message.startswith(str(path)) and expect in message and "\n" not in message, message


def test_non_utf8_recipe_file_is_one_line_exit_2(recipes_copy):
    path = recipes_copy / "gpus.yaml"
    path.write_bytes(path.read_bytes().replace(b"AMD Instinct MI300X\n", b"AMD Instinct MI300X \xe9\n", 1))
    proc = run_cli(["recipe", "--model", "V4.1-Flash", "--gpu", "mi355x"], capture_output=True,
                          text=True, env=cli_env(ROCM_DSPARK_RECIPES=str(recipes_copy)))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"{path}: not UTF-8 text" in lines[0], proc.stderr


def test_the_shipped_recipes_load_strictly():
    cat = load_catalog()
    assert cat.models and cat.gpus
