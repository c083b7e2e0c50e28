"""Placement: capacity as the planner sees it (``capacity``: bound usage, reservations and
nominations together) and the whole-gang planner over any such view (``planner``), which the
rules, preemption's search and the what-if all run unchanged.
"""
