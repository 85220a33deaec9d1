"""Writing a plan out: plan in, files out.

render.py          a plan as shell, JSON or `docker run` text (notes short, or in full with --explain)
render_cluster.py  every node's commands as shell or JSON
launchers.py       the bash launcher, systemd unit and env file, from templates/
launch_facts.py    facts the Python side and the generated launcher share, defined once
launch_state.py    what a launcher wrote in its state directory, read back for up, status and validate
launch_group.py    per-node launchers of a multi-node group, which fall back together
k8s.py             Kubernetes manifests (Deployment, LeaderWorkerSet, Service)
observability.py   Prometheus scrape config, recording and alert rules, Grafana dashboard
compile_cache.py   the compile cache kept across starts: key, paths, environment, mounts
warmup.py          the requests a launcher sends before it says ready
quoting.py         quoting for bash words, systemd specifiers and paths
aux_units.py       the readiness server's and the canary's systemd units
templates/         launcher.sh.tmpl (+ launcher-group.sh.tmpl for multi-node), service.tmpl, env.tmpl
"""
