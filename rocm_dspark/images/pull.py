"""Pull once, run the digest: the image step `up` and `launch --pull` share.

Ask the registry what the tag is (rocm_dspark.images.registry; the answer goes in this host's cache), pull it
(`docker pull`, or podman's docker-compatible CLI), read the digest the pull recorded and return `repo@sha256:...`,
which the launcher then runs on every start without pulling. `inspect --format '{{json .RepoDigests}}'` reports
the repository digests the local image carries, which is what a later `docker run` by digest uses
(https://docs.docker.com/reference/cli/docker/image/inspect/). When the plan pins a digest, the pulled image must
carry exactly that digest. A tag the registry does not hold, or a registry that cannot be reached while this host
holds no copy, is one line saying so and what to do.
"""

from __future__ import annotations

import shutil
import subprocess

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.images import cache, pick, registry
from rocm_dspark.inputs import parse_json


def runtime() -> str | None:
    """docker, else podman, else None."""
    return next((tool for tool in ("docker", "podman") if shutil.which(tool)), None)


def commands(tool: str, image: str) -> list[list[str]]:
    return [[tool, "pull", image], [tool, "image", "inspect", "--format", "{{json .RepoDigests}}", image]]


def parse_repo_digests(text: str) -> list[str]:
    """The `inspect --format '{{json .RepoDigests}}'` output -> ['repo@sha256:...', ...]."""
    text = text.strip()
    if not text or text == "null":
        return []
    value = parse_json(text, "RepoDigests")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"RepoDigests is not a list of strings: {text[:200]}")
    return value


def check_digest(image: str, digests: list[str]) -> tuple[str | None, str | None]:
    """(the digest of the requested repository to record, or None where it has none; a problem or None). Another
    repository's digest is never taken: `repo@<its digest>` would name an image no registry holds."""
    repo = pick.canonical(pick.repository(image))
    got = [d.split("@", 1)[1] for d in digests if "@" in d and pick.canonical(d.split("@", 1)[0]) == repo]
    want = image.split("@", 1)[1] if "@sha256:" in image else None
    if want and want not in got:
        return None, f"the image's digests of {pick.repository(image)} {got} do not include the plan's {want}"
    return (want or (got[0] if got else None)), None


def pull_and_pin(tool: str, image: str, *, say=lambda line: None, timeout_s: float = 7200.0) -> dict:
    """Run the pull and the inspect; returns {"image", "digest", "pinned", "commands"} or raises RuntimeError."""
    pull = commands(tool, image)[0]
    say(f"  $ {' '.join(pull)}")
    proc = subprocess.run(pull, text=True, capture_output=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(pull)}` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['no output']}"
        )
    got = pin_local(tool, image)
    return {**got, "commands": [" ".join(pull), *got["commands"]]}


def pin_local(tool: str, image: str) -> dict:
    """The digest of the copy this host holds (no pull; after a pull, or for a registry that cannot be reached)."""
    inspect = commands(tool, image)[1]
    proc = subprocess.run(inspect, text=True, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(inspect)}` failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}")
    digests = parse_repo_digests(proc.stdout)
    digest, problem = check_digest(image, digests)
    if problem:
        raise RuntimeError(problem)
    got = {
        "image": image,
        "digest": digest,
        "pinned": f"{pick.repository(image)}@{digest}",
        "runtime": tool,
        "commands": [" ".join(inspect)],
    }
    if digest is None:  # built here, or its digests name other repositories: the ID, which no start pulls
        ident, said = image_id(tool, image)
        if ident is None:
            raise RuntimeError(f"`{tool} image inspect --format '{{{{.Id}}}}' {image}` failed: {said}")
        got["pinned"] = ident
        got["note"] = (
            f"{image} has no digest of {pick.repository(image)} ("
            + (f"its digests name {', '.join(d.split('@')[0] for d in digests)}" if digests else "built here?")
            + f"): pinned its image ID {ident}, which {tool} runs from this host and never pulls"
        )
    return got


