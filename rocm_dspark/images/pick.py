"""Which image a plan runs, from the catalog and this host's registry answers (Selection.images). Pure.

resolve.build_layer calls these: the arch's default release that the registry holds, the image by digest where
this host resolved it (else the tag, said to be unresolved), a one-line error for a tag the registry does not
hold, the nightly retention note and what the public evidence is evidence for. No network, files or clock.
"""

import re

from rocm_dspark.errors import UsageError

# Compiled on first use (re's cache): --registry and --image only, off the plain `recipe` path.
_MIRROR = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?"
REPO_PATH = r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
REGISTRY_VAR = "ROCM_DSPARK_REGISTRY"  # what --registry defaults to (the CLI reads it)


def check_mirror(value: str) -> str:
    """--registry HOST[:PORT] (no scheme, no path); UsageError (one line) otherwise."""
    port = (value or "").rpartition("]")[2].partition(":")[2]
    if not re.fullmatch(_MIRROR, value or "") or (port and not 0 < int(port) < 65536):
        raise UsageError(
            f"--registry {value!r}: give a registry as HOST or HOST:PORT, PORT 1-65535 (e.g. harbor.example.com or "
            f"127.0.0.1:5000), without a scheme or a path (${REGISTRY_VAR} takes the same form)"
        )
    return value


def ref_parts(image: str) -> tuple[str, str, str | None, str | None]:
    """[HOST[:PORT]/]REPO[:TAG][@DIGEST] -> (host or "", repository path, tag, digest), None where a part is absent.
    A first component with '.', ':' or 'localhost' is a registry host (docker's rule)."""
    name, at, digest = image.partition("@")
    head, _, last = name.rpartition("/")
    repo_last, colon, tag = last.partition(":")
    host, path = _split_host(f"{head}/{repo_last}" if head else repo_last)
    return host, path, tag if colon else None, digest if at else None


def check_ref(value: str) -> str:
    """--image REF: [HOST[:PORT]/]REPO[:TAG][@sha256:HEX], docker's grammar; UsageError (one line) otherwise."""
    _, path, tag, digest = ref_parts(value or "")
    ok = (
        re.fullmatch(REPO_PATH, path)
        and (tag is None or re.fullmatch(_TAG, tag))
        and (digest is None or re.fullmatch(r"sha256:[0-9a-f]{64}", digest))
    )
    if not ok:
        raise UsageError(
            f"--image {value!r} is not an image reference: use [HOST[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST], "
            f"e.g. 127.0.0.1:5000/rocm-dspark/vllm-cpu-test:0.32.0"
        )
    return value


def pinned(image: str) -> bool:
    """REPO@sha256:DIGEST, or a local image ID (sha256:HEX, what `up` pins for an image built here): what runs
    is fixed, so no start resolves a tag."""
    return "@sha256:" in image or bool(re.fullmatch(r"sha256:[0-9a-f]{64}", image))


def on_mirror(image: str, mirror: str | None) -> str:
    """The same repository and tag (or digest) on `mirror`: 'vllm/vllm-openai-rocm:v0.33.0' with mirror
    'harbor:5000' -> 'harbor:5000/vllm/vllm-openai-rocm:v0.33.0' (docker's rules: a first component with '.', ':'
    or 'localhost' is a registry host and is replaced; Docker Hub's one-word names live under library/)."""
    if not mirror:
        return image
    name, at, digest = image.partition("@")
    host, path = _split_host(name)
    name = path if host else name if "/" in name else f"library/{name}"
    return f"{mirror}/{name}{at}{digest}"


def _split_host(name: str) -> tuple[str, str]:
    """(registry host or "", the rest): docker's rule, a first component with '.', ':' or 'localhost' is a host."""
    first, _, rest = name.partition("/")
    return (first, rest) if rest and ("." in first or ":" in first or first == "localhost") else ("", name)


def canonical(repo: str) -> str:
    """docker's full name of a repository ('vllm/x' -> 'docker.io/vllm/x', 'ubuntu' -> 'docker.io/library/ubuntu'),
    as podman writes RepoDigests."""
    if _split_host(repo)[0]:
        return repo
    return f"docker.io/{repo}" if "/" in repo else f"docker.io/library/{repo}"


def repository(image_tag: str) -> str:
    """'host:5000/org/name:tag' -> 'host:5000/org/name'."""
    head, _, last = image_tag.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0].split("@", 1)[0]


def lookup(images, tag: str) -> dict | None:
    """The registry's answer for `tag` in Selection.images ((ref, entry), ...), or None."""
    return dict(images or ()).get(tag)


