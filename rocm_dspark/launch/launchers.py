"""LaunchPlan -> launcher files: a bash launcher, and for systemd a unit plus an EnvironmentFile.

The templates live in launch/ so an operator can read them. Every value from the plan or the command line is
inserted through rocm_dspark.launch.quoting for its target language; this module only decides which value goes where
and writes the files so that a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from shlex import quote  # install commands: the operator's shell is POSIX sh/bash

from rocm_dspark.atomic import write_files_atomic
from rocm_dspark.errors import UsageError
from rocm_dspark.inputs import read_text
from rocm_dspark.launch import compile_cache, launch_facts, quoting, warmup
from rocm_dspark.recipe import secret_env
from rocm_dspark.recipe.plan import Command, LaunchPlan
from rocm_dspark.recipe.vllm_args import emit

# The templates are package data next to this module (so wheels ship them).
LAUNCH_DIR = Path(__file__).resolve().parent / "templates"
FORMATS = ("shell", "systemd")
DEFAULT_USER = "vllm"
# Where the install commands put the launcher the unit runs: root-owned, never a world-writable --output (/tmp).
INSTALL_DIR = "/usr/local/libexec/rocm-dspark"
# Where the unit's EnvironmentFile= lives on the node: root-owned, never the generating host's --output. No `-`
# prefix in the unit: a missing file stops the start, so a unit never runs without its secrets.
ENV_DIR = "/etc/rocm-dspark"
UNIT_DIR = "/etc/systemd/system"
WATCHDOG_S = 120  # three /health polls of at most 5 s each fit in it
# `systemd-analyze security --offline=yes` of the generated unit (systemd 252), asserted by tests/test_launchers.py.
EXPOSURE = "2.0 OK"
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
_SECTION = re.compile(r"#@(if !?[a-z_]+|fi)")


@dataclass(frozen=True)
class LaunchFiles:
    """What write_launchers wrote; env_file_written is False when an existing env file was kept."""

    fmt: str
    name: str
    launcher: Path
    unit: Path | None = None
    env_file: Path | None = None
    env_file_written: bool = False
    install_commands: tuple[str, ...] = ()


def default_name(plan: LaunchPlan) -> str:
    """A unit and container name from the profile: lower case, [a-z0-9-] only."""
    return launch_facts.default_name(plan.profile)


def check_name(name: str) -> str:
    # Used as a file name, a systemd unit name, a StateDirectory and a docker container name; `up` applies it
    # before it runs anything (its --dry-run included).
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name) or ".." in name:
        raise UsageError(f"--name {name!r}: use letters, digits, '-', '_' or '.', starting with a letter or digit")
    return name


def _fill(template: str, values: dict[str, str], optional: frozenset[str] = frozenset()) -> str:
    """Replace {{KEY}} placeholders; every placeholder must have a value and every value a placeholder
    (except the `optional` ones, whose section a plan may leave out)."""
    used = set(_PLACEHOLDER.findall(template))
    missing, unused = used - values.keys(), values.keys() - used - optional
    if missing or unused:  # a template/code mismatch is a bug, not user input
        raise RuntimeError(f"template placeholders out of step: missing {sorted(missing)}, unused {sorted(unused)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _sections(filename: str, on: set[str]) -> str:
    """The template `filename`, keeping the lines between `#@if NAME` (or `#@if !NAME`) and `#@fi` only when NAME
    is (is not) in `on`; the marker lines go. So a launcher holds only the code its plan runs (sections nest)."""
    out: list[str] = []
    keep = [True]
    for line in (LAUNCH_DIR / filename).read_text(encoding="utf-8").splitlines(keepends=True):
        m = _SECTION.fullmatch(line.rstrip("\n"))
        if m and m.group(1) == "fi":
            if len(keep) == 1:
                raise RuntimeError("template: #@fi without #@if")
            keep.pop()
        elif m:
            name = m.group(1)[3:]
            keep.append(keep[-1] and ((name[1:] not in on) if name.startswith("!") else (name in on)))
        elif keep[-1]:
            out.append(line)
    if len(keep) != 1:
        raise RuntimeError("template: #@if without #@fi")
    return "".join(out)


def _modes(plan: LaunchPlan) -> tuple[str, tuple[str, ...]]:
    """The primary start's mode name and the fallback argv (empty when there is none)."""
    if plan.adaptive_verification:
        return "adaptive", tuple(plan.block_argv or ())
    return ("block" if plan.speculative_config else "no-spec"), ()


