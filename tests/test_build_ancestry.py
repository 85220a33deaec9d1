"""scripts/check_build_ancestry.py against a real git history made here: squash merges titled "(#N)" on main,
builds cut from main at different points. The script must find each merge, answer by `git merge-base
--is-ancestor`, and flag where recipes/vllm.yaml's table disagrees."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_build_ancestry.py"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


def commit(repo, title):
    git(repo, "commit", "-q", "--allow-empty", "-m", title)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path):
    repo = tmp_path / "vllm"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "initial")
    commit(repo, "[Model] Support DeepSeek-V4.1-Flash (#56214)")
    old = commit(repo, "unrelated (#1)")
    commit(repo, "SWA bounded replay (#56227)")
    commit(repo, "[ROCm][DSv4.1] Keep the Engram tables in host memory on ROCm (#57491)")
    new = commit(repo, "unrelated (#2)")
    return repo, old, new


def write_recipes(tmp_path, builds):
    d = tmp_path / "recipes"
    d.mkdir()
    changes = {c: {"title": c, "url": "u"} for c in ("vllm#56214", "vllm#56227", "vllm#57491", "vllm#58151")}
    (d / "vllm.yaml").write_text(yaml.safe_dump({"changes": changes, "builds": builds}))
    return d


def run(repo, recipes):
    return subprocess.run([sys.executable, str(SCRIPT), str(repo), "--recipes", str(recipes)],
                          capture_output=True, text=True)


def test_ancestry_answers_and_agreement(tmp_path, history):
    repo, old, new = history
    recipes = write_recipes(tmp_path, {
        "old": {"commit": old[:8], "changes": {"vllm#56227": {"in": False, "how": "note", "source": "s"},
                                               "vllm#56214": {"in": True, "how": "note", "source": "s"}}},
        "new": {"commit": new, "changes": {"vllm#57491": {"in": True, "how": "note", "source": "s"}}},
        "release": {"commit": None},
    })
    r = run(repo, recipes)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "old vllm#56227: merge" in out and f"is not an ancestor of {old[:12]}; table: False (note)" in out
    assert f"is an ancestor of {old[:12]}; table: True (note)" in out  # #56214 predates old
    assert "new vllm#57491: merge" in out and f"is an ancestor of {new[:12]}; table: True (note)" in out
    assert "vllm#58151: no merge commit titled (#58151)" in out
    assert "release: no commit recorded" in out and "MISMATCH" not in out


def test_a_wrong_table_entry_is_flagged(tmp_path, history):
    repo, old, _ = history
    recipes = write_recipes(tmp_path, {"old": {"commit": old, "changes": {
        "vllm#57491": {"in": True, "how": "note", "source": "s"}}}})  # wrong: #57491 came after `old`
    r = run(repo, recipes)
    assert r.returncode == 1 and "old vllm#57491" in r.stdout and "MISMATCH" in r.stdout


def test_not_a_repository_is_exit_2(tmp_path):
    r = run(tmp_path, write_recipes(tmp_path, {}))
    assert r.returncode == 2 and "is not a git repository" in r.stderr