def first_held(builds, images):
    """(the first build whose tag the registry holds, or the first with no answer yet; skipped builds)."""
    skipped: list = []
    for b in builds:
        entry = lookup(images, b.image_tag)
        if entry is None or entry["exists"]:
            return b, skipped
        skipped.append(b)
    return builds[0], skipped  # none held: the first, whose absence image_for reports


def _answer(entry: dict) -> str:
    where = f" from {entry['registry']}" if entry.get("registry") else ""
    via = f" ({entry['via']})" if entry.get("via") else ""
    return f"{entry.get('answer') or 'not found'}{via}{where}, checked {entry['checked_at']}"


def image_for(build, entry: dict | None, replacement: str | None) -> tuple:
    """(image to run, note text); UsageError (one line) when the registry said the tag is gone."""
    if build.digest:  # a digest from public evidence: what the plan runs whatever the tag does now
        if entry is not None and not entry["exists"]:
            return build.image, (
                f"{build.image} (published digest); its tag {build.image_tag} is gone from the "
                f"registry ({_answer(entry)}): only a node cache may still hold it"
            )
        return build.image, f"{build.image} (published digest)"
    if entry is None:
        return build.image_tag, (
            f"{build.image_tag}: unresolved (no registry answer on this host yet: "
            f"`rocm-dspark images` asks); `up` and `launch --pull` pull it once and run the digest"
        )
    if not entry["exists"]:
        fix = f"use --build {replacement}" if replacement else "pick another --build (`rocm-dspark images` lists them)"
        raise UsageError(f"image {build.image_tag} is not in the registry ({_answer(entry)}); {fix}")
    if not entry.get("digest"):
        return build.image_tag, f"{build.image_tag}: the registry holds it but gave no digest ({_answer(entry)})"
    pinned = f"{repository(build.image_tag)}@{entry['digest']}"
    stack = entry.get("stack") or {}
    says = (
        f"; the image reports ROCm {stack['rocm']} ({stack.get('source', 'its config')})" if stack.get("rocm") else ""
    )
    return pinned, f"{build.image_tag} resolved on this host to {pinned} ({_answer(entry)}){says}"


def _day(date: str) -> int:
    """'2026-09-21' or '2026-11' -> a day number (the first of the month when only the month is known)."""
    y, m, d = (int(part) for part in (date.split("-") + ["01"])[:3])
    # Days since 0000-03-01 (a civil-calendar formula): no datetime import on the recipe path.
    y -= m <= 2
    era_day = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return 365 * y + y // 4 - y // 100 + y // 400 + era_day


def retention_note(catalog, build, today: str | None, replacement: str | None) -> str | None:
    """A nightly older than its channel's retention window is probably gone: say so, and name the release."""
    rule = catalog.channels.get(build.channel) or {}
    days = rule.get("retention_days")
    if not days or not build.date:
        return None
    dated = [b.date for b in catalog.builds.values() if b.date]
    as_of, what = (today, "today") if today else (max(dated), "the newest build in recipes/vllm.yaml")
    age = _day(as_of) - _day(build.date)
    if age <= days:
        return None
    use = f"; use its replacement, release {replacement} (--build {replacement})" if replacement else ""
    return (
        f"{build.name} ({build.date}) is probably gone from the registry: vLLM keeps the last "
        f"{rule['retention_builds']} {build.channel} builds (about {days} days; {rule['source']}) and it is {age} days "
        f"older than {what} ({as_of}){use}"
    )


EVIDENCE_MODEL = "DeepSeek-V4.1-Flash"  # the model whose public runs recipes/vllm.yaml's `gpus:` lists


def evidence_note(catalog, gpu, build, profile, model: str = EVIDENCE_MODEL) -> str:
    """What the profile's public evidence is evidence for, against the build the plan runs."""
    own = build.gpus.get(gpu.key)
    if model != EVIDENCE_MODEL:  # a V4.1 run is no evidence for another model
        return (
            f"no public {model} run on {gpu.key} with {build.name} is recorded (recipes/vllm.yaml lists V4.1 "
            f"runs); `rocm-dspark validate` or `up` produce this host's evidence"
        )
    if own:
        return f"public V4.1 evidence on {gpu.key} with this build: {', '.join(own)}"
    others = [b for b in catalog.evidence_builds(gpu) if b.name != build.name]
    were = ""
    if others:
        runs = ", ".join(f"{b.name} ({', '.join(b.gpus[gpu.key])})" for b in others)
        were = f"; the profile's evidence ({', '.join(profile.evidence)}) is for another build: {runs}"
    return (
        f"no public V4.1 run on {gpu.key} with {build.name}{were}; `rocm-dspark validate` or `up` produce this "
        f"host's evidence"
    )
