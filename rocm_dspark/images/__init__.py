"""Images that exist: which tag a plan runs, what this host's registry holds, and the digest it runs (docs/layout.md
names the modules). The `recipe` path imports pick and cache only; registry is imported by `images`, `up` and
`launch --pull`.
"""
