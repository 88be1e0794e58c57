"""imgbuild: container images for multi-node deep-learning training on AWS."""

__version__ = "0.1.0"