def _argv_lines(argv: tuple[str, ...], what: str) -> str:
    """One array element per line, except that a flag and its value share a line: the plan's typed flags
    (recipe/plan.py Command); a command from elsewhere (--server-json) by its words' shape."""
    if isinstance(argv, Command):
        groups = [[w] for w in argv.head] + [list(emit(f, v)) for f, v in argv.flags]
    else:
        # the program and its positional words (vllm serve MODEL) share the first line
        lead = next((i for i, w in enumerate(argv) if w.startswith("-")), len(argv))
        groups = [list(argv[:lead])] if lead else []
        after_flag = False
        for raw in argv[lead:]:
            if after_flag and not raw.startswith("-"):
                groups[-1].append(raw)
                after_flag = False
            else:
                groups.append([raw])
                after_flag = raw.startswith("-")
    return "\n".join("  " + " ".join(quoting.bash_word(w, what) for w in group) for group in groups)


def _state_root_chain() -> str:
    """launch_facts.STATE_ROOTS as the launcher's `elif` lines: <state root>/launch/$NAME."""
    lines = []
    for root in launch_facts.STATE_ROOTS:
        assert re.fullmatch(r"[A-Z_]+", root.variable) and re.fullmatch(r"[a-z0-9._/-]*", root.subdir)
        test = f"${{{root.variable}:-}} == /*" if root.absolute_only else f"-n ${{{root.variable}:-}}"
        path = f"${root.variable}" + (f"/{root.subdir}" if root.subdir else "")
        lines.append(f"elif [[ {test} ]]; then STATE_DIR={path}/launch/$NAME")
    return "\n".join(lines)


# Facts only a section uses (container, host, fallback): a launcher without that section leaves them out.
_SECTION_FACTS = frozenset(
    "DOCKER_RUN_FLAGS HF_HOME_MOUNT HF_HUB_MOUNT PASSED_ENV_FLAGS ADAPTIVE_REFUSALS MONO_REFUSAL PARTITION_ARGV"
    " SPLIT_PARTITION_RE GPU_GROUPS GPU_GROUPS_COMMA CACHE_CONTAINER_DIR TIMEOUT_START_S TIMEOUT_STOP_S WARM_BODY"
    " PRIMARY_WARM PRIMARY_WARM_SAYS FALLBACK_WARM FALLBACK_WARM_SAYS".split()
)


def _shared_facts() -> dict[str, str]:
    """The launcher's copies of launch_facts, as bash."""
    words = lambda values: " ".join(quoting.bash_word(v) for v in values)  # noqa: E731
    # The cache paths are ours, not user input: double quotes let bash expand $HF_HOME/$HOME at run time.
    mounts = (
        f"{launch_facts.HF_HOME_SH}:{launch_facts.HF_CACHE_CONTAINER}",
        f"{launch_facts.HF_HUB_CACHE_SH}:{launch_facts.HF_HUB_CONTAINER}",
    )
    assert not any(c in m for m in mounts for c in '"`')
    return {
        "DOCKER_RUN_FLAGS": words(launch_facts.DOCKER_RUN_FLAGS),
        "HF_HOME_MOUNT": f'"{mounts[0]}"',
        "HF_HUB_MOUNT": f'"{mounts[1]}"',
        "PASSED_ENV_FLAGS": " ".join(f"-e {quoting.env_name(n)}" for n in launch_facts.PASSED_ENV),
        "ADAPTIVE_REFUSALS": "\n".join("  " + quoting.bash_word(p) for p in launch_facts.ADAPTIVE_REFUSALS),
        "MONO_REFUSAL": quoting.bash_word(launch_facts.MONO_REFUSAL),
        "PARTITION_ARGV": words(launch_facts.PARTITION_ARGV),
        "SPLIT_PARTITION_RE": quoting.bash_word(launch_facts.SPLIT_PARTITION_RE),
        "STATE_ROOT_CHAIN": _state_root_chain(),
        "NUMA_BALANCING": quoting.bash_word(launch_facts.NUMA_BALANCING),
        "NUMA_BALANCING_OFF": quoting.bash_word(launch_facts.NUMA_BALANCING_OFF),
        "NUMA_BALANCING_FIX": quoting.bash_word(launch_facts.NUMA_BALANCING_FIX),
        "KFD": quoting.bash_word(launch_facts.KFD),
        "GPU_GROUPS": words(launch_facts.GPU_GROUPS),
        "GPU_GROUPS_COMMA": quoting.bash_word(",".join(launch_facts.GPU_GROUPS)),
        "CACHE_CAP_MB": str(compile_cache.CAP_MB),
        "CACHE_MIN_FREE_MB": str(compile_cache.MIN_FREE_MB),
        "CACHE_VARS": words(f"{n}={d}" for n, d in compile_cache.ENV_DIRS),
        "CACHE_CONTAINER_DIR": quoting.bash_word(compile_cache.CONTAINER_DIR),
    }


