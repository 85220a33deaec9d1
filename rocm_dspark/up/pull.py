"""Pull once, run the digest: the step `up` and `launch --pull` share.

Ask the registry what the tag is (rocm_dspark.images.registry; the answer goes in this host's cache), pull it
(`docker pull`), read the digest the pull recorded (RepoDigests) and return `repo@sha256:...`, which the
launcher then runs on every start without pulling. A tag the registry does not hold, or a registry that cannot
be reached while this host holds no copy, is one line saying so and what to do.
"""

from __future__ import annotations

from rocm_dspark.errors import EnvironmentFailure, UsageError
from rocm_dspark.images import cache, pick, registry


class PullFailed(Exception):
    """(message, fix): the image cannot be pinned now; `environment`: the registry or the runtime failed (exit
    3), not the choice of build (exit 2)."""

    def __init__(self, message: str, fix: str, environment: bool = False, missing: bool = False):
        super().__init__(message)
        self.message, self.fix, self.environment = message, fix, environment
        self.missing = missing  # the registry lacks the tag


def pin(plan, state_dir, *, tool: str, resolver=registry.resolve, replacement: str | None = None,
        say=lambda line: None) -> dict:
    """{"image", "digest", "pinned", "runtime", "commands", "resolved"}; PullFailed with the fix."""
    from rocm_dspark.up import image as image_mod

    image = plan.image
    tag = plan.build.image_tag if plan.build is not None else image
    resolved = None
    try:
        resolved = resolver(tag)
    except registry.RegistryUnreachable as exc:
        held, _ = image_mod.image_id(tool, image)
        if held is None:
            raise PullFailed(f"cannot resolve {tag}: {exc}; this host holds no copy of it",
                             f"make the registry reachable (or `{tool} load` the image on an air-gapped node) and "
                             f"run again", environment=True) from None
        say(f"  registry unreachable ({exc}); using the copy this host holds")
    if resolved is not None:
        cache.record(state_dir, {tag: resolved})
        if not resolved["exists"] and image_mod.image_id(tool, image)[0] is not None:
            say(f"  {tag} is not in the registry ({resolved['answer']}), but this host holds {image} (built here?)")
            resolved = None  # pin the copy this host holds, as offline
        elif not resolved["exists"]:
            fix = f"rerun with --build {replacement}" if replacement else "pick another --build (`rocm-dspark images`)"
            raise PullFailed(f"{tag} is not in the registry ({resolved['answer']} from {resolved['registry']})", fix,
                             missing=True)
        else:
            say(f"  {tag} is {pick.repository(tag)}@{resolved['digest']} in the registry ({resolved['answer']})")
    held_digest = None
    if resolved is not None and resolved.get("digest"):
        by_digest = f"{pick.repository(tag)}@{resolved['digest']}"
        if image_mod.image_id(tool, by_digest)[0] is not None:
            held_digest = by_digest  # pull once: this host already holds exactly what the registry names
    local = resolved is None or held_digest is not None
    try:
        if resolved is None:  # offline with a local copy: pin what this host holds
            got = image_mod.pin_local(tool, image)
        elif held_digest:
            say(f"  this host already holds {held_digest}: no pull")
            got = image_mod.pin_local(tool, held_digest)
        else:
            got = image_mod.pull_and_pin(tool, image, say=say)
    except (RuntimeError, ValueError, OSError) as exc:
        fix = (f"`{tool} image inspect {image}` shows what this host holds" if local
               else f"`{tool} pull {image}` by hand shows the error")
        raise PullFailed(f"image: {exc}", fix, environment=True) from None
    if got.get("note"):
        say(f"  note: {got['note']}")
    if resolved is not None and resolved.get("digest") and "@" not in image and got["digest"] != resolved["digest"]:
        say(f"  note: the tag moved between the registry's answer ({resolved['digest']}) and the pull "
            f"({got['digest']}); running what was pulled")
    got["resolved"] = resolved
    return got


def pin_for_launch(plan, state_dir, say=print):
    """`launch --pull`: the plan with its image replaced by the digest pulled now (UsageError on failure)."""
    from rocm_dspark.up import image as image_mod

    tool = image_mod.runtime()
    if tool is None:
        raise UsageError("--pull needs docker (or podman) on this host; without it, write the launcher here and "
                         "pull on the node (the launcher pins the digest the node holds at its first start)")
    try:
        got = pin(plan, state_dir, tool=tool, say=say)
    except PullFailed as exc:
        raise (EnvironmentFailure if exc.environment else UsageError)(f"{exc.message}; {exc.fix}") from None
    return plan._replace(image=got["pinned"]), got
