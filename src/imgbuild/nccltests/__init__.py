"""What `imgbuild verify --nodes`, `imgbuild cluster test`, `cluster job` and `cluster report` share about NVIDIA's
nccl-tests: how all_reduce_perf is run (command.py), reading its log (log.py), the published bus bandwidth it is
held to (expected.py, bandwidth.yaml) and the verdict on a run (verdict.py).

Pure functions over text and data, no I/O but reading the shipped table. This package sits below verify and
cluster, which both use it, and imports nothing from them or from the command line.
"""
