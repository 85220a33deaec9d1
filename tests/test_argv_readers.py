"""Every reader of a foreign argv reads `--flag value` and `--flag=value` (and vLLM's other spellings: `--a_b`, the
short aliases) the same, because each goes through Command.from_words (recipe/plan.py). That vLLM's own parser reads
these spellings the same way: tests/slow/test_command_words_real.py."""

import json

import pytest

from rocm_dspark.launch import k8s, launch_facts
from rocm_dspark.launch.launch_group import _rendezvous
from rocm_dspark.launch.render import _flag_words
from rocm_dspark.planner import host_fit
from rocm_dspark.probe import ab_band, fingerprint, live
from rocm_dspark.recipe import strategies
from rocm_dspark.recipe.plan import Command
from rocm_dspark.recipe.strategies import LEADER_PLACEHOLDER
from rocm_dspark.validate import av_acceptance, bench, tool_calls
from tests.test_builds import flags as builds_flags

HEAD = ["vllm", "serve", "org/m"]
SPEC = '{"num_speculative_tokens":3,"enable_adaptive_verification":true}'


def spellings(flag: str, value: str) -> list[list[str]]:
    """`--f v`, `--f=v` and `--f_with_underscores v`: what vLLM's parser reads as one setting."""
    under = "--" + flag[2:].replace("-", "_")
    return [[flag, value], [f"{flag}={value}"], [under, value], [f"{under}={value}"]]


def _mono(argv):
    return launch_facts.runs_mono(argv)


