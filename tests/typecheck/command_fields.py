"""A negative type check, run by mypy in .ci/run (pyproject.toml [tool.mypy] files), never imported by pytest.

Each `# type: ignore[code]` below marks a line mypy must refuse: with warn_unused_ignores on, a line it accepted
would leave its ignore unused, and mypy fails. So this file passes only while the types keep a plain tuple of
words out of a plan's Command fields and keep a `tuple[str, ...]` from being read as a Command.
"""

from rocm_dspark.recipe.plan import Command, LaunchPlan, flag_pairs

words: tuple[str, ...] = ("vllm", "serve", "m", "--port", "8000")
command = Command(("vllm", "serve", "m"), [("--port", "8000")])


def refused(plan: LaunchPlan) -> None:
    plan._replace(block_argv=words)  # type: ignore[arg-type]
    plan._replace(adaptive_argv=words)  # type: ignore[arg-type]
    held: tuple[str, ...] = command
    _ = held.flags  # type: ignore[attr-defined]
    _ = plan.argv.flags  # type: ignore[attr-defined]
    _bad: Command = words  # type: ignore[assignment]
    Command(("vllm", "serve", "m"), [("--port", 8000)])  # type: ignore[list-item]


def accepted(plan: LaunchPlan) -> None:
    plan._replace(block_argv=command, adaptive_argv=None)
    command.flags.get("port")
    flag_pairs(plan.argv)
