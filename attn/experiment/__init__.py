"""Experiments: the experiment file (its grid, cells and report spec), the sweep that runs its cells,
and verify, which runs it again in float64 and under a second BLAS kernel."""
