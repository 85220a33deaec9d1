"""The plan `up` serves, chosen once per run and again after new evidence (the image pulled, records written):
the recipe's plan through the gate (rocm_dspark.usecase.launch_plan), on the image's software where vLLM runs in
the image (container modes), on this Python's otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

from rocm_dspark.errors import UsageError
from rocm_dspark.images import pull
from rocm_dspark.inputs import parse_json, read_text
from rocm_dspark.probe import software
from rocm_dspark.recipe import options as recipe_options
from rocm_dspark.recipe.plan import LaunchPlan, Selection
from rocm_dspark.up.steps_common import write_json
from rocm_dspark.usecase.launch_plan import plan_for


class Chosen(NamedTuple):
    selection: Selection
    plan: LaunchPlan
    why: str  # why its verification mode is what it is (the plan's adaptive note)
    software: dict | None  # {"image", "id", "facts"} the gate read, or None: this Python's
    software_note: str | None  # why the gate could not read the image's software


def selection_opts(run) -> dict:
    """The selection options as `up` resolves them: the heaviest --concurrency level (the one the plan's workload
    rules size for), the detected GPU, and the target's defaults."""
    opts = dict(run.options.selection)
    if run.options.concurrency and not opts.get("concurrency"):
        opts["concurrency"] = max(run.options.concurrency)
    if gpu := opts.get("gpu") or (run.outputs.get("detect") or {}).get("gpu") or run.target.default_gpu:
        opts["gpu"] = gpu
    return opts


def chosen(run) -> Chosen:
    """The plan once chosen (the library path `recipe` uses); chosen now if it is not yet."""
    if run.chosen is None:
        opts = selection_opts(run)
        catalog, selection, plan = plan_for(opts, run.catalog)
        soft, note = image_software(run, plan.image)
        if soft is not None:  # the image's own vLLM decides the build the plan is for (resolve: --image)
            first = plan.image
            catalog, selection, plan = plan_for({**opts, "image_software": soft["facts"]}, catalog, soft=soft["facts"])
            if plan.image != first:
                soft, note = image_software(run, plan.image)
        why = next((n.text for n in plan.notes if n.topic.startswith("adaptive")), "")
        run.chosen = Chosen(selection, plan, why, soft, note)
    return run.chosen


def gate_software(run) -> dict | None:
    """The software facts the gate read for this plan (an image's), or None (this Python's)."""
    found = chosen(run).software
    return found["facts"] if found else None


def selection_argv(run, exclude: tuple[str, ...] = ()) -> list[str]:
    """The selection as command-line words (rocm_dspark.recipe.options); the state dir only when given."""
    return recipe_options.selection_argv(
        selection_opts(run), exclude=exclude if run.options.state_dir_flag else (*exclude, "state_dir")
    )


def image_software(run, image: str | None) -> tuple[dict | None, str | None]:
    """({"image", "id", "facts"} of the plan's image when vLLM runs in it (container modes) and it is pulled, or
    None: the gate then reads this Python; why not, or None). Cached by image ID in the up directory; --dry-run
    runs nothing, so it reads only the cache."""
    if run.mode == "foreground" or not image:
        return None, None
    cache = run.dir / "image-software.json"
    try:  # bounded, regular files only, strict JSON
        cached = parse_json(read_text(cache, "image software"), "image software")
    except UsageError:
        cached = {}
    tool = pull.runtime()
    if tool is None or run.options.dry_run:
        hit = cached if cached.get("image") == image else None
        return hit, None if hit else "the image's software is read after it is pulled"
    ident, said = pull.image_id(tool, image)
    if ident is None:
        return None, (
            f"{image} is not pulled yet ({tool}: {said}), so the gate reads this Python's software; "
            "rerun `up` after the image step"
        )
    if cached.get("id") == ident and cached.get("image") == image:
        return cached, None
    try:
        facts = software.in_image(tool, image)
    except RuntimeError as exc:
        return None, f"cannot read the image's software ({exc}); the gate reads this Python's"
    found = {"image": image, "id": ident, "facts": facts}
    write_json(run, cache.name, found)
    return found, None
