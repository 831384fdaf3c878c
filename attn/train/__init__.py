"""Training: the loop, stacks of runs trained as one computation, the figures a run draws as it ends,
and a run's lifecycle (create, resume, extend, fork, execute). Knows nothing of analysis or reports."""
