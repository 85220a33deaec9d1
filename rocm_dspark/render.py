"""LaunchPlan -> text: a copy-pasteable shell command, JSON, or a `docker run`."""

from __future__ import annotations

import shlex

from rocm_dspark import launch_facts
from rocm_dspark.plan import LaunchPlan


def _argv_lines(argv: list[str] | tuple[str, ...], head: int) -> list[str]:
    """First `head` words on one line, then one flag (with its value) per line."""
    lines = [" ".join(shlex.quote(a) for a in argv[:head])]
    i = head
    while i < len(argv):
        word = argv[i]
        takes_value = word.startswith("-") and "=" not in word
        if takes_value and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            lines.append(f"  {shlex.quote(word)} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            lines.append(f"  {shlex.quote(word)}")
            i += 1
    return lines


def _comment(text: str) -> list[str]:
    # Notes are single-line by construction; fold any newline so a comment cannot end early.
    return [f"# {line}" for line in text.replace("\r", " ").split("\n")]


def render_shell(plan: LaunchPlan) -> str:
    """`K=V ... vllm serve MODEL \\` then one flag per line; shlex.split() gives back env + argv."""
    out = _comment(f"rocm-dspark plan {plan.profile} [{plan.status}, {plan.status_date}] image {plan.image}")
    for note in plan.notes:
        out += _comment(f"{note.topic}: {note.text}")
    if plan.secret_env:  # values never printed (rocm_dspark/secret_env.py)
        out += _comment(f"set in your environment first (given by --env, not printed): {' '.join(plan.secret_env)}")
    lines = [f"{k}={shlex.quote(v)}" for k, v in plan.env.items()]
    lines += _argv_lines(plan.argv, 3)
    out.append(" \\\n".join(lines))
    return "\n".join(out) + "\n"


def render_json(plan: LaunchPlan) -> str:
    return plan.to_json() + "\n"


def docker_argv(plan: LaunchPlan, hf_cache: str = launch_facts.HF_CACHE_HOST) -> list[str]:
    """`docker run` argv (rocm_dspark.launch_facts, the same as the launcher's container mode); the image's
    command is `vllm serve ...` via --entrypoint vllm."""
    name = launch_facts.default_name(plan.profile)
    return launch_facts.docker_run_argv(name, plan.image, plan.argv, plan.env, hf_cache=hf_cache,
                                        env_file=f"./{name}.env" if plan.secret_env else None)


def render_docker(plan: LaunchPlan) -> str:
    argv = docker_argv(plan, hf_cache="HF_CACHE_PLACEHOLDER")
    lines = _argv_lines(argv, 2)
    # The cache path is left for the shell to expand; every other word is quoted literally.
    text = " \\\n".join(lines).replace(
        shlex.quote(f"HF_CACHE_PLACEHOLDER:{launch_facts.HF_CACHE_CONTAINER}"),
        f'"{launch_facts.HF_CACHE_HOST}:{launch_facts.HF_CACHE_CONTAINER}"')
    out = _comment(f"rocm-dspark plan {plan.profile} [{plan.status}, {plan.status_date}]")
    if plan.build is not None and not plan.build.digest:
        out += _comment(f"image {plan.image} has no published digest: after `docker pull`, pin the digest "
                        f"`docker image inspect` reports (RepoDigests) and run that")
    if plan.secret_env:
        out += _comment(f"--env-file ./{launch_facts.default_name(plan.profile)}.env: create it with mode 0600 and one "
                        f"NAME=value line for each of {' '.join(plan.secret_env)} (given by --env; not printed here)")
    for note in plan.notes:
        out += _comment(f"{note.topic}: {note.text}")
    return "\n".join(out + [text]) + "\n"


RENDERERS = {"shell": render_shell, "json": render_json, "docker": render_docker}
