"""The Kubernetes side: list and watch into the core, the API client, node protobuf, API
errors, the Lease, the webhook's certificate, GPU topology labels and topology levels."""
