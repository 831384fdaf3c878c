"""What people read: comparisons of runs, and experiment reports with their figures and generated
conclusion."""