def render_launcher(
    plan: LaunchPlan,
    *,
    name: str | None = None,
    container: bool = False,
    ready_timeout_s: int = launch_facts.READY_TIMEOUT_S,
    stop_timeout_s: int = launch_facts.STOP_TIMEOUT_S,
    group_role: str = "single",
    ready_host: str = "",
    ready_port: int | None = None,
    group_name: str | None = None,
    env_file: str = "",
    systemd: bool = False,
    join_host: str = "",
    join_port: int | None = None,
    group_nodes: int = 1,
    iface: str = "",
    docker_run_flags: tuple[str, ...] | None = None,
) -> str:
    """The bash launcher for `plan` (rocm_dspark/launch/templates/launcher.sh.tmpl filled in); `env_file`: the 0600 file with
    the --env values and secrets (plan.secret_env names; the values are never in the launcher). A shell launcher
    hands it to docker (--env-file) or exports its raw lines; the unit's launcher finds the values in its
    environment (systemd's EnvironmentFile=) and only names the file in its messages.

    group_role: single | head | worker (rocm_dspark.recipe.strategies); a worker polls the head's readiness at
    ready_host:ready_port and follows the head's mode through ROCM_DSPARK_GROUP_DIR. join_host:join_port is the
    group's rendezvous (the head's --data-parallel-rpc-port or --master-port) over `iface`: a worker waits for
    it, the head for its group_nodes - 1 workers, each at most ROCM_DSPARK_JOIN_TIMEOUT_S
    (launch_facts.JOIN_TIMEOUT_S by default), then stops with one line."""
    if group_role not in ("single", "head", "worker"):
        raise UsageError(f"group role {group_role!r}: use single, head or worker")
    name = check_name(name or default_name(plan))
    if not plan.argv:
        raise UsageError("the plan has an empty argv; nothing to launch")
    if container and not plan.image:
        raise UsageError("--container needs the plan's image and this plan has none: run without --container")
    # An image without a digest is pinned by the launcher at its first start to the digest this host holds
    # (it never pulls; `launch --pull` and `up` pull once and pass the digest in plan.image).
    model_path = plan.model_path if container else None
    if model_path is not None:
        from rocm_dspark.images.mounts import check_model_path

        check_model_path(model_path)
    for what, value in (("--ready-timeout", ready_timeout_s), ("--stop-timeout", stop_timeout_s)):
        if not isinstance(value, int) or value <= 0:
            raise UsageError(f"{what} {value!r}: give a positive number of seconds")
    if not isinstance(group_nodes, int) or group_nodes <= 0:
        raise UsageError(f"group nodes {group_nodes!r}: give a positive number of nodes")
    primary_mode, fallback = _modes(plan)
    from rocm_dspark.runtime.client import base_url

    # Readiness is polled where the server answers: this node's (a wildcard bind over loopback), or a worker's head.
    url = base_url(ready_host, ready_port or plan.port) if ready_host else base_url(plan.host, plan.port)
    from rocm_dspark.images.pick import pinned

    pin = container and not pinned(plan.image)
    # The template's sections this launcher keeps (#@if NAME): everything else is left out.
    on = {"container" if container else "host", group_role, "single" if group_role == "single" else "group"}
    if fallback:
        on |= {"fallback"} | ({"group_mode", f"{group_role}_mode"} if group_role != "single" else set())
    # A group's nodes must run one argv: only a single server drops --monokernel on its own.
    on |= {"mono"} if launch_facts.runs_mono(plan.argv) and group_role == "single" else set()
    on |= {"refusals"} if on & {"fallback", "mono"} else set()
    on |= {"pin"} if pin else set()
    on |= {"model_path"} if model_path else set()
    on |= {"secrets"} if plan.secret_env else set()
    on |= {"systemd"} if systemd else set()  # the unit's launcher: systemd-notify and the watchdog
    on |= {"watch_head"} if group_role == "worker" and ready_host else set()  # a headless worker polls its head
    exports = "\n".join(f"export {k}={quoting.bash_word(v, f'env {k}')}" for k, v in plan.env.items())
    values = {
        "NAME": name,
        "NAME_WORD": quoting.bash_word(name),
        "HEADER_PROFILE": quoting.bash_comment(f"{plan.model_key} on {plan.gpu} ({plan.arch}), profile {plan.profile}"),
        "HEADER_STATUS": quoting.bash_comment(f"{plan.status} ({plan.status_date}), vLLM {plan.vllm_version}"),
        "READY_WHO": quoting.bash_comment(f"the group's head, {url}" if group_role == "worker" else url),
        "PROFILE": quoting.bash_word(plan.profile, "profile"),
        "SERVED_NAME": quoting.bash_word(plan.served_name, "served name"),
        "BASE_URL": quoting.bash_word(url, "ready URL"),
        "PRIMARY_ARGV": _argv_lines(plan.argv, "argv"),
        "ENV_NAMES": " ".join(quoting.env_name(k) for k in plan.env),
        "ENV_EXPORTS": exports,
        "READY_TIMEOUT_S": str(ready_timeout_s),
        "STOP_TIMEOUT_S": str(stop_timeout_s),
        # The unit's windows (render_unit): under systemd the launcher refuses a timeout they do not cover.
        "TIMEOUT_START_S": str(launch_facts.start_window_s(plan, ready_timeout_s)),
        "TIMEOUT_STOP_S": str(launch_facts.stop_window_s(stop_timeout_s)),
        "LOCK_HOLDER_EXTRA": " (its container: $NAME)" if container else "",
        **_shared_facts(),
    }
    if plan.secret_env:
        values.update(
            ENV_FILE=quoting.bash_word(env_file, "--env-file") if env_file else "''",
            SECRET_NAMES=" ".join(quoting.env_name(k) for k in plan.secret_env),
        )
    if fallback:
        values["FALLBACK_ARGV"] = _argv_lines(fallback, "block argv")
    values.update(_warm_values(plan, fallback))
    if not fallback:
        values["PRIMARY_MODE"] = primary_mode
    # The compile cache's key: the image digest (the launcher reads it after pinning) or this host's vLLM and torch.
    if container:
        requested = plan.build.image_tag if plan.build is not None and plan.build.image_tag else plan.image
        values.update(IMAGE=quoting.bash_word(plan.image, "image"), IMAGE_REQUESTED=_dq(requested, "image tag"))
        values["CACHE_KEY_SUFFIX"] = quoting.bash_word(compile_cache.suffix(plan.arch))
    else:
        values["CACHE_KEY"] = quoting.bash_word(compile_cache.host_key(plan.arch))
    if pin:
        from rocm_dspark.images.pick import repository

        bre = re.sub(r"([.\[\]*^$\\])", r"\\\1", repository(plan.image))  # a grep basic regex
        values["IMAGE_DIGEST_RE"] = quoting.bash_word(f'"{bre}@sha256:[0-9a-f]\\{{64\\}}"', "image")
    if model_path:
        values["MODEL_PATH"] = quoting.bash_word(model_path, "model path")
    group = ""
    if group_role != "single":
        values["JOIN_TIMEOUT_S"] = str(launch_facts.JOIN_TIMEOUT_S)
        group = _fill(
            _sections("launcher-group.sh.tmpl", on),
            {
                "GROUP_ROLE": group_role,
                "GROUP_NAME": check_name(group_name or name),
                "BASE_URL_TEXT": quoting.bash_comment(url),
                "JOIN_HOST": quoting.bash_word(join_host, "head address") if join_host else "''",
                "JOIN_PORT": str(int(join_port)) if join_port else "''",
                "GROUP_NODES": str(int(group_nodes)),
                "IFACE": quoting.bash_word(iface, "--iface") if iface else "''",
                "JOIN_TIMEOUT_S": values["JOIN_TIMEOUT_S"],
                "HTTP_PORT_HEX": f"{int(plan.port):04X}",
            },  # /proc/net/tcp's hex
            optional=frozenset({"HTTP_PORT_HEX", "GROUP_NODES"}),
        )  # a head's only
    values["GROUP_CODE"] = group.rstrip("\n")
    if docker_run_flags is not None:  # a CPU image (rocm_dspark.up.target): its own flags, no GPU devices
        values["DOCKER_RUN_FLAGS"] = " ".join(quoting.bash_word(v, "docker flag") for v in docker_run_flags)
    return _fill(_sections("launcher.sh.tmpl", on), values, optional=_SECTION_FACTS)


