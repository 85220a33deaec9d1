"""--model-path in container modes: mounted read-only at the same path; a path missing here is refused first."""

import os

from tests.helpers import run_cli


def _cli(*args, cwd=None):
    return run_cli(args, capture_output=True, text=True, cwd=cwd,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ROCM_DSPARK_")}, timeout=120)


def test_a_missing_model_path_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for path, words in ((str(tmp_path / "nope"), "does not exist on this host"), ("rel/ckpt", "give an absolute path"),
                        (str(tmp_path / "a:b"), "cannot mount a path with ':'")):
        r = _cli("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--container", "--model-path", path,
                 "--output", str(out))
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert list(out.iterdir()) == []
    # Host mode does not mount: the path is vLLM's to read (and not checked here).
    assert _cli("launch", "--model", "V4.1-Flash", "--gpu", "mi300x", "--model-path", str(tmp_path / "nope"),
                "--output", str(out)).returncode == 0


def test_docker_form_mounts_the_model_path_read_only_at_the_same_path(tmp_path):
    r = _cli("recipe", "--model", "V4.1-Flash", "--gpu", "mi355x", "--format", "docker", "--model-path", "/models/v41")
    assert r.returncode == 0
    assert "-v /models/v41:/models/v41:ro" in r.stdout and "--entrypoint vllm" in r.stdout
    assert r.stdout.index("/models/v41:/models/v41:ro") < r.stdout.index("  vllm/vllm-openai-rocm:v0.33.0")
