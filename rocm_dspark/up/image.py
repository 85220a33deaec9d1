"""Step 4: pull the plan's image and pin the digest the registry gave us.

`docker pull` (or podman's docker-compatible CLI) fetches it; `inspect --format '{{json .RepoDigests}}'`
reports the repository digests the local image carries, which is what a later `docker run` by digest uses
(https://docs.docker.com/reference/cli/docker/image/inspect/). When the plan pins a digest, the pulled
image must carry exactly that digest; a tag-only plan gets the digest recorded so the launch is pinned.

The image's software (its vLLM, torch and ROCm: rocm_dspark.probe.software run by the image's own python3,
with no network) is what the gate must fingerprint for a plan that runs in the image: `software_in`.
"""

from __future__ import annotations

import shutil
import subprocess

from rocm_dspark.inputs import parse_json


def runtime() -> str | None:
    """docker, else podman, else None."""
    for tool in ("docker", "podman"):
        if shutil.which(tool):
            return tool
    return None


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


def pinned_digest(image: str) -> str | None:
    return image.split("@", 1)[1] if "@sha256:" in image else None


def repository(image: str) -> str:
    """'registry:5000/org/name:tag@sha256:..' -> 'registry:5000/org/name' (RepoDigests carry no tag)."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


def check_digest(image: str, digests: list[str]) -> tuple[str | None, str | None]:
    """(the digest of the requested repository to record, or None where it has none; a problem or None). Another
    repository's digest is never taken: `repo@<its digest>` would name an image no registry holds."""
    from rocm_dspark.images.pick import canonical

    repo = canonical(repository(image))
    got = [d.split("@", 1)[1] for d in digests if "@" in d and canonical(d.split("@", 1)[0]) == repo]
    want = pinned_digest(image)
    if want and want not in got:
        return None, f"the image's digests of {repository(image)} {got} do not include the plan's {want}"
    return (want or (got[0] if got else None)), None


def pull_and_pin(tool: str, image: str, *, say=lambda line: None, timeout_s: float = 7200.0) -> dict:
    """Run the pull and the inspect; returns {"image", "digest", "pinned", "commands"} or raises RuntimeError."""
    pull = commands(tool, image)[0]
    say(f"  $ {' '.join(pull)}")
    proc = subprocess.run(pull, text=True, capture_output=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(pull)}` failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['no output']}")
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
    if digest is None:  # built here, or its digests name other repositories: the ID, which no start pulls
        ident, said = image_id(tool, image)
        if ident is None:
            raise RuntimeError(f"`{tool} image inspect --format '{{{{.Id}}}}' {image}` failed: {said}")
        return {"image": image, "digest": None, "pinned": ident, "runtime": tool, "commands": [" ".join(inspect)],
                "note": f"{image} has no digest of {repository(image)} ("
                        + (f"its digests name {', '.join(d.split('@')[0] for d in digests)}" if digests else "built here?")
                        + f"): pinned its image ID {ident}, which {tool} runs from this host and never pulls"}
    return {"image": image, "digest": digest, "pinned": f"{repository(image)}@{digest}", "runtime": tool,
            "commands": [" ".join(inspect)]}


def image_id(tool: str, image: str) -> tuple[str | None, str]:
    """(the local image's ID from `inspect --format '{{.Id}}'`, or None; what the tool said when it is None)."""
    try:
        proc = subprocess.run([tool, "image", "inspect", "--format", "{{.Id}}", image], text=True,
                              capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    out = proc.stdout.strip()
    if proc.returncode == 0 and out.startswith("sha256:"):
        return out, ""
    return None, " ".join((proc.stderr or out).split())[:300]


def software_command(tool: str, image: str) -> list[str]:
    """Run rocm_dspark.probe.software with the image's python3: no network, removed afterwards."""
    from rocm_dspark.probe.software import script

    return [tool, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", script()]


def software_in(tool: str, image: str, timeout_s: float = 600.0) -> dict:
    """The image's software facts (rocm_dspark.probe.software.KEYS); RuntimeError with the reason."""
    from rocm_dspark.probe.software import parse

    argv = software_command(tool, image)
    try:
        proc = subprocess.run(argv, text=True, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"`{tool} run --rm {image} python3` failed: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"`{tool} run --rm {image} python3` exited {proc.returncode}: {last[0][:300]}")
    try:
        return parse(proc.stdout)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None


def bench_container(run) -> tuple[str, str] | None:
    """Where `vllm bench serve` runs (validate's sweep, the A/B arms): in the serving image (container modes), else
    on the host."""
    tool, image = runtime(), (run.outputs.get("image") or {}).get("pinned") or run.plan.image
    return (tool, image) if run.mode() != "foreground" and tool and image else None
