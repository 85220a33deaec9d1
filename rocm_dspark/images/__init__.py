"""Images that exist: which tag a plan runs, what this host's registry holds, and the digest it runs.

Modules (one job each):
    pick      catalog + this host's registry answers -> the image a plan runs (pure; on the `recipe` path)
    cache     the answers, a small JSON file in the state dir (read on the `recipe` path; json and os only)
    registry  asks a registry: Docker Registry HTTP API v2 (httpx, Docker Hub's anonymous token) or skopeo
    report    the library behind `rocm-dspark images`
    wheel     this toolkit's wheel, built from its source tree, for an image to install (`up`)
The `recipe` path imports pick and cache only; registry is imported by `images`, `up` and `launch --pull`.
"""
