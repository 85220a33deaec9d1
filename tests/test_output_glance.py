"""`rocm-dspark recipe` at a glance (issue 23): the command first, then one short line per note; `--explain`
and JSON keep every note in full."""

import json

import pytest

from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import Note
from rocm_dspark.launch.render import NOTE_WIDTH, note_lines, render_docker, render_json, render_shell
from rocm_dspark.recipe.resolve import Selection, resolve
from tests.conftest import cli_env
from tests.helpers import run_cli

CAT = load_catalog()
PROFILES = [(m, g) for m in CAT.models for g in CAT.models[m].profiles]
MAX_NOTES = 12


@pytest.mark.parametrize("render", [render_shell, render_docker], ids=["shell", "docker"])
@pytest.mark.parametrize("model,gpu", PROFILES)
def test_default_output_is_the_command_then_short_notes(model, gpu, render):
    plan = resolve(CAT, Selection(model=model, gpu=gpu))
    lines = render(plan).splitlines()
    assert not lines[0].startswith("#")  # the command comes first
    comments = [ln for ln in lines if ln.startswith("#") and not ln.startswith("#   ")]  # "#   ": a wrapped note
    assert all(len(ln) <= NOTE_WIDTH for ln in comments), max(comments, key=len)
    assert len(plan.notes) <= MAX_NOTES and len(comments) <= MAX_NOTES + 4
    # in a pipe (100 columns, rocm_dspark/textwidth.py) notes longer than that wrap onto a second line
    assert len(lines) <= 72
    # every note is there, by its topic (the id of a workaround)
    for note in plan.notes:
        assert any(ln.startswith(f"# {note.topic}: ") for ln in comments)


def test_explain_prints_reasons_evidence_and_removal_conditions():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x"))
    short, full = render_shell(plan), render_shell(plan, explain=True)
    w = next(w for w in CAT.workarounds if w.id == "gfx942-full-decode-only")
    short, unwrapped = (t.replace("\n#   ", " ") for t in (short, full))  # notes wrap with a hanging indent
    assert f"# workaround {w.id}: {w.short}\n" in short and w.evidence not in short
    assert f"# workaround {w.id}: {' '.join(w.reason.split())} Remove when: {w.remove_when}. ({w.evidence})\n" in unwrapped
    assert "# --explain" not in full
    chars = [sum(len(ln) for ln in t.splitlines() if ln.startswith("#")) for t in (short, full)]
    assert chars[1] > 2 * chars[0]


def test_json_keeps_every_note_in_full_and_short():
    plan = resolve(CAT, Selection(model="V4.1-Flash", gpu="mi300x"))
    notes = json.loads(render_json(plan, explain=False))["notes"]
    assert notes == [{"topic": n.topic, "text": n.text, "short": n.short} for n in plan.notes]


def test_a_note_without_a_short_form_is_shortened_the_same_way():
    """A note another layer adds with only its full text still prints as one line within the width."""
    long = Note("capture cap", "max_num_seqs 512 x 6 exceeds the cap; graphs above it run eager. " + "x " * 200)
    (line,) = note_lines([long])
    assert line == "# capture cap: max_num_seqs 512 x 6 exceeds the cap; graphs above it run eager"
    (cut,) = note_lines([Note("t", "word " * 100)])
    assert len(cut) <= NOTE_WIDTH and cut.endswith("word...")
    wrapped = note_lines([long], explain=True)
    assert " ".join(ln[2:].strip() for ln in wrapped) == " ".join(f"capture cap: {long.text}".split())


def test_workaround_short_forms_fit_without_cutting():
    for w in CAT.workarounds:
        assert w.short and len(f"# workaround {w.id}: {w.short}") <= NOTE_WIDTH, w.id


def test_recipe_cli_fits_one_screen_with_the_command_first():

    proc = run_cli(["recipe", "--model", "V4.1-Flash"], capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60 and lines[0].startswith("VLLM_") and "vllm serve" in proc.stdout.split("#")[0]
    assert max(len(ln) for ln in lines if ln.startswith("#")) <= NOTE_WIDTH
    explained = run_cli(["recipe", "--model", "V4.1-Flash", "--explain"], capture_output=True,
                               text=True, env=cli_env()).stdout
    assert "Remove when:" in explained and "https://github.com/vllm-project/recipes/pull/963" in explained
