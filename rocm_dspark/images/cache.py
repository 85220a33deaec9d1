"""This host's registry answers: a small JSON file in the state dir, `<state>/images/resolved.json`.

`rocm-dspark images`, `up` and `launch --pull` write it (rocm_dspark.images.registry asks the registry); the
recipe path only reads it, and resolve() takes what it read as an input (Selection.images), like probe evidence.
Each entry: {"exists": bool, "digest": "sha256:..." | null, "stack": {...} | null, "answer": the registry's
words, "registry": host, "via": "http" | "skopeo", "checked_at": UTC time}. Light imports only: this is on the
`recipe` path (benchmarks/recipe_latency.py).
"""

import os

FORMAT = 1


def cache_path(state_dir) -> str:
    return os.path.join(str(state_dir), "images", "resolved.json")


def read(state_dir) -> dict:
    """{repo:tag: entry}; {} when there is no cache or it is unreadable (the plan then says "unresolved")."""
    from rocm_dspark.errors import UsageError
    from rocm_dspark.inputs import parse_json, read_text

    try:  # bounded, regular files only, then strict JSON
        data = parse_json(read_text(cache_path(state_dir), "image cache"), "image cache")
    except UsageError:  # none (most hosts, every plain `recipe`): json is not even imported
        return {}
    images = data.get("images") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(images, dict):
        return {}
    return {k: v for k, v in images.items() if isinstance(k, str) and _valid(v)}


def _valid(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("exists"), bool)
        and isinstance(entry.get("checked_at"), str)
        and (
            entry.get("digest") is None or (isinstance(entry["digest"], str) and entry["digest"].startswith("sha256:"))
        )
    )


def for_selection(state_dir) -> tuple:
    """The cache as Selection.images: ((repo:tag, entry), ...), sorted so equal caches give equal plans."""
    return tuple(sorted(read(state_dir).items()))


def record(state_dir, answers: dict) -> str:
    """Merge definite answers (exists True/False) into the cache; unreachable registries record nothing."""
    import json

    from rocm_dspark.atomic import write_atomic

    merged = read(state_dir)
    merged.update({k: v for k, v in answers.items() if _valid(v)})
    path = cache_path(state_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, json.dumps({"format": FORMAT, "images": merged}, indent=1, sort_keys=True) + "\n", mode=0o644)
    return path
