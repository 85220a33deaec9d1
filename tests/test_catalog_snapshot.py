"""rocm_dspark/recipe/recipes_parsed.json, the parsed-recipes snapshot that keeps `recipe` within its start-up budget
(benchmarks/recipe_latency.py): it must equal what recipes/ parses to, and never stand in for an edited file."""

from __future__ import annotations

import json
import shutil

from rocm_dspark.recipe import catalog


def test_the_snapshot_is_fresh():
    assert catalog.PARSED.read_text() == catalog.snapshot_text(), \
        "recipes/ changed: run `python -m rocm_dspark.recipe.catalog --snapshot` and commit rocm_dspark/recipe/recipes_parsed.json"


def test_every_snapshot_entry_is_exactly_what_the_strict_yaml_loader_reads():
    used = 0
    for path in sorted(catalog.recipes_dir().rglob("*.yaml")):
        raw = path.read_bytes()
        entry = catalog._parsed().get(catalog._content_key(raw))
        if entry is None:  # int keys (adaptive_payoff, step_cost): JSON cannot hold them, so YAML it is
            continue
        used += 1
        # repr: the same values and types, and the same key order (a build's changes keep the YAML's order)
        assert repr(json.loads(entry)) == repr(catalog._parse_yaml(path, raw))
    assert used >= 5  # gpus, vllm, workarounds and the models: the files on the `recipe` path


def test_an_edited_recipe_is_parsed_again_with_its_errors(tmp_path):
    root = tmp_path / "recipes"
    shutil.copytree(catalog.recipes_dir(), root)
    gpus = root / "gpus.yaml"
    gpus.write_text(gpus.read_text().replace("hbm_gb: 192", "hbm_gb: 193", 1))
    assert catalog._parsed().get(catalog._content_key(gpus.read_bytes())) is None
    assert catalog._load_yaml(gpus)["gpus"]["mi300x"]["hbm_gb"] == 193
    gpus.write_text(gpus.read_text() + "\ngpus: {}\n")  # a duplicate key: the strict loader still refuses it
    try:
        catalog._load_yaml(gpus)
    except catalog.CatalogError as exc:
        assert "duplicate key 'gpus'" in str(exc)
    else:
        raise AssertionError("a duplicate key was accepted")


def test_a_broken_snapshot_falls_back_to_yaml(monkeypatch, tmp_path):
    bad = tmp_path / "parsed.json"
    bad.write_text("{not json")
    monkeypatch.setattr(catalog, "PARSED", bad)
    catalog._parsed.cache_clear()
    try:
        path = catalog.recipes_dir() / "gpus.yaml"
        assert catalog._parsed() == {} and catalog._load_yaml(path) == catalog._parse_yaml(path, path.read_bytes())
    finally:
        catalog._parsed.cache_clear()
