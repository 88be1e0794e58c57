"""What imgbuild does for the clusters its images run on: `imgbuild cluster ...`.

`report`: read an nccl-tests log (NCCL_DEBUG=INFO) and say whether the run used EFA, ran the expected NCCL, got
correct results and reached the bus bandwidth published for that instance type and node count.
"""
