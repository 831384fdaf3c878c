"""Everything that reads or writes a run directory: its files, arrays and checkpoints, locks and the
process identity behind them, and a run's state built fresh or restored. Knows nothing of training."""