def image_id(tool: str, image: str) -> tuple[str | None, str]:
    """(the local image's ID from `inspect --format '{{.Id}}'`, or None; what the tool said when it is None)."""
    try:
        proc = subprocess.run(
            [tool, "image", "inspect", "--format", "{{.Id}}", image], text=True, capture_output=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    out = proc.stdout.strip()
    if proc.returncode == 0 and out.startswith("sha256:"):
        return out, ""
    return None, " ".join((proc.stderr or out).split())[:300]


class PullFailed(Exception):
    """(message, fix): the image cannot be pinned now; `environment`: the registry or the runtime failed (exit
    3), not the choice of build (exit 2)."""

    def __init__(self, message: str, fix: str, environment: bool = False, missing: bool = False):
        super().__init__(message)
        self.message, self.fix, self.environment = message, fix, environment
        self.missing = missing  # the registry lacks the tag


def pin(
    plan, state_dir, *, tool: str, resolver=registry.resolve, replacement: str | None = None, say=lambda line: None
) -> dict:
    """{"image", "digest", "pinned", "runtime", "commands", "resolved"}; PullFailed with the fix."""
    image = plan.image
    tag = plan.build.image_tag if plan.build is not None else image
    resolved = None
    try:
        resolved = resolver(tag)
    except registry.RegistryUnreachable as exc:
        held, _ = image_id(tool, image)
        if held is None:
            raise PullFailed(
                f"cannot resolve {tag}: {exc}; this host holds no copy of it",
                f"make the registry reachable (or `{tool} load` the image on an air-gapped node) and run again",
                environment=True,
            ) from None
        say(f"  registry unreachable ({exc}); using the copy this host holds")
    if resolved is not None:
        cache.record(state_dir, {tag: resolved})
        if not resolved["exists"] and image_id(tool, image)[0] is not None:
            say(f"  {tag} is not in the registry ({resolved['answer']}), but this host holds {image} (built here?)")
            resolved = None  # pin the copy this host holds, as offline
        elif not resolved["exists"]:
            fix = f"rerun with --build {replacement}" if replacement else "pick another --build (`rocm-dspark images`)"
            raise PullFailed(
                f"{tag} is not in the registry ({resolved['answer']} from {resolved['registry']})", fix, missing=True
            )
        else:
            say(f"  {tag} is {pick.repository(tag)}@{resolved['digest']} in the registry ({resolved['answer']})")
    held_digest = None
    if resolved is not None and resolved.get("digest"):
        by_digest = f"{pick.repository(tag)}@{resolved['digest']}"
        if image_id(tool, by_digest)[0] is not None:
            held_digest = by_digest  # pull once: this host already holds exactly what the registry names
    local = resolved is None or held_digest is not None
    try:
        if resolved is None:  # offline with a local copy: pin what this host holds
            got = pin_local(tool, image)
        elif held_digest:
            say(f"  this host already holds {held_digest}: no pull")
            got = pin_local(tool, held_digest)
        else:
            got = pull_and_pin(tool, image, say=say)
    except (RuntimeError, ValueError, OSError) as exc:
        fix = (
            f"`{tool} image inspect {image}` shows what this host holds"
            if local
            else f"`{tool} pull {image}` by hand shows the error"
        )
        raise PullFailed(f"image: {exc}", fix, environment=True) from None
    if got.get("note"):
        say(f"  note: {got['note']}")
    if resolved is not None and resolved.get("digest") and "@" not in image and got["digest"] != resolved["digest"]:
        say(
            f"  note: the tag moved between the registry's answer ({resolved['digest']}) and the pull "
            f"({got['digest']}); running what was pulled"
        )
    got["resolved"] = resolved
    return got


def pin_for_launch(plan, state_dir, say=print):
    """`launch --pull`: the plan with its image replaced by the digest pulled now (UsageError on failure)."""
    tool = runtime()
    if tool is None:
        raise UsageError(
            "--pull needs docker (or podman) on this host; without it, write the launcher here and "
            "pull on the node (the launcher pins the digest the node holds at its first start)"
        )
    try:
        got = pin(plan, state_dir, tool=tool, say=say)
    except PullFailed as exc:
        raise (EnvironmentFailure if exc.environment else UsageError)(f"{exc.message}; {exc.fix}") from None
    return plan._replace(image=got["pinned"]), got
