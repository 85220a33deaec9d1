"""The library behind `rocm-dspark images`: ask the registry about each candidate tag, record the answers
in this host's cache (rocm_dspark.images.cache) and say which image each plan would run."""

from __future__ import annotations

from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.images import cache, pick, registry
from rocm_dspark.textwidth import aligned


def candidates(catalog, gpu=None, build: str | None = None) -> list[tuple]:
    """[(build, role)]: the asked build; or the GPU's defaults, the other releases, then the builds its
    public evidence ran on; or, with neither, every build."""
    if build:
        return [(catalog.find_build(build), "asked (--build)")]
    if gpu is None:
        return [(b, b.channel) for b in catalog.builds.values()]
    defaults, _ = catalog.default_builds(gpu)
    roles = [(b, f"{gpu.arch} default, choice {i}") for i, b in enumerate(defaults, 1)]
    roles += [(b, "release") for b in catalog.builds.values() if b.channel == "release" and b.status == "current"]
    roles += [(b, f"public evidence on {gpu.key}") for b in catalog.evidence_builds(gpu)]
    first: dict = {}
    for b, role in roles:
        first.setdefault(b.name, (b, role))  # each build once, in its first role
    return list(first.values())


def ask(rows: list[tuple], resolver=registry.resolve, mirror: str | None = None) -> list[dict]:
    """Resolve each candidate's tag (on `mirror`: the same repository and tag there); an unreachable registry is a
    row with `error` (nothing recorded)."""
    out = []
    for b, role in rows:
        tag = pick.on_mirror(b.image_tag, mirror)
        row = {
            "build": b.name,
            "role": role,
            "tag": tag,
            "channel": b.channel,
            "rocm_recorded": b.rocm,
            "published_digest": b.digest,
        }
        try:
            row["answer"] = resolver(tag)
        except (registry.RegistryUnreachable, ValueError) as exc:
            row["error"] = str(exc)
        out.append(row)
    return out


class _Asked(NamedTuple):
    """--image REF as a table row: the fields of a catalog build (recipe.plan.Build) that ask() and pick read."""

    image: str
    name: str = "--image"
    image_tag: str = ""
    digest: str | None = None
    rocm: str | None = None
    channel: str = "image"


def run(
    catalog,
    state_dir,
    gpu=None,
    build: str | None = None,
    resolver=registry.resolve,
    *,
    mirror: str | None = None,
    image: str | None = None,
) -> dict:
    """Ask, record, and decide what the plan runs (`runs.missing`: the one-line error when its tag is gone).
    mirror: --registry (every tag asked there); image: --image REF, asked alone (what the plan then runs)."""
    asked = [(_Asked(image, image_tag=image), "asked (--image)")] if image else candidates(catalog, gpu, build)
    rows = ask(asked, resolver, mirror)
    answers = {r["tag"]: r["answer"] for r in rows if "answer" in r}
    path = cache.record(state_dir, answers) if answers else cache.cache_path(state_dir)
    result = {
        "gpu": gpu.key if gpu else None,
        "cache": path,
        "images": rows,
        "mirror": mirror,
        "earlier": bool(answers or cache.read(state_dir)),  # any answer recorded, now or before
    }
    if gpu is None and not build and not image:
        return result
    images = cache.for_selection(state_dir)
    if image:
        chosen, replacement = asked[0][0]._replace(image=rows[0]["tag"], image_tag=rows[0]["tag"]), None
    else:
        held = pick.first_held(catalog.default_builds(gpu)[0], images)[0] if gpu else None
        chosen = catalog.find_build(build) if build else held
        chosen = chosen._replace(
            image=pick.on_mirror(chosen.image, mirror), image_tag=pick.on_mirror(chosen.image_tag, mirror)
        )
        replacement = held.name if held else None
    entry = pick.lookup(images, chosen.image_tag)
    unreachable = next((r["error"] for r in rows if r["build"] == chosen.name and "error" in r), None)
    result["runs"] = {"build": chosen.name, "tag": chosen.image_tag, "unreachable": unreachable}
    try:
        image, note = pick.image_for(chosen, entry, replacement if replacement != chosen.name else None)
        result["runs"].update(image=image, note=note, missing=None)
    except UsageError as exc:  # the tag is gone: the caller prints the table, then this one line (exit 2)
        result["runs"].update(image=None, note="the registry does not hold it", missing=str(exc))
    return result


def _short(digest: str | None) -> str:
    return digest[:19] + "…" if digest else "-"


def lines(result: dict) -> list[str]:
    """The table, then what was not answered and where the answers went. When no registry answered, the
    command's one error line says why (stderr), so the table does not say it again."""
    none = all("error" in r for r in result["images"])
    rows = [("build", "tag", "in registry", "digest", "stack (image config)", "answer / role")]
    for r in result["images"]:
        a = r.get("answer")
        if a is None:
            held, digest, stack, said = "unknown", "-", "-", "no answer" if none else "no answer (below)"
        else:
            held = "yes" if a["exists"] else "NO"
            digest = _short(a.get("digest"))
            stack = f"ROCm {a['stack']['rocm']}" if a.get("stack") else "not in config"
            if a.get("vllm_version"):
                stack += f", vLLM {a['vllm_version']}"
            said = f"{a['answer']} ({a['via']})"
        rows.append((r["build"], r["tag"], held, digest, stack, f"{said}; {r['role']}"))
    out = aligned(rows)
    for err in () if none else dict.fromkeys(r["error"] for r in result["images"] if "error" in r):
        out.append(f"no answer: {err}")
    runs = result.get("runs")
    if runs:
        where = f" on {result['gpu']}" if result["gpu"] else ""
        out.append(f"plan{where} runs {runs['build']}: {runs['note']}")
        if runs["unreachable"]:
            out.append("  (no answer now: the plan keeps the last recorded answer, if any)")
    if any("answer" in r for r in result["images"]):
        out.append(
            f"answers recorded in {result['cache']} (plans read them: `recipe`, `launch` and `up` run the digest)"
        )
    elif result.get("earlier"):
        out.append(f"nothing recorded: no registry answered (earlier answers in {result['cache']} stay)")
    else:
        out.append("nothing recorded: no registry answered, and none has before")
    return out
