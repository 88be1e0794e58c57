"""What imgbuild does for the clusters its images run on; `imgbuild cluster ...` (cli/cluster.py) is its command line.

- jobs.py: a ready-to-apply job for a recipe's image (jobplan.py decides it; k8s.py, slurm.py write it);
- live.py: the multi-node checks (nodechecks.py) on containers already running on hosts, over ssh;
- plot.py: an nccl-tests verdict's bus bandwidth against message size.

What this package shares with `imgbuild verify` about nccl-tests (the log, the verdict, the published bandwidth, the
command line) is `imgbuild.nccltests`.
"""
