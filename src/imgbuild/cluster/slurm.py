"""The sbatch script of a cluster job (`sbatch(plan)`) for Slurm with pyxis/enroot: `srun --mpi=pmix
--container-image ...`, one task per device.

pyxis does not run the image's ENTRYPOINT (no sshd is needed: srun starts every rank through PMIx), and the image's
ENV wins over the script's exports unless `--container-env` names them: the script names every variable it exports
(NCCL_DEBUG, the launch line's defaults and its MCA settings as OMPI_MCA_* variables, PMIX_MCA_gds).

As AWS's nccl-tests sbatch scripts do: `--cpu-bind=none` (Slurm would otherwise bind each task to its share of the
cores, where the mpirun path runs `--bind-to none`), and PMIX_MCA_gds=hash (PMIx's shared-memory data store,
the default, fails between the host's PMIx server and the container's PMIx client when their versions differ).

NVLink across instances (GB200 NVL72 across trays, `JobPlan.mnnvl`): CUDA maps another node's GPU memory only
through an IMEX channel, which the driver does not create: "Failure to do so will result in dependent CUDA APIs
failing with an insufficient permission error" (NVIDIA's IMEX guide, "IMEX Channels",
https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/imexchannels.html: the default channel is
/dev/nvidia-caps-imex-channels/channel0, made with mknod and gone after a reboot). On Slurm, IMEX is set up per job
by a prolog that configures the IMEX service with the IP addresses of the job's nodes (AWS PCS, "Configure
UltraServer instances", https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-nvidia-imex.html: Slurm
25.05 or later, an AMI with the driver, CUDA and the nvidia-imex service enabled, the prolog on every node at the
path of slurm.conf's `Prolog`). The script says so, and a job of several nodes stops before its ranks start where a
node has no channel.

Every value in the script is quoted for the shell (shlex.quote) or is of a grammar with no character the shell
reads (recipe names, image references, instance types: validate.py), and comments hold no line break.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from imgbuild.blocks.cuda.driver import IMEX_CHANNEL_DIR
from imgbuild.core import imageref

if TYPE_CHECKING:
    from imgbuild.cluster.jobplan import JobPlan
    from imgbuild.image.launch import Launch

HEREDOC_END = "IMGBUILD_PROGRAM_END"
IMEX_CHANNEL = f"{IMEX_CHANNEL_DIR}/channel0"  # the default channel (see the module's docstring)
IMEX_DOCS = (
    "https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-nvidia-imex.html",
    "https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/imexchannels.html",
)
# Set for every rank, named in --container-env (see the module's docstring).
SRUN_ENV = {"PMIX_MCA_gds": "hash"}
SRUN_OPTIONS = ("--mpi=pmix", "--cpu-bind=none")


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
    parsed = imageref.parse(ref, where="--image")
    return f"{parsed.domain}#{ref.removeprefix(parsed.domain + '/')}" if parsed.domain else ref


def _image_tag(ref: str) -> str:
    """The tag (or the digest's hex) of an image reference; 'latest' without either."""
    parsed = imageref.parse(ref, where="--image")
    if parsed.digest:
        return parsed.digest.rpartition(":")[2][:12]
    return parsed.tag or "latest"


def _arch_comment(job: JobPlan) -> list[str]:
    """The image's CPU architecture, as a comment: Slurm has no standard feature for it (a node's features are the
    site's own names in slurm.conf), so the constraint is shown for sites that define one, not set."""
    platforms = ", ".join(f"linux/{a}" for a in job.arch)
    if len(job.arch) == 1:
        return [
            f"# Architecture: {platforms} only: submit to a partition of {job.arch[0]} nodes; where nodes carry it "
            f"as a feature: #SBATCH --constraint={job.arch[0]}"
        ]
    return [
        f"# Architectures: {platforms} (one image index). A squashfs file holds one of them, the one enroot imports",
        "# on its machine: import on (and run on) nodes of one architecture, or one file per architecture.",
    ]


def _imex_comment(job: JobPlan) -> list[str]:
    """What IMEX needs on Slurm, as comments (NVLink across instances only)."""
    if not job.mnnvl:
        return []
    return [
        "#",
        f"# NVLink across instances ({job.instance_type}): NCCL_MNNVL_ENABLE=1 and NCCL_NVLS_ENABLE=1 (AWS's GB200",
        "# nccl-tests job) make NCCL share GPU memory across nodes, which CUDA does only through an IMEX channel",
        f'# ({IMEX_CHANNEL}); without one, CUDA calls across trays fail with "insufficient permission".',
        "# IMEX is set up per job by a Slurm prolog that configures nvidia-imex with the IP addresses of the job's",
        "# nodes (AWS PCS: Slurm 25.05 or later, nvidia-imex enabled on the AMI, the prolog at slurm.conf's Prolog).",
        "# Keep the job's nodes in one UltraServer (one NVLink domain). See:",
        *(f"#   {url}" for url in IMEX_DOCS),
    ]


def _imex_check(job: JobPlan) -> list[str]:
    """Stop before the ranks start where a node of a multi-node NVLink job has no IMEX channel."""
    if not job.mnnvl or job.nodes < 2:
        return []
    return [
        "",
        "# Every node needs the job's IMEX channel (the prolog makes it) before ranks share GPU memory across nodes.",
        f'if ! srun --ntasks="${{SLURM_JOB_NUM_NODES}}" --ntasks-per-node=1 test -c {IMEX_CHANNEL}; then',
        f'    echo "a node of this job has no IMEX channel ({IMEX_CHANNEL}): set up IMEX in a Slurm prolog '
        f'(see the top of this script, {IMEX_DOCS[0]})" >&2',
        "    exit 1",
        "fi",
    ]


def sbatch(job: JobPlan) -> str:
    """The sbatch script of a slurm job: comments saying how to import the image and submit, #SBATCH lines, the
    exports and one srun line."""
    q = shlex.quote
    squashfs = f"imgbuild-{job.recipe}-{_image_tag(job.image)}.sqsh"
    defaults = dict(job.launch.env_defaults)
    exports = {k: v for k, v in job.env if k not in defaults}
    # Ranks that srun starts read Open MPI's settings from OMPI_MCA_* variables, not from mpirun's --mca (which
    # wins over the environment under mpirun, so it does here too).
    exports.update((f"OMPI_MCA_{k}", v) for k, v in mca_pairs(job.launch))
    exports.update((k, v) for k, v in SRUN_ENV.items() if k not in defaults)
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
        + (f" | {job.report_command}" if job.runs_all_reduce_perf else ""),
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.slots}",
        "#SBATCH --exclusive",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --output=%x-%j.out",
    ]
    if job.accelerator == "nvidia":
        lines.append(f"# Where GPUs are a Slurm GRES (AWS ParallelCluster): #SBATCH --gpus-per-node={job.devices}")
    lines += _arch_comment(job)
    lines += _imex_comment(job)
    lines += ["set -euo pipefail", ""]
    if job.image_pushed:
        lines.append(f"IMAGE=${{IMGBUILD_IMAGE:-{q(pyxis_image(job.image))}}}")
    else:
        lines += [
            f"IMAGE=${{IMGBUILD_IMAGE:-${{SLURM_SUBMIT_DIR:-$PWD}}/{squashfs}}}",
            'if [[ "${IMAGE}" == /* && ! -f "${IMAGE}" ]]; then',
            '    echo "no ${IMAGE}: import the image first (enroot import, see the top of this script)" >&2',
            "    exit 1",
            "fi",
        ]
    lines += _imex_check(job)
    lines.append("")
    for k, v in exports.items():
        lines.append(f"export {k}={q(v)}")
    if job.launch.env_defaults:
        lines.append("# The launch line's defaults (a value already set wins).")
        for k, v in job.launch.env_defaults:
            lines += [f'[ -n "${{{k}:-}}" ] || {k}={q(v)}', f"export {k}"]
    # A multi-line argument (the check programs) goes into a variable from a quoted here-document, readable as it is.
    program: list[str] = []
    texts = 0
    literal = False  # a quoted word that shellcheck asks about: '$HOME' does not expand, a trailing '\'
    for arg in job.program:
        if "\n" in arg and HEREDOC_END not in arg.splitlines():
            texts += 1
            var = f"PROGRAM_{texts}"
            lines += ["", f"{var}=$(cat <<'{HEREDOC_END}'", arg.rstrip("\n"), HEREDOC_END, ")"]
            program.append(f'"${{{var}}}"')
        else:
            program.append(q(arg))
            literal = literal or any(c in arg for c in "$`\\")
    lines.append("")
    if literal:
        lines += ["# The command's words are passed as written.", "# shellcheck disable=SC2016,SC1003"]
    srun = [
        f"srun {' '.join(SRUN_OPTIONS)}",
        '--container-image="${IMAGE}"',
        f"--container-env={','.join(names)}" if names else "",
        "--no-container-mount-home",
        " ".join(program),
    ]
    lines.append(" \\\n    ".join(part for part in srun if part))
    return "\n".join(lines) + "\n"
