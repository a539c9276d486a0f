"""Workloads shared by the simulator and the load generator: classes, lengths, arrivals."""
