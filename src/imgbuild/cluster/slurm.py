"""The sbatch script of a cluster job (`sbatch(plan)`) for Slurm with pyxis/enroot: `srun --mpi=pmix
--container-image ...`, one task per device.

pyxis does not run the image's ENTRYPOINT (no sshd is needed: srun starts every rank through PMIx), and the image's
ENV wins over the script's exports unless `--container-env` names them: the script names every variable it exports
(NCCL_DEBUG, the launch line's defaults and its MCA settings as OMPI_MCA_* variables).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imgbuild.cluster.jobplan import JobPlan
    from imgbuild.launch import Launch

HEREDOC_END = "IMGBUILD_PROGRAM_END"


def mca_pairs(launch: Launch) -> list[tuple[str, str]]:
    """The `--mca KEY VALUE` settings of the launch line, in its order."""
    args, pairs = list(launch.mpirun), []
    for i, arg in enumerate(args):
        if arg == "--mca" and i + 2 < len(args):
            pairs.append((args[i + 1], args[i + 2]))
    return pairs


def pyxis_image(ref: str) -> str:
    """An image reference as pyxis and enroot write it: `REGISTRY#REPOSITORY:TAG` (the registry host, when there
    is one, is separated by '#', not '/')."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def sbatch(job: JobPlan) -> str:
    """The sbatch script of a slurm job: comments saying how to import the image and submit, #SBATCH lines, the
    exports and one srun line."""
    q = shlex.quote
    squashfs = f"imgbuild-{job.recipe}-{job.image.rsplit(':', 1)[-1]}.sqsh"
    defaults = dict(job.launch.env_defaults)
    exports = {k: v for k, v in job.env if k not in defaults}
    # Ranks that srun starts read Open MPI's settings from OMPI_MCA_* variables, not from mpirun's --mca (which
    # wins over the environment under mpirun, so it does here too).
    exports.update((f"OMPI_MCA_{k}", v) for k, v in mca_pairs(job.launch))
    names = [*exports, *defaults]
    lines = [
        "#!/bin/bash",
        f"# sbatch script for imgbuild recipe '{job.recipe}' on Slurm with pyxis/enroot: {job.nodes} node(s)"
        + (f" of {job.instance_type}" if job.instance_type else "")
        + f", {job.slots} task(s) per node.",
        f"# Runs {job.program_about}.",
        "#",
    ]
    if job.image_pushed:
        lines += [
            f"# Image: {job.image}. pyxis imports it on every node at every job; import it once into a squashfs",
            "# file on a shared filesystem and pass that file instead (IMGBUILD_IMAGE=/fsx/... sbatch THIS):",
            f"#   enroot import -o /fsx/{squashfs} docker://{pyxis_image(job.image)}",
        ]
    else:
        lines += [
            f"# Image: {job.image} (the local build). Import it once into a squashfs file on a shared filesystem,",
            "# on the machine that built it, then submit from that folder (or set IMGBUILD_IMAGE=/path/to/file):",
            f"#   enroot import -o {squashfs} dockerd://{job.image}",
            f"# or, once pushed (imgbuild push {job.recipe}): enroot import -o {squashfs} docker://REGISTRY#REPO:TAG",
        ]
    lines += [
        "#",
        "# pyxis does not run the image's ENTRYPOINT (no sshd is needed: srun starts every rank through PMIx), and",
        "# the image's ENV wins over this script's exports unless --container-env names them: it names them all.",
        f"# Submit: sbatch THIS; follow: tail -f {job.name}-JOBID.out"
        + (f" | imgbuild cluster report --nodes {job.nodes}" if job.runs_all_reduce_perf else ""),
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.slots}",
        "#SBATCH --exclusive",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --output=%x-%j.out",
    ]
    if job.accelerator == "nvidia":
        lines.append(f"# Where GPUs are a Slurm GRES (AWS ParallelCluster): #SBATCH --gpus-per-node={job.devices}")
    lines += ["set -euo pipefail", ""]
    if job.image_pushed:
        lines.append(f"IMAGE=${{IMGBUILD_IMAGE:-{pyxis_image(job.image)}}}")
    else:
        lines += [
            f"IMAGE=${{IMGBUILD_IMAGE:-${{SLURM_SUBMIT_DIR:-$PWD}}/{squashfs}}}",
            'if [[ "${IMAGE}" == /* && ! -f "${IMAGE}" ]]; then',
            '    echo "no ${IMAGE}: import the image first (enroot import, see the top of this script)" >&2',
            "    exit 1",
            "fi",
        ]
    lines.append("")
    for k, v in exports.items():
        lines.append(f"export {k}={q(v)}")
    if job.launch.env_defaults:
        lines.append("# The launch line's defaults (a value already set wins).")
        lines += job.launch.shell_defaults().rstrip("\n").split("\n")
    # A multi-line argument (the check programs) goes into a variable from a quoted here-document, readable as it is.
    program: list[str] = []
    texts = 0
    for arg in job.program:
        if "\n" in arg and HEREDOC_END not in arg.splitlines():
            texts += 1
            var = f"PROGRAM_{texts}"
            lines += ["", f"{var}=$(cat <<'{HEREDOC_END}'", arg.rstrip("\n"), HEREDOC_END, ")"]
            program.append(f'"${{{var}}}"')
        else:
            program.append(q(arg))
    lines.append("")
    srun = [
        "srun --mpi=pmix",
        '--container-image="${IMAGE}"',
        f"--container-env={','.join(names)}" if names else "",
        "--no-container-mount-home",
        " ".join(program),
    ]
    lines.append(" \\\n    ".join(part for part in srun if part))
    return "\n".join(lines) + "\n"
