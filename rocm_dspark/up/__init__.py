"""`rocm-dspark up`: from a bare MI300-class node to a validated endpoint, resumably.

A thin orchestrator over the library: it calls the recipe resolver, the launcher writer, the probe and
validation; it never re-implements them. Modules:

    steps    the ten steps, each a call into the library, with its inputs and its --dry-run commands
    runner   runs the steps in order (resume, redo on changed inputs, dry run, Ctrl-C) on the values they share
    choice   the plan, chosen once through the gate (on the image's software), again after new evidence
    prereq   step 3's prerequisite checks, each failure with its fix
    summary  step 10
    serve    what each command's start runs, from the run (service/start.py starts it and records the load)
    ready_server, canary: the readiness server and the canary's timer `up` leaves beside the service
"""