# (name, words after the model, reader, what it must answer for every spelling)
READERS = [
    ("fingerprint flags", ("--max-num-seqs", "8"), lambda a: fingerprint._flag_values(a)[1], {"--max-num-seqs": "8"}),
    ("ab_band K", ("--speculative-config", SPEC), ab_band._num_speculative_tokens, 3),
    ("spec config", ("--speculative-config", SPEC), lambda a: Command.from_words(a).spec_config(), json.loads(SPEC)),
    ("live int flag", ("--max-num-batched-tokens", "4096"), lambda a: live.int_flag(a, "max_num_batched_tokens"), 4096),
    ("live capture", ("--max-cudagraph-capture-size", "64"), live.capture_of, 64),
    ("log_checks capture", ("--max-cudagraph-capture-size", "64"),
     lambda a: live.int_flag(a, "max_cudagraph_capture_size"), 64),
    ("tool parser", ("--tool-call-parser", "deepseek_v41"), lambda a: tool_calls.flag(a, "tool_call_parser"),
     "deepseek_v41"),
    ("bench tokenizer", ("--tokenizer", "org/tok"), bench.served_model, "org/tok"),
    ("k8s gpus", ("--tensor-parallel-size", "4"), k8s._gpus_used, 4),
    ("host_fit setting", ("--speculative-config", SPEC, "--max-cudagraph-capture-size", "64"),
     lambda a: host_fit._argv_setting("t", "arm", a), (3, True, "64", False)),
    ("av_acceptance nospec", ("--speculative-config", SPEC), av_acceptance.without_speculation, HEAD),
    ("strategies spec", ("--speculative-config", SPEC), lambda a: strategies._spec_of(Command.from_words(a)),
     json.loads(SPEC)),
    ("test_builds flags", ("--engram-config", "{}"), builds_flags, {"--engram-config": "{}"}),
    ("group rendezvous (DP)", ("--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "14000"),
     lambda a: _rendezvous(a, {}, 2), {"join_host": "10.0.0.1", "join_port": 14000, "group_nodes": 2, "iface": ""}),
    ("group rendezvous (--nnodes)", ("--master-addr", "10.0.0.1", "--master-port", "29600"),
     lambda a: _rendezvous(a, {}, 2), {"join_host": "10.0.0.1", "join_port": 29600, "group_nodes": 2, "iface": ""}),
    ("k8s worker rank", ("--node-rank", "1", "--master-addr", LEADER_PLACEHOLDER), lambda a: k8s._worker_script(a, 8),
     'exec vllm serve org/m --node-rank "${LWS_WORKER_INDEX}" --master-addr "${LWS_LEADER_ADDRESS}"'),
    ("k8s worker DP rank", ("--data-parallel-start-rank", "8", "--data-parallel-address", LEADER_PLACEHOLDER),
     lambda a: k8s._worker_script(a, 8),
     'exec vllm serve org/m --data-parallel-start-rank "$((LWS_WORKER_INDEX * 8))" '
     '--data-parallel-address "${LWS_LEADER_ADDRESS}"'),
]


def _forms(words: tuple[str, ...]) -> list[list[str]]:
    """Every combination of spellings of the (flag, value) pairs in `words`."""
    out: list[list[str]] = [[]]
    for i in range(0, len(words), 2):
        out = [prefix + form for prefix in out for form in spellings(words[i], words[i + 1])]
    return out


@pytest.mark.parametrize("name,words,reader,want", READERS, ids=[r[0] for r in READERS])
def test_every_reader_reads_every_spelling_the_same(name, words, reader, want):
    answers = {json.dumps(reader(HEAD + form), default=str) for form in _forms(words)}
    assert answers == {json.dumps(want, default=str)}, name
    # And the model positional may come after the flags, as vLLM allows.
    assert reader(HEAD[:2] + _forms(words)[1] + HEAD[2:]) == want, name


def test_absent_settings_read_as_absent():
    bare = HEAD + ["--enforce-eager"]
    assert ab_band._num_speculative_tokens(bare) is None and Command.from_words(bare).spec_config() is None
    assert live.int_flag(bare, "max_num_batched_tokens") is None and live.int_flag(bare, "max_cudagraph_capture_size") is None
    assert live.capture_of(bare, 512) == 0  # --enforce-eager: no graphs
    assert live.capture_of(HEAD + ["--enforce-eager", "--no-enforce-eager"], 512) == 512  # the last one wins
    assert tool_calls.flag(bare, "tool_call_parser") is None and bench.served_model(bare) == "org/m"
    assert k8s._gpus_used(HEAD) == 1


def test_the_last_spelling_wins_as_in_argparse():
    argv = HEAD + ["--max-num-seqs=4", "--max_num_seqs", "8", "-tp", "2", "--tensor-parallel-size=4"]
    assert fingerprint._flag_values(argv)[1] == {"--max-num-seqs": "8", "--tensor-parallel-size": "4"}
    assert k8s._gpus_used(argv) == 4
    two = HEAD + ["--speculative-config", '{"num_speculative_tokens":2}', f"--speculative-config={SPEC}"]
    assert ab_band._num_speculative_tokens(two) == 3


def test_a_group_without_a_rendezvous_flag_has_none():
    # a `ray start` worker, and --master-addr alone: vLLM's default --master-port
    assert _rendezvous(("ray", "start", "--address=10.0.0.1:6379", "--block"), {}, 2)["join_port"] is None
    assert _rendezvous(HEAD + ["--master-addr=10.0.0.1"], {"GLOO_SOCKET_IFNAME": "eth1"}, 2) == {
        "join_host": "10.0.0.1", "join_port": 29501, "group_nodes": 2, "iface": "eth1"}
    ray = k8s._worker_script(("ray", "start", f"--address={LEADER_PLACEHOLDER}:6379", "--block"), 1)
    assert ray == 'exec ray start --address="${LWS_LEADER_ADDRESS}":6379 --block'


def test_short_aliases_read_as_their_long_flags():
    assert k8s._gpus_used(HEAD + ["-tp", "2", "-dp", "2", "-pp", "2"]) == 8
    assert ab_band._num_speculative_tokens(HEAD + ["-sc", SPEC]) == 3


def test_monokernel_is_a_boolean_flag():
    assert _mono(HEAD + ["--monokernel"]) and not _mono(HEAD) and not _mono(HEAD + ["--monokernel", "--no-monokernel"])


def test_launch_identity_drops_host_and_port_in_every_spelling_and_keeps_the_rest_as_given():
    rest = ["--max-num-seqs", "8", "--enforce-eager"]
    for host in spellings("--host", "0.0.0.0"):
        for port in spellings("--port", "8000"):
            words = ["docker", "run", "--rm", "img", *HEAD, *host, *rest, *port]
            assert fingerprint._without_flags(words, {"--host", "--port"}) == ["docker", "run", "--rm", "img", *HEAD,
                                                                                *rest]
    # A bare --host followed by a flag drops only itself; a value like "-1" is a value, as vLLM reads it.
    assert fingerprint._without_flags(HEAD + ["--host", "--enforce-eager", "--port", "-1"], {"--host", "--port"}) == \
        HEAD + ["--enforce-eager"]


def test_the_launch_difference_names_a_changed_value_not_a_changed_spelling():
    rec, cur = {"argv": HEAD + ["--max-num-seqs", "8"]}, {"argv": HEAD + ["--max_num_seqs=16"]}
    assert fingerprint._launch_difference(rec, cur) == "--max-num-seqs 8 in the record, 16 in the plan"
    assert fingerprint._launch_difference(rec, {"argv": HEAD + ["--max-num-seqs=8"]}) == "same flags in another order"


def _flag_lines(argv, head, command=None) -> list[str]:
    return [("  " if i else "") + " ".join(words) for i, words in enumerate(_flag_words(argv, head, command))]


def test_docker_lines_take_vllm_flags_from_the_typed_command():
    command = Command(HEAD, [("--port", "-1"), ("--enforce-eager", None), ("--max-num-seqs", "8")])
    docker = ["docker", "run", "--rm", "-v", "a:b", "--entrypoint", "vllm", "img", *command[1:]]
    assert _flag_lines(docker, 2, command) == ["docker run", "  --rm", "  -v a:b", "  --entrypoint vllm", "  img",
                                               "  serve", "  org/m", "  --port=-1", "  --enforce-eager",
                                               "  --max-num-seqs 8"]
    assert _flag_lines(command, 3) == ["vllm serve org/m", "  --port=-1", "  --enforce-eager", "  --max-num-seqs 8"]


@pytest.mark.parametrize("kw", [{}, {"tp": 4}, {"dp": 2, "tp": 4}, {"nodes": 2, "head_address": "10.0.0.1", "dp": 2}])
def test_the_plans_layout_and_its_command_count_the_same_gpus(kw):
    # LaunchPlan.gpus_per_node_used reads the plan's layout fields; the Command's reads its flags (what k8s asks for).
    from rocm_dspark.recipe.catalog import load_catalog
    from rocm_dspark.recipe.resolve import Selection, resolve

    plan = resolve(load_catalog(), Selection(model="V4.1-Flash", gpu="mi300x", **kw))
    for argv in (plan.argv, plan.block_argv, plan.adaptive_argv):
        assert Command.from_words(argv).gpus_per_node_used == plan.gpus_per_node_used == k8s._gpus_used(argv)