def _warm_values(plan: LaunchPlan, fallback) -> dict[str, str]:
    """The warm-up of each command the launcher may start (launch/warmup.py): batches, and the line it logs."""
    runs = {"PRIMARY": warmup.plan_warmup(plan.argv, plan.capture_size)}
    if fallback:
        runs["FALLBACK"] = warmup.plan_warmup(fallback, plan.capture_size)
    out = {"WARM_BODY": quoting.bash_word(warmup.body(plan.served_name, max(w.max_tokens for w in runs.values())))}
    for which, w in runs.items():
        out[f"{which}_WARM"] = " ".join(map(str, w.batches))
        out[f"{which}_WARM_SAYS"] = quoting.bash_word(w.says())
    return out


def _dq(value: str, what: str) -> str:
    """`value` inside a bash double-quoted string: only image references, which have no $ ` \\ or "."""
    if not re.fullmatch(r"[A-Za-z0-9._:/@+-]*", value):
        raise UsageError(f"{what} {value!r}: not an image reference")
    return value


def render_unit(
    plan: LaunchPlan,
    *,
    launcher_path: str,
    env_file_path: str,
    user: str = DEFAULT_USER,
    name: str | None = None,
    container: bool = False,
    ready_timeout_s: int = launch_facts.READY_TIMEOUT_S,
    stop_timeout_s: int = launch_facts.STOP_TIMEOUT_S,
) -> str:
    """The systemd unit whose ExecStart runs the launcher at `launcher_path` (an absolute path)."""
    name = check_name(name or default_name(plan))
    # Type=notify: the start phase lasts until the launcher reports ready, after each of its starts.
    start_window = launch_facts.start_window_s(plan, ready_timeout_s)
    starts = launch_facts.starts(plan)
    groups = "video render" + (" docker" if container else "")
    values = {
        "UNIT_NAME": f"{name}.service",
        "UNIT_NAME_STEM": name,
        "HEADER_PROFILE": quoting.bash_comment(f"{plan.model_key} on {plan.gpu}, profile {plan.profile}"),
        "DESCRIPTION": quoting.systemd_text(
            f"vLLM {plan.served_name} on {plan.gpu} (rocm-dspark profile {plan.profile}, {plan.status})"
        ),
        "EXEC_START": quoting.systemd_executable(launcher_path),
        "ENV_FILE": quoting.systemd_path(env_file_path, "--env-file"),
        "USER": quoting.unit_user(user),
        "SUPPLEMENTARY_GROUPS": groups,
        "TIMEOUT_START_S": str(start_window),
        "START_WINDOW": str(start_window),
        "READY_TIMEOUT_S": str(ready_timeout_s),
        "STOP_TIMEOUT_S": str(stop_timeout_s),
        "STARTS": "one start" if starts == 1 else f"up to {starts} starts",
        "START_LIMIT_INTERVAL_S": str(3 * start_window),
        "START_LIMIT_BURST": "3",
        # The launcher escalates to SIGKILL itself before systemd would.
        "TIMEOUT_STOP_S": str(launch_facts.stop_window_s(stop_timeout_s)),
        "RESTART_SEC": "60",
        "WATCHDOG_S": str(WATCHDOG_S),
        "EXPOSURE": EXPOSURE,
        # Container mode runs `docker`: the unit needs the daemon up first, and stops before it.
        "RUNTIME_AFTER": " docker.service\nRequires=docker.service" if container else "",
        "DOCKER_SOCKET_NOTE": " and the docker socket" if container else "",
    }
    # A promise of a fallback only in the unit of a launcher that has one (render_launcher's "fallback").
    on = {"fallback"} if _modes(plan)[1] else set()
    return _fill(_sections("service.tmpl", on), values)


