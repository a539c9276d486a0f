"""Calibration: machine profiles, fitting them, and checking the simulator against the engine."""
