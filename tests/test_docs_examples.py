"""Every example in README.md and docs/*.md runs as written and prints what the page shows (issue 23).

An example is a fenced block whose first line starts with `$ `: the `$ ` lines are commands (a trailing `\\`
continues one), the lines after a command are its real output, compared exactly: stdout and stderr together,
as a terminal shows them (line breaks aside where a temp path stands in for a shown one). Pipes (`| cut -c1-200`, `| grep ...`) do any abridging, so what a page shows is the
whole output of the command it shows. The block runs in `bash` in a fresh temporary directory, with
`rocm-dspark` this checkout and HOME a temporary one; PATH holds only that `rocm-dspark` and the text tools of
TOOLS (no docker, podman, skopeo, amd-smi or rocminfo, installed here or not), so the output is what a machine
without them prints, whatever this one has; the path `/tmp/rocm-dspark-demo` in a command is that
directory's `demo/`, and the output says `/tmp/rocm-dspark-demo` again (HOME reads `/root`). Exit status 0
is expected unless the block is preceded by `<!-- exit N -->`.

A block that cannot run here (it needs an AMD GPU, a real vLLM, or installs packages) is preceded by
`<!-- not run: why -->`; a `bash`/`sh`/`console` block must be an example or say why it is not run.

ROCM_DSPARK_UPDATE_DOCS=1 rewrites each example's output with what it printed (review the diff), the same
way as the goldens.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEMO = "/tmp/rocm-dspark-demo"
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- (not run: .+|exit \d+) -->$")
MAX_EXAMPLES = 24  # a CI budget: each costs about a second
# What the examples' pipes use (and bash itself); nothing that changes what rocm-dspark detects or runs.
TOOLS = ("bash", "sh", "cat", "cut", "grep", "head", "tail", "sed", "awk", "mkdir", "ls", "sort", "tr", "wc", "env",
         "systemd-analyze")


def blocks(path: Path):
    """(info, start, end, marker) per fenced block: lines[start:end] is its body."""
    lines = path.read_text().splitlines()
    i, out = 0, []
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = MARK.match(prev)
        out.append((m.group(1), i + 1, j, mark.group(1) if mark else None))
        i = j + 1
    return lines, out


def steps(body: list[str]):
    """[(command, [expected output lines])] of one example block."""
    out, i = [], 0
    while i < len(body):
        cmd = body[i][2:]
        while cmd.endswith("\\") and i + 1 < len(body):
            i += 1
            cmd = cmd[:-1] + "\n" + body[i]
        i += 1
        expected = []
        while i < len(body) and not body[i].startswith("$ "):
            expected.append(body[i])
            i += 1
        out.append((cmd, expected))
    return out


def all_blocks():
    """(page, info, start, end, marker, body) for every fenced block of every page."""
    for page in PAGES:
        lines, bl = blocks(page)
        for info, start, end, mark in bl:
            yield page, info, start, end, mark, lines[start:end]


def is_example(body) -> bool:
    return bool(body) and body[0].startswith("$ ")


EXAMPLES = [pytest.param(page, start, end, int(mark.split()[1]) if mark else 0, id=f"{page.name}:{start}")
            for page, _, start, end, mark, body in all_blocks()
            if is_example(body) and not (mark or "").startswith("not run")]


def test_every_shell_block_runs_or_says_why_not():
    unmarked = [f"{page.relative_to(REPO)}:{start}" for page, info, start, _, mark, body in all_blocks()
                if info in ("bash", "sh", "shell", "console") and not is_example(body) and not mark]
    assert not unmarked, f"shell blocks that are neither examples nor marked <!-- not run: why -->: {unmarked}"
    assert 0 < len(EXAMPLES) <= MAX_EXAMPLES


def _run(cmd: str, tmp: Path) -> tuple[int, str]:
    home, demo = tmp / "home", tmp / "demo"
    home.mkdir(exist_ok=True)
    shim = tmp / "bin" / "rocm-dspark"
    if not shim.exists():
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m rocm_dspark "$@"\n')
        shim.chmod(0o755)
        for tool in TOOLS:
            found = shutil.which(tool, path="/usr/bin:/bin")
            if found:
                (shim.parent / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_DSPARK_", "XDG_", "DOCKER_"))}
    env.update(PATH=str(shim.parent), HOME=str(home), PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd.replace(DEMO, str(demo))], cwd=tmp, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return proc.returncode, proc.stdout.replace(str(demo), DEMO).replace(str(home), "/root")


def _outputs(body, tmp_path):
    """[(command, exit status, output lines)] of one example, each command run in turn in tmp_path."""
    out = []
    for cmd, _ in steps(body):
        rc, text = _run(cmd, tmp_path)
        out.append((cmd, rc, text.rstrip("\n").split("\n") if text.strip() else []))
    return out


@pytest.mark.skipif(os.environ.get("ROCM_DSPARK_UPDATE_DOCS") == "1", reason="rewriting the pages instead")
@pytest.mark.parametrize("page,start,end,code", EXAMPLES)
def test_example_prints_what_the_page_shows(page, start, end, code, tmp_path):
    body = page.read_text().splitlines()[start:end]
    for (cmd, expected), (_, rc, got) in zip(steps(body), _outputs(body, tmp_path)):
        assert rc == code, f"{page.name}:{start} `{cmd}` exited {rc}, the page expects {code}:\n" + "\n".join(got)
        if any(DEMO in ln or "/root" in ln for ln in got):
            # The run's temp paths are longer than the /tmp/rocm-dspark-demo and /root it shows, so lines wrapped
            # to the width (rocm_dspark/textwidth.py) break elsewhere: the same words, line breaks aside.
            # (a long quoted word splits into quoted pieces at other places too: quotes are left out)
            # (a wrapped comment continues with `#`: a line break too)
            got, expected = (" ".join(w for w in "\n".join(t).replace("\\\n", "").replace("'", "").split() if w != "#")
                             for t in (got, expected))
        assert got == expected, f"{page.name}:{start} `{cmd}` printed something other than the page shows"


@pytest.mark.skipif(os.environ.get("ROCM_DSPARK_UPDATE_DOCS") != "1", reason="ROCM_DSPARK_UPDATE_DOCS=1 rewrites")
def test_update_the_pages(tmp_path_factory):
    """Each example's output replaced by what it printed, last block first so line numbers hold."""
    for page in PAGES:
        ex = [(start, end) for p, start, end, _ in (e.values for e in EXAMPLES) if p == page]
        lines = page.read_text().splitlines()
        for start, end in reversed(ex):
            new = []
            for cmd, _, got in _outputs(lines[start:end], tmp_path_factory.mktemp("doc")):
                new += ["$ " + cmd.replace("\n", "\\\n"), *got]
            lines[start:end] = new
        page.write_text("\n".join(lines) + "\n")


