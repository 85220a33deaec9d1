"""The one server-description file (`probe --server-json` and `validate --server-json`): defaults and errors.

What each command takes from a loaded file is tested with that command (tests/test_probe_levels.py,
tests/test_validate_report.py); both CLIs are driven through it in tests/test_probe_cli.py and
tests/test_validate_report.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_dspark.errors import UsageError
from rocm_dspark.runtime.server_spec import KEYS, ServerSpec, load_server_spec


def write(tmp_path, content) -> Path:
    path = tmp_path / "server.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_minimal_file_gets_the_documented_defaults(tmp_path):
    path = write(tmp_path, {"argv": ["vllm", "serve", "tiny"], "port": 18000})
    spec = load_server_spec(path, flag="--server-json")
    assert spec == ServerSpec(argv=("vllm", "serve", "tiny"), port=18000, env={}, path=path.resolve(),
                              host="127.0.0.1", served_name=None, recipe_model=False, num_speculative_tokens=None,
                              description="", deterministic_check=None, prompts=None)


def test_every_key_is_read(tmp_path):
    data = {"argv": ["vllm", "serve", "/m", "--port", "18001"], "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
            "host": "0.0.0.0", "port": 18001, "served_name": "tiny", "recipe_model": True,
            "num_speculative_tokens": 3, "description": "tiny ngram",
            "deterministic_check": {"prompt": "What is 2+2?", "expect": "4", "max_tokens": 8},
            "prompts": ["def f(", "one two"]}
    assert set(data) == set(KEYS)
    spec = load_server_spec(write(tmp_path, data), flag="--server-json")
    assert spec.argv == tuple(data["argv"]) and spec.env == data["env"] and spec.host == "0.0.0.0"
    assert (spec.port, spec.served_name, spec.recipe_model, spec.num_speculative_tokens, spec.description) == (
        18001, "tiny", True, 3, "tiny ngram")
    assert spec.deterministic_check == data["deterministic_check"] and spec.prompts == ("def f(", "one two")


def test_explicit_nulls_mean_the_defaults(tmp_path):
    spec = load_server_spec(write(tmp_path, {"argv": ["vllm"], "port": 1, "env": None, "num_speculative_tokens": None,
                                             "description": None, "deterministic_check": None, "prompts": None}),
                            flag="--server-json")
    assert (spec.env, spec.num_speculative_tokens, spec.description, spec.deterministic_check, spec.prompts) == (
        {}, None, "", None, None)


@pytest.mark.parametrize("content,message", [
    ("{", "line 1: malformed JSON: Expecting property name"),
    ("", "malformed JSON"),
    ('{"argv": ["vllm"], "port": 1, "port": 2}', "malformed JSON: duplicate key 'port'"),
    ("[" * 100000, "JSON nested too deeply"),
    ('{"argv": ["vllm"], "port": ' + "9" * 5000 + "}", "malformed JSON: Exceeds the limit (4300 digits)"),
    ('{"argv": ["vllm"], "port": NaN}', "malformed JSON: NaN is not a JSON number"),
    ("[]", "must hold a JSON object with at least argv and port"),
    ('"vllm serve"', "must hold a JSON object"),
    ('{"argv": ["vllm"], "port": 8000, "served_model_name": "x", "model": "y"}',
     "unknown key(s) model, served_model_name; known: argv, env, host, port, served_name, recipe_model, "
     "num_speculative_tokens, description, deterministic_check, prompts"),
    ('{"port": 8000}', "argv is required"),
    ('{"argv": ["vllm"]}', "port is required"),
    ('{"argv": [], "port": 1}', "argv must be a non-empty list of strings"),
    ('{"argv": "vllm serve", "port": 1}', "argv must be a non-empty list of strings"),
    ('{"argv": ["vllm", 1], "port": 1}', "argv must be a non-empty list of strings"),
    ('{"argv": ["vllm"], "port": 0}', "port must be an integer 1-65535"),
    ('{"argv": ["vllm"], "port": 65536}', "port must be an integer 1-65535"),
    ('{"argv": ["vllm"], "port": true}', "port must be an integer 1-65535"),
    ('{"argv": ["vllm"], "port": "8000"}', "port must be an integer 1-65535"),
    ('{"argv": ["vllm"], "port": 80.5}', "port must be an integer 1-65535"),
    ('{"argv": ["vllm"], "port": 8000, "env": {"A": 1}}', "env must map strings to strings"),
    ('{"argv": ["vllm"], "port": 8000, "env": ["A=1"]}', "env must map strings to strings"),
    ('{"argv": ["vllm"], "port": 8000, "host": ""}', "host must be a non-empty string"),
    ('{"argv": ["vllm"], "port": 8000, "host": 127}', "host must be a non-empty string"),
    ('{"argv": ["vllm"], "port": 8000, "served_name": ""}', "served_name must be a non-empty string"),
    ('{"argv": ["vllm"], "port": 8000, "served_name": 3}', "served_name must be a non-empty string"),
    ('{"argv": ["vllm"], "port": 8000, "recipe_model": "yes"}', "recipe_model must be true or false"),
    ('{"argv": ["vllm"], "port": 8000, "recipe_model": 1}', "recipe_model must be true or false"),
    ('{"argv": ["vllm"], "port": 8000, "num_speculative_tokens": 0}', "num_speculative_tokens must be a positive"),
    ('{"argv": ["vllm"], "port": 8000, "num_speculative_tokens": true}', "num_speculative_tokens must be a positive"),
    ('{"argv": ["vllm"], "port": 8000, "description": 5}', "description must be a string"),
    ('{"argv": ["vllm"], "port": 8000, "deterministic_check": {"prompt": "x"}}', "deterministic_check must be null or"),
    ('{"argv": ["vllm"], "port": 8000, "deterministic_check": "17*19"}', "deterministic_check must be null or"),
    ('{"argv": ["vllm"], "port": 8000, "prompts": [""]}', "prompts must be a non-empty list of non-empty strings"),
    ('{"argv": ["vllm"], "port": 8000, "prompts": []}', "prompts must be a non-empty list"),
    ('{"argv": ["vllm"], "port": 8000, "prompts": "hello"}', "prompts must be a non-empty list"),
])
def test_bad_files_are_one_line_usage_errors_naming_flag_and_file(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(UsageError) as info:
        load_server_spec(path, flag="--server-json")
    text = str(info.value)
    assert text.startswith(f"--server-json {path}: ") and message in text, text
    assert "\n" not in text


def test_missing_file_and_a_directory(tmp_path):
    with pytest.raises(UsageError) as info:
        load_server_spec(tmp_path / "missing.json", flag="--server-json")
    assert str(info.value) == f"--server-json {tmp_path / 'missing.json'}: no such file"
    with pytest.raises(UsageError, match=r"not a regular file"):
        load_server_spec(tmp_path, flag="--server-json")


def test_the_flag_name_is_the_callers(tmp_path):
    # validation/conftest.py passes its own pytest option name; the message names what the user typed.
    with pytest.raises(UsageError, match=r"^--other x\.json: no such file$"):
        load_server_spec("x.json", flag="--other")


def test_the_readme_example_loads(tmp_path):
    # The example file in validation/README.md is the documented format: it must stay loadable.
    from tests.conftest import REPO

    text = (REPO / "validation" / "README.md").read_text()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    spec = load_server_spec(write(tmp_path, block), flag="--server-json")
    assert spec.served_name == "tiny" and spec.recipe_model is False and spec.port == 18431
