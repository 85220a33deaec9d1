"""`rocm-dspark up`: from a bare MI300-class node to a validated endpoint, resumably.

A thin orchestrator over the library: it calls the recipe resolver, the launcher writer, the probe and
validation; it never re-implements them. Modules:

    steps         the ten steps, each a call into the library, with its inputs and its --dry-run actions
    prove         step 8: adaptive verification proved on the service (live level, A/B), in as few loads as it can
    summary       step 10
    runner        runs the steps in order (resume, redo on changed inputs, dry run, Ctrl-C) on the values they share
    target        what is brought up, chosen once: a node, or the local-cpu test target and its facts
    choice        the plan, chosen once through the gate (on the image's software), again after new evidence
    serve         what each command's start runs, from the run (service/start.py starts it and records the load)
    ready_server  the readiness server `up` leaves beside the service (GET /ready)
    canary        the canary's systemd timer `up` installs (`rocm-dspark canary` is service/canary.py)
    steps_common  what the step modules share: StepFailed, the up directory's files, the toolkit's wheel
"""
