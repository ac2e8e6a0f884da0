"""Sweeps: one run per point of a grid over run options, and what they add up to.

``spec`` is the grid (SweepSpec, points, the reproduce command); ``execute`` runs the points
(serially, in a process pool or on Ray) into a sweep folder; ``table`` makes sweep.csv, SLO
verdicts and the best points; ``plots`` and ``report`` draw and write report.md / report.html.
"""
