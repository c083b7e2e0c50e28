"""A real Kubernetes control plane on one machine, for tests, demos and benchmarks.

etcd, kube-apiserver, the stock kube-scheduler and KWOK (simulated nodes), all built from Go
modules by ``hack/build-bins.sh``, started on 127.0.0.1 ports and stopped by PID.
"""
