"""The use case every command shares, above recipe/ and probe/ (which never import it):

  launch_plan.py  option values -> Selection (recipe.selection) -> LaunchPlan (recipe.resolve) -> the probe
                  gate's Verdict (probe.gate, probe.payoff), applied last; and the same for a group of nodes
"""