def installed_launcher(name: str) -> str:
    """Where the unit's ExecStart finds the launcher (INSTALL_DIR; `name` is checked by check_name)."""
    return f"{INSTALL_DIR}/{check_name(name)}.sh"


def installed_env_file(name: str) -> str:
    """Where the unit's EnvironmentFile= is on the node (ENV_DIR; `name` is checked by check_name)."""
    return f"{ENV_DIR}/{check_name(name)}.env"


def install_argvs(files: LaunchFiles, user: str, root: str = "", here: bool = False) -> tuple[tuple[str, ...], ...]:
    """The commands an operator runs as root on the node to install and start the unit, as argv (install_commands
    prints them with sudo; `up` runs them). `root`: install into that directory instead of / (a throwaway root for
    tests or an image build): useradd --prefix and `systemctl --root` there, nothing started. The env file is
    copied only where the node has none yet, so a token put there on the node is never overwritten. `here`: the
    sources as ./<file>, for commands run on another node from the directory its copied files are in."""
    if files.unit is None:
        return ()
    unit_name = files.unit.name
    at = lambda path: root + path  # noqa: E731
    if root:
        who = f"grep -q {quote('^' + user + ':')} {quote(at('/etc/passwd'))} || useradd --prefix {quote(root)}"
    else:
        who = f"id -u {quote(user)} >/dev/null 2>&1 || useradd"
    who += f" --system --create-home --home-dir /var/lib/rocm-dspark --groups video,render {quote(user)}"
    src = lambda path: f"./{path.name}" if here else str(path)  # noqa: E731
    env_src, env_dst = quote(src(files.env_file)), quote(at(installed_env_file(files.name)))
    launcher_dst = at(installed_launcher(files.name))
    cmds = [
        ("sh", "-c", who),
        ("install", "-D", "-m", "0755", "-o", "root", "-g", "root", src(files.launcher), launcher_dst),
        ("sh", "-c", f"test -e {env_dst} || install -D -m 0600 -o root -g root {env_src} {env_dst}"),
        ("install", "-D", "-m", "0644", src(files.unit), at(f"{UNIT_DIR}/{unit_name}")),
    ]
    if root:
        return (*cmds, ("systemctl", f"--root={root}", "enable", unit_name))
    # --no-block: a Type=notify start lasts until vLLM is ready, which can take most of an hour.
    return (*cmds, ("systemctl", "daemon-reload"), ("systemctl", "enable", "--now", "--no-block", unit_name))


