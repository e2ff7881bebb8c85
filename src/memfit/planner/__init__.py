"""The planner: the search for the fastest technique mix that fits a GPU, the max batch and
max sequence limits, the step-time cost model, and the rendering of plans.

May import: `memfit.report` and every package below it.
"""
