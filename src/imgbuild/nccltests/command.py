"""How all_reduce_perf is run: the one command line that `imgbuild cluster job`'s jobs and the nccl-tests check of
`verify --nodes` and `cluster test` run, so that what the checks measure is what the jobs measure."""

from __future__ import annotations

from imgbuild.nccltests import expected


def args(instance_type: str | None) -> tuple[str, ...]:
    """all_reduce_perf's arguments for a run on `instance_type` (None: not known): -e is 1 GiB, or the largest size
    the verdict judges for that instance type when it is larger (`expected.max_judged_size`: 16 GiB on p5 and
    later), rounded up to a power of two so that the doubling from -b 8 reaches it."""
    end = max(1 << 30, expected.max_judged_size(instance_type))
    end = 1 << (end - 1).bit_length()
    return ("-b", "8", "-e", expected.size_option(end), "-f", "2", "-g", "1")


def all_reduce_perf(prefix: str | None, instance_type: str | None) -> tuple[str, ...]:
    """all_reduce_perf and its arguments (`args`), from the image's nccl_tests prefix (the manifest's; None: the
    block's default)."""
    from imgbuild.blocks.nccl_tests import PREFIX

    return (f"{prefix or PREFIX}/all_reduce_perf", *args(instance_type))
