"""The fleet simulator: replicas, the ingress queue and autoscaling."""
