"""Command.from_words reads foreign argv the way vLLM's FlexibleArgumentParser does."""

from rocm_dspark.recipe.plan import Command


def test_equals_space_underscores_aliases_last_wins():
    c = Command.from_words(["vllm", "serve", "M", "--max_num_seqs=8", "-tp", "4", "--max-num-seqs", "16",
                            "-O3", "--enforce-eager", "--no-enable-prefix-caching", "--port=-1"])
    assert c.head == ("vllm", "serve", "M")
    assert c.value("max_num_seqs") == "16"
    assert c.value("tensor_parallel_size") == "4"
    assert c.value("optimization_level") == "3"
    assert c.value("port") == "-1"
    assert c.bool_flag("enforce_eager") is True
    assert c.bool_flag("enable_prefix_caching") is False
    assert c.bool_flag("trust_remote_code") is None


def test_spec_config_gpus_and_without():
    c = Command.from_words(["vllm", "serve", "M", "-sc", '{"num_speculative_tokens": 3}', "-tp", "2",
                            "-pp", "2", "--data-parallel-size", "2", "--speculative-config.method=mtp"])
    assert c.spec_config() == {"num_speculative_tokens": 3}
    assert c.gpus_per_node_used == 8
    assert list(c.without("speculative_config")) == ["vllm", "serve", "M", "--tensor-parallel-size", "2",
                                                     "--pipeline-parallel-size", "2", "--data-parallel-size", "2"]
    assert Command.from_words(["vllm", "serve", "M", "-sc", "[1]"]).spec_config() is None


def test_positional_after_flags_and_double_dash():
    c = Command.from_words(["vllm", "serve", "--port", "1", "M"])
    assert c.value("port") == "1" and c.head == ("vllm", "serve", "M")
    c = Command.from_words(["vllm", "serve", "--enforce-eager", "--", "M"])
    assert c.head == ("vllm", "serve", "M") and c.bool_flag("enforce_eager") is True
    assert Command.from_words(c) is c