def _words(line: str) -> int:
    """Shell words on the line (one: a long quoted word, e.g. an `sh -c` script, which cannot break)."""
    import shlex

    try:
        return len(shlex.split(line.lstrip(" #").removesuffix(" \\")))
    except ValueError:  # prose with an apostrophe
        return len(line.split())


def test_every_example_output_fits_the_width():
    """What every example that runs prints (the page shows it, the test above compares it) is at most MAX_TABLE
    columns: tables are the widest; prose wraps to the width and commands break with `\\`
    (rocm_dspark/textwidth.py). Excepted: a single word (a URL, a quoted `sh -c` script), a one-line error (README, "Bad input": one
    line), and the `$ ` commands, which are the page's own text."""
    from rocm_dspark.textwidth import MAX_TABLE

    wide = [f"{page.name}:{start + i + 1}: {len(line)} columns" for page, start, end, _ in (e.values for e in EXAMPLES)
            for i, line in enumerate(page.read_text().splitlines()[start:end])
            if len(line) > MAX_TABLE and _words(line) > 1
            and not line.startswith(("$ ", "rocm-dspark: error: "))]
    assert 0 < len(EXAMPLES) and not wide, wide


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^(python3\.11 -m venv \.venv && \.venv/bin/pip install torch==2\.13\.0 .*pytest(?: -n 2)?)$", readme, re.M)
    assert command, "the README's test command is missing"
    ci = (REPO / ".ci" / "run").read_text()
    assert command.group(1) in ci.replace(" -q ", " "), "`.ci/run` must run the README's test command"
    main_job = "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/rocm-dspark recipe --model V4.1-Flash"
    assert main_job in readme.splitlines()


def gpu_build_table() -> list[str]:
    """The README's GPU x build table, from recipes/ (the resolver decides every cell)."""
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.errors import UsageError
    from rocm_dspark.recipe.resolve import Selection, resolve

    cat = load_catalog()
    model = cat.models["DeepSeek-V4.1-Flash"]
    cells, builds = {}, []
    for b in cat.builds.values():
        for g in model.profiles:
            try:
                plan = resolve(cat, Selection(model=model.key, gpu=g, build=b.name))
            except UsageError:
                continue
            cells[g, b.name] = plan
            if b not in builds:
                builds.append(b)
    head = ["GPU", "profile (public evidence)"]
    for b in builds:
        tags = [b.status] if b.status != "current" else []
        tags += ["adaptive verification native"] if cells[next(k for k in cells if k[1] == b.name)].build.adaptive_on_rocm_v41 == "native" else []
        head.append(f"`{b.name}`" + (f" ({', '.join(tags)})" if tags else ""))
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g, p in model.profiles.items():
        default, _ = cat.default_build(cat.gpus[g])
        row = [cat.gpus[g].name.replace("AMD Instinct ", ""), f"{p.status}, {p.status_date}"]
        for b in builds:
            if (g, b.name) not in cells:
                row.append("refused")
                continue
            run = "public run" if g in b.gpus else "no public run"
            row.append(f"**default**, {run}" if b.name == default.name else run)
        rows.append("| " + " | ".join(row) + " |")
    return rows


def test_readme_gpu_build_table_is_what_the_recipes_say():
    readme = REPO / "README.md"
    text = readme.read_text()
    start, end = "<!-- gpu-build-table: generated by tests/test_docs_examples.py -->\n", "\n<!-- /gpu-build-table -->"
    i, j = text.index(start) + len(start), text.index(end)
    want = "\n".join(gpu_build_table())
    if os.environ.get("ROCM_DSPARK_UPDATE_DOCS") == "1":
        readme.write_text(text[:i] + want + text[j:])
        return
    assert text[i:j] == want, "the README's GPU x build table is stale: rerun with ROCM_DSPARK_UPDATE_DOCS=1"
