"""Synthetic host-fit tables, generated from known parameters by the model's own predict_run_tok_s (recovering them
checks the fit, not the physics): tests/test_host_fit.py."""

from __future__ import annotations

import csv

from rocm_dspark.planner import host_fit as H
from rocm_dspark.planner.calibration import StepParams, physics_for, predict_run_tok_s
from rocm_dspark.recipe.catalog import load_catalog

CAT = load_catalog()


MODEL = CAT.find_model("V4.1-Flash")


TRUE = StepParams(6.0, 0.0, 0.15, 2.0, adaptive_ms=0.5, rho=0.0, eager_launch_ms=0.3, eager_per_token_ms=0.02)


HEADER = ",".join(H.COLUMNS)


def synthetic_rows(gpu: str, params=TRUE, capture=512, concurrencies=(4, 16, 64, 128, 256)):
    g = CAT.find_gpu(gpu)
    physics = physics_for(MODEL, g, MODEL.profiles[g.key].tp, 0.8)
    rows = []
    for c in concurrencies:
        for arm, k, ad, al in (("none", 0, False, 1.0), ("k5", 5, False, 3.5), ("k3", 3, False, 2.8),
                               ("av", 5, True, 3.0)):
            r = {"arm": arm, "k": k, "adaptive": ad, "concurrency": c, "capture_size": capture, "acceptance_length": al}
            r["output_tok_s"] = round(predict_run_tok_s(params, physics, r), 4)
            rows.append(r)
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(H.COLUMNS))
        w.writeheader()
        w.writerows(rows)
    return path


def synthetic_table(tmp_path, gpu: str):
    return write_csv(tmp_path / f"runs_{gpu}.csv", synthetic_rows(gpu))


def state(tmp_path):
    s = tmp_path / "state"
    s.mkdir(mode=0o700, exist_ok=True)
    return s


def blog_rows(capture: int, concurrencies=(1, 16, 32, 64), arms=(("none", 0), ("k5", 5), ("k6", 6), ("k7", 7)),
              acceptance_length=3.51):
    """A host table at c1/16/32/64 x K=0/5/6/7 from public measurements: the vLLM blog's Figure 3 run at this
    capture size (recipes/step_cost.yaml capture_evidence, read from its SVG). The blog publishes no acceptance
    length: every K gets the model's golden 3.51 (an assumption, said in docs/calibration.md)."""
    from rocm_dspark.planner.calibration import load_data

    ev = load_data()["capture_evidence"]["vllm_blog_b300"]
    run = next(r for r in ev["runs"] if r["max_cudagraph_capture_size"] == capture)
    return [{"arm": arm, "k": k, "adaptive": False, "concurrency": c, "capture_size": capture,
             "output_tok_s": run["output_tok_s"][arm][ev["concurrency"].index(c)],
             "acceptance_length": acceptance_length if k else 1.0} for c in concurrencies for arm, k in arms]
