"""Lockstep's edge: HTTP routes and Kubernetes adapters around the pure core."""
