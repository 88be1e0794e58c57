"""The sagemaker block: sagemaker.py (its options, pin rule, contribution and checks), sagemaker.j2 (its Dockerfile
fragments), files/ (its scripts)."""

from imgbuild.blocks.sagemaker.sagemaker import (
    BLOCK,
    CODE_DIR,
    FAILURE,
    JOB_DONE,
    TREE,
    SageMaker,
)

__all__ = [
    "BLOCK",
    "CODE_DIR",
    "FAILURE",
    "JOB_DONE",
    "TREE",
    "SageMaker",
]