def install_commands(files: LaunchFiles, user: str, root: str = "", here: bool = False) -> tuple[str, ...]:
    """install_argvs as the lines an operator pastes (printed, never run here), each with `sudo`, and the log."""
    if files.unit is None:
        return ()
    follow = () if root else (f"journalctl -fu {quote(files.unit.name)}",)
    return (*(f"sudo {shlex.join(a)}" for a in install_argvs(files, user, root, here)), *follow)


def _check_output_dir(output_dir: Path) -> Path:
    if not output_dir.exists():
        raise UsageError(
            f"output directory {str(output_dir)!r} does not exist; create it first (mkdir -p) or pass another --output"
        )
    if not output_dir.is_dir():
        raise UsageError(f"--output {str(output_dir)!r} is not a directory")
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise UsageError(f"output directory {str(output_dir)!r} is not writable by this user; choose another --output")
    return output_dir.resolve()


def _check_env_file(path: Path) -> bool:
    """True when the env file must be written; an existing one is kept, but only with safe permissions."""
    if path.is_symlink():  # its mode, a chmod fix and the write would all act on the link's target
        raise UsageError(
            f"--env-file {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); pass the real "
            f"file's path or a new one"
        )
    if not path.exists():
        if not path.parent.is_dir():
            raise UsageError(
                f"--env-file {str(path)!r}: directory {str(path.parent)!r} does not exist; create it first"
            )
        return True
    if not path.is_file():
        raise UsageError(f"--env-file {str(path)!r} exists and is not a regular file")
    st = path.stat()
    if st.st_uid != os.geteuid():  # its install commands would copy another user's secrets into /etc
        raise UsageError(
            f"--env-file {str(path)!r} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
            f"pass an env file of your own, or chown it to yourself first"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UsageError(
            f"--env-file {str(path)!r} has mode {mode:04o}, readable by other users, and may hold tokens; run: chmod 600 {str(path)!r}"
        )
    return False


def _env_file_text(
    plan: LaunchPlan, path: Path, name: str, ready_timeout_s: int, stop_timeout_s: int, syntax: str, single: bool
) -> str | None:
    """The env file to write, every --env value set in it; None when an existing file needs no change. A new file
    is the skeleton (templates/env.tmpl: comments only, so no secret is ever generated or overwritten). `syntax`:
    "systemd" (the unit's EnvironmentFile=, which also sets the launcher's own settings) or "docker" (a shell
    launcher's file: docker --env-file reads it for a container, the launcher the same raw lines on a host).
    `single`: not a group's node (only a single server's launcher drops --monokernel, so only its file offers the
    retry knob)."""
    if not _check_env_file(path):  # exists, owner and mode checked
        existing = read_text(path, "--env-file", max_bytes=1 << 20)  # bounded, strict UTF-8, even when kept as is
        return secret_env.merge_env_file(existing, plan.secret_env, syntax) if plan.secret_env else None
    on = {syntax} | ({"fallback"} if _modes(plan)[1] else set())
    on |= {"mono"} if single and launch_facts.runs_mono(plan.argv) else set()
    values = {
        "NAME": name,
        "HEADER_PROFILE": quoting.bash_comment(f"profile {plan.profile}"),
        "READY_TIMEOUT_S": str(ready_timeout_s),
        "STOP_TIMEOUT_S": str(stop_timeout_s),
    }
    skeleton = _fill(_sections("env.tmpl", on), values, optional=frozenset({"READY_TIMEOUT_S", "STOP_TIMEOUT_S"}))
    return secret_env.merge_env_file(skeleton, plan.secret_env, syntax)


def write_all(files: list[tuple[Path, str, int]], what: str = "launcher files") -> None:
    """Write every file to a temp file in its directory, then rename them all; on failure remove the temps."""
    try:
        write_files_atomic(files)
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename or what}: {exc.strerror}; choose a writable --output") from exc


