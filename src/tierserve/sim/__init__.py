"""Cluster-scale simulator: the real scheduler, policies and KV manager driven by a cost-model
executor and a virtual clock."""
