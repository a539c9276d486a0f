"""The single-engine simulator: the real scheduler against a cost model, on a virtual clock."""
