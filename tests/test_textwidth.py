"""textwidth's own wrap (textwidth._fill) is textwrap.wrap with the options textwidth uses, line for line: it
replaced textwrap on the `recipe` start-up path (textwrap compiles its patterns at import)."""

import random
import textwrap

import pytest

from rocm_dspark import textwidth

WORDS = ["a", "bb", "ccc", "word", "x" * 30, "y" * 70, " ", "  ", "\t", "\xa0", "-", "a-b", "\u2003", ",", "`c`",
         "\x0b", "\r", "\n"]


@pytest.mark.parametrize("seed", range(4))
def test_fill_is_textwrap_wrap(seed):
    rng = random.Random(seed)
    for _ in range(2500):
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
        width = rng.randint(1, 120)
        first, rest = rng.choice(["", "# ", "    # "]), rng.choice(["", "#   ", "      "])
        want = textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                             break_long_words=False, break_on_hyphens=False)
        assert textwidth._fill(text, width, first, rest) == want, (text, width, first, rest)


def test_fill_refuses_a_width_as_textwrap_does():
    with pytest.raises(ValueError, match="invalid width 0"):
        textwidth._fill("a", 0, "", "")


def test_a_command_breaks_between_its_words_and_prose_and_comments_wrap():
    words = ["vllm", "serve", "--model", "'a b'", "--port", "8000"]
    lines = textwidth.command(words, "  ", width=20)
    assert lines[0].startswith("  vllm") and all(ln.endswith(" \\") for ln in lines[:-1]) and len(lines) > 1
    bash_reads = "\n".join(lines).replace("\\\n", "")  # each backslash-newline continuation removed
    assert bash_reads.split() == ["vllm", "serve", "--model", "'a", "b'", "--port", "8000"]
    assert textwidth.command(words, width=200) == [" ".join(words)]
    assert textwidth.comment("# " + "word " * 30, width=40)[1].startswith("#   ")
    assert textwidth.prose("  rocm-dspark plan: " + "word " * 20, width=40)[1].startswith("    ")
    assert not any(ln.endswith("\\") for ln in textwidth.prose("rocm-dspark plan: " + "w " * 40, width=40))
