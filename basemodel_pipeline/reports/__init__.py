"""Per-scenario HTML reports (metric table vs baselines, curves, training history)."""