def write_launchers(
    plan: LaunchPlan,
    output_dir: str | os.PathLike,
    fmt: str = "shell",
    *,
    name: str | None = None,
    user: str | None = None,
    env_file: str | os.PathLike | None = None,
    container: bool = False,
    ready_timeout_s: int = launch_facts.READY_TIMEOUT_S,
    stop_timeout_s: int = launch_facts.STOP_TIMEOUT_S,
    group: dict | None = None,
    docker_run_flags: tuple[str, ...] | None = None,
) -> LaunchFiles:
    """Render and write the launcher files for `plan` into `output_dir`.

    shell: <name>.sh. systemd: <name>.sh, <name>.service and, unless it already exists, the env file
    (<name>.env, or `env_file`) with mode 0600; the unit names the env file's place on the node
    (installed_env_file), where the install commands copy it. All input is checked and all text rendered before anything is
    written; files land by rename, so an error leaves the directory as it was.
    """
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "shell" and user is not None:
        raise UsageError("--user belongs to --format systemd; the shell launcher runs as whoever starts it")
    name = check_name(name or default_name(plan))
    out = _check_output_dir(Path(output_dir))
    launcher = out / f"{name}.sh"
    env_path = Path(env_file).absolute() if env_file is not None else out / f"{name}.env"
    # Under systemd the launcher runs on the node, where the env file is the installed one.
    text = render_launcher(
        plan,
        name=name,
        container=container,
        ready_timeout_s=ready_timeout_s,
        stop_timeout_s=stop_timeout_s,
        env_file=str(env_path) if fmt == "shell" else installed_env_file(name),
        systemd=fmt == "systemd",
        docker_run_flags=docker_run_flags,
        **(group or {}),
    )
    single = (group or {}).get("group_role", "single") == "single"
    to_write = [(launcher, text, 0o755)]
    user = user or DEFAULT_USER
    unit = None
    if fmt == "systemd":
        unit = out / f"{name}.service"
        unit_text = render_unit(
            plan,
            launcher_path=installed_launcher(name),
            env_file_path=installed_env_file(name),
            user=user,
            name=name,
            container=container,
            ready_timeout_s=ready_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        to_write.append((unit, unit_text, 0o644))
    # A shell launcher's env file is read by docker (--env-file) in a container, by its raw-line loop on a host:
    # docker's syntax, and only where there are --env values. The unit's EnvironmentFile= always exists.
    syntax = "systemd" if unit else "docker"
    env_text = (
        _env_file_text(plan, env_path, name, ready_timeout_s, stop_timeout_s, syntax, single)
        if unit or plan.secret_env
        else None
    )
    if env_text is not None:
        to_write.append((env_path, env_text, 0o600))
    write_all(to_write)
    kept = env_path if unit or env_text is not None else None
    files = LaunchFiles(fmt, name, launcher, unit, kept, env_file_written=env_text is not None)
    return replace(files, install_commands=install_commands(files, user))
