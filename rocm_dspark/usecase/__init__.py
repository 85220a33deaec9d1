"""The use case every command shares, above recipe/ and probe/ (which never import it):

launch_plan.py  option values -> Selection (recipe.selection) -> LaunchPlan (recipe.resolve) -> the Verdict,
                applied last; and the same for a group of nodes
verdict.py      the one verdict: the probe gate's proof and the payoff composed, in one vocabulary of states
"""
