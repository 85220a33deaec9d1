"""LaunchPlan -> text: a copy-pasteable shell command, JSON, or a `docker run`."""

from __future__ import annotations

import shlex

from rocm_dspark import textwidth
from rocm_dspark.recipe.plan import Command, LaunchPlan
from rocm_dspark.recipe.vllm_args import emit

# rocm_dspark.launch.launch_facts (docker's flags and mounts) is imported by the docker renderer only: it pulls in
# the runtime's log and partition rules, which `recipe`'s default shell output does not need.


def _argv_lines(argv: list[str] | tuple[str, ...], head: int, command: Command | None = None) -> list[str]:
    """First `head` words on one line, then one flag (with its value) per line, each within the width: the words
    are the command's own, shell-quoted, broken only between words (textwidth.command), never re-read from text."""
    return [
        "\n".join(textwidth.command([shlex.quote(w) for w in words], "  " if i else "", continued=True))
        for i, words in enumerate(_flag_words(argv, head, command))
    ]


def _flag_words(argv: list[str] | tuple[str, ...], head: int, command: Command | None = None) -> list[list[str]]:
    """The words of each line: the first `head` words, then one flag (with its value) per line.
    vLLM's flags come from the typed command (recipe/plan.py Command): `argv` itself, or `command` where argv ends
    with its words (docker's `... --entrypoint vllm IMAGE serve MODEL ...`); the words before those (docker's own)
    are grouped by shape."""
    if isinstance(argv, Command) and len(argv.head) == head:
        return [list(argv.head), *_typed_words(argv)]
    rest = len(command) - 1 if command is not None else 0
    if not (isinstance(command, Command) and rest and tuple(argv[len(argv) - rest :]) == tuple(command[1:])):
        command, rest = None, 0
    words = argv[: len(argv) - rest]
    lines = [list(words[:head])]
    i = head
    while i < len(words):
        takes_value = words[i].startswith("-") and "=" not in words[i]
        n = 2 if takes_value and i + 1 < len(words) and not words[i + 1].startswith("-") else 1
        lines.append(list(words[i : i + n]))
        i += n
    if command is None:
        return lines
    return lines + [[w] for w in command.head[1:]] + _typed_words(command)


def _typed_words(command: Command) -> list[list[str]]:
    return [list(emit(flag, value)) for flag, value in command.flags]


def _comment(text: str) -> list[str]:
    # Notes are single-line by construction; fold any newline so a comment cannot end early.
    return [f"# {line}" for line in text.replace("\r", " ").split("\n")]


NOTE_WIDTH = 120  # a default note line, "# " included: read at a glance
EXPLAIN_HINT = "# --explain: every note's full reasons, evidence and removal conditions"


def brief(line: str, width: int = NOTE_WIDTH - 2) -> str:
    """One line of at most `width` characters: whitespace folded, cut at a word and marked "..."."""
    line = " ".join(line.split())
    if len(line) <= width:
        return line
    cut = line[: width - 3]
    cut = cut[: cut.rfind(" ")] if " " in cut[width // 2 :] else cut
    if cut.count("`") % 2:  # never half a command: cut before the one it would split
        cut = cut[: cut.rfind("`")]
    return cut.rstrip(" ,;:(") + "..."


def note_lines(notes, explain: bool = False) -> list[str]:
    """The notes as comment lines: in full with `explain`, else one short line each (`short`, or the
    text's first clause when a note has no short form), so a new note is shortened the same way."""
    if explain:  # wrapped to the width, a hanging indent under the topic, every line still a comment
        return [w for n in notes for c in _comment(f"{n.topic}: {n.text}") for w in textwidth.wrap(c[2:], "# ", "#   ")]
    out = []
    for n in notes:  # each at most NOTE_WIDTH; the renderers wrap what the terminal cannot show
        text = n.short or _first_clause(n.text)
        out.append("# " + brief(f"{n.topic}: {text}"))
    return out


def _first_clause(text: str) -> str:
    text = " ".join(text.split())
    for stop in (". ", "; "):
        if len(text) <= NOTE_WIDTH - 30:  # room left for the topic
            break
        head, sep, _ = text.partition(stop)
        if sep and len(head) >= 20 and head.count("(") == head.count(")"):  # not inside "(e.g. ...)"
            text = head
    return text


def header_lines(plan: LaunchPlan) -> list[str]:
    return [f"# rocm-dspark plan {plan.profile} [{plan.status}, {plan.status_date}]", f"# image: {plan.image}"]


def render_shell(plan: LaunchPlan, explain: bool = False) -> str:
    """The command first (`K=V ... vllm serve MODEL \\` then one flag per line; shlex.split() gives back
    env + argv), then the plan's header and notes as comments."""
    lines = [f"{k}={shlex.quote(v)}" for k, v in plan.env.items()]
    lines += _argv_lines(plan.argv, 3)
    out = [" \\\n".join(lines), *header_lines(plan)]
    if plan.secret_env:  # values never printed (rocm_dspark/recipe/secret_env.py)
        out.append(f"# set in your environment first (given by --env, not printed): {' '.join(plan.secret_env)}")
    return _with_notes(out, plan, explain)


def _with_notes(out: list[str], plan: LaunchPlan, explain: bool) -> str:
    """The command, then its comment lines and the plan's notes: every one a `# ` comment, wrapped to the width."""
    out = [*out, *note_lines(plan.notes, explain)]
    if not explain:
        out.append(EXPLAIN_HINT)
    return "\n".join(out[:1] + [w for line in out[1:] for w in textwidth.comment(line)]) + "\n"


def render_json(plan: LaunchPlan, explain: bool = False) -> str:
    """Everything, always (`explain` changes nothing: JSON keeps every note's full text and short form)."""
    return plan.to_json() + "\n"


def render_docker(plan: LaunchPlan, explain: bool = False) -> str:
    from rocm_dspark.launch import launch_facts

    argv = launch_facts.docker_run_argv(plan, hf_home="HF_HOME_PLACEHOLDER", hf_hub="HF_HUB_PLACEHOLDER")
    # The cache paths are left for the shell to expand; every other word is quoted literally.
    text = " \\\n".join(_argv_lines(argv, 2, plan.argv if isinstance(plan.argv, Command) else None))
    for placeholder, sh, inside in (
        ("HF_HOME_PLACEHOLDER", launch_facts.HF_HOME_SH, launch_facts.HF_CACHE_CONTAINER),
        ("HF_HUB_PLACEHOLDER", launch_facts.HF_HUB_CACHE_SH, launch_facts.HF_HUB_CONTAINER),
    ):
        text = text.replace(shlex.quote(f"{placeholder}:{inside}"), f'"{sh}:{inside}"')
    text = text.replace(
        f':{launch_facts.HF_CACHE_CONTAINER}" \\\n  -v "', f':{launch_facts.HF_CACHE_CONTAINER}" -v "'
    )  # one cache
    out = [text, *header_lines(plan)]
    if "@sha256:" not in plan.image:  # resolved on this host (rocm-dspark images) or published: run by digest
        out.append("# unresolved here: `rocm-dspark images` records the digest, then this prints it")
    if plan.secret_env:
        out.append(
            f"# --env-file ./{launch_facts.default_name(plan.profile)}.env: mode 0600, one NAME=value line each "
            f"for {' '.join(plan.secret_env)} (given by --env; not printed)"
        )
    return _with_notes(out, plan, explain)


RENDERERS = {"shell": render_shell, "json": render_json, "docker": render_docker}
