"""Verify's checks that run a program under the image's own launch line (the manifest's mpirun line, the nccl-tests
command): they need the floors above the blocks (the image's manifest, nccl-tests' parser and verdict, the node
checks' mpirun rule), so they live here and register with the block they check. verify imports this module.
"""

from __future__ import annotations

import shlex

from imgbuild.blocks.cuda import driver
from imgbuild.checks.context import CONTAINER, CheckContext
from imgbuild.checks.registry import check
from imgbuild.checks.results import CheckResult
from imgbuild.checks.verdicts import fail, passed, skip
from imgbuild.image.manifest import Manifest
from imgbuild.nccltests import command, verdict
from imgbuild.nccltests.log import parse
from imgbuild.verify.nodesession import launched, mpirun_argv

LOADED_TIMEOUT_S = 300  # all_reduce_perf on every GPU of the host, sizes to 1 GiB


@check("aws-ofi-nccl-loaded", "aws_ofi_nccl", scopes=CONTAINER)
def aws_ofi_nccl_loaded(ctx: CheckContext) -> CheckResult:
    """On a GPU: all_reduce_perf under the image's mpirun line with NCCL_DEBUG=INFO loads the plugin and NCCL uses it.

    Read with the nccl-tests log parser and judged by its verdict (nccltests.log, nccltests.verdict). Where no EFA
    device is passed in (and --expect-efa is not given), NCCL falling back to sockets is a skip with that reason,
    never a pass; NCCL not loading the plugin at all is a failure anywhere.
    """
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    if not ctx.has("nccl_tests"):
        return skip("nccl-tests is not in the image: nothing to run NCCL with")
    data = ctx.manifest or ctx.expected_manifest
    if data is None:
        return skip("no manifest in the image and no lock: the image's mpirun line is not known")
    manifest = Manifest.model_validate(data)
    smi = ctx.run("nvidia-smi -L")
    gpus = max(1, len([line for line in smi.out.splitlines() if line.startswith("GPU ")]))
    program = ["env", "NCCL_DEBUG=INFO", *command.all_reduce_perf(ctx.details("nccl_tests").prefix, None)]
    hostfile = "/tmp/imgbuild-verify-hostfile"
    argv = mpirun_argv(manifest, hostfile=hostfile, ranks=gpus, program=program, wdir="/tmp")
    line = shlex.join(launched(manifest, argv))
    ran = ctx.run(f"printf 'localhost slots={gpus}\\n' > {hostfile} && {line} 2>&1", timeout_s=LOADED_TIMEOUT_S)
    efa = bool(ctx.efa_devices or ctx.expect_efa)
    expect = verdict.Expect.of_pins(ctx.version, nodes=1, efa=efa)
    rep = verdict.judge(parse(ran.out + ran.err), expect, source="all_reduce_perf")
    crit = {c.name: c for c in rep.criteria}
    net = rep.log.network
    plugin = f"aws-ofi-nccl {net.plugin_version}" if net.plugin_version else None
    pinned = ctx.version("aws_ofi_nccl")
    expected = f"NCCL loads aws-ofi-nccl{f' {pinned}' if pinned else ''} and uses it"
    details = {
        "command": line,
        "exit_code": ran.rc,
        "criteria": {c.name: f"{c.status}: {c.reason}" for c in rep.criteria},
    }
    found = f"{plugin or 'no aws-ofi-nccl line'}; network {', '.join(net.used) or 'not named'}"
    if not ran.ok:
        return fail(f"all_reduce_perf exit {ran.rc}: {ran.why()}", expected, found, **details)
    if net.missing or plugin is None:
        missing = "; ".join(net.missing[:2]) or "the log has no 'NET/OFI Initializing aws-ofi-nccl' line"
        return fail(f"NCCL did not load the plugin: {missing}", expected, found, **details)
    for name in ("NCCL version", "aws-ofi-nccl version"):
        if name in crit and crit[name].status == "FAIL":
            return fail(crit[name].reason, expected, found, **details)
    # which network NCCL selected: the verdict does not judge it on one node (nothing crossed a network), this check
    # does, since NCCL selects it when it starts
    network = verdict.network_used(net)
    if network.status != "PASS":
        if efa:
            return fail(network.reason, expected, found, **details)
        used = ", ".join(net.used) or "no named network"
        return skip(f"no EFA device here: {plugin} loaded, but NCCL used {used} ({network.reason})", expected,
                    **details)  # fmt: skip
    if crit["results"].status == "FAIL":
        return fail(crit["results"].reason, expected, found, **details)
    return passed(expected, found, network.reason, **details)


@check("gpu-driver", "platform")
def gpu_driver(ctx: CheckContext) -> CheckResult:
    """The host's NVIDIA driver (nvidia-smi, else /proc/driver/nvidia/version) runs the image's CUDA (NVIDIA's
    minor-version compatibility table, blocks.cuda.driver)."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    cuda = driver.image_cuda(ctx.components)
    if cuda is None:
        return skip("the image has no CUDA (no cuda pin, no PyTorch CUDA wheel): any driver will do")
    ran = ctx.run(driver.READ_COMMAND)
    finding = driver.judge(driver.parse(ran.out), cuda, ran.out)
    expected = f"driver >= {finding.needs} (CUDA {cuda})" if finding.needs else f"a driver for CUDA {cuda}"
    details = finding.to_json()
    if finding.status == "ok":
        return passed(expected, f"{finding.driver} ({finding.source})", finding.advice, **details)
    if finding.status == "no driver":
        return fail(f"no NVIDIA driver answers (nvidia-smi, {driver.PROC_VERSION}): {ran.why()}", expected, **details)
    if finding.status == "unknown":
        return skip(finding.advice, expected, **details)
    return fail(finding.advice, expected, f"{finding.driver} ({finding.source})", **details)


@check("imex-channel", "platform")
def imex_channel(ctx: CheckContext) -> CheckResult:
    """Where the host has IMEX channels (NVLink across nodes, GB200 NVL72), they are usable character devices here
    (in the container: passed by the run profile)."""
    passed_in = [d for d in ctx.devices if d.startswith(f"{driver.IMEX_CHANNEL_DIR}/")]
    ran = ctx.run(
        f'for c in {driver.IMEX_CHANNEL_DIR}/channel*; do [ -e "$c" ] || continue; '
        'if [ -c "$c" ] && [ -r "$c" ] && [ -w "$c" ]; then echo "ok $c"; else echo "bad $c"; fi; done; echo done'
    )
    if not ran.out.rstrip().endswith("done"):
        return fail(f"could not list {driver.IMEX_CHANNEL_DIR}: {ran.why()}")
    lines = ran.out.split("\n")
    good = [line[3:] for line in lines if line.startswith("ok ")]
    bad = [line[4:] for line in lines if line.startswith("bad ")]
    missing = [d for d in passed_in if d not in good and d not in bad]
    expected = "IMEX channels readable and writable" if good or bad or passed_in else "none needed"
    if bad:
        return fail(f"not a character device this user can read and write: {', '.join(bad)}", expected, ", ".join(bad))
    if missing:
        return fail(f"passed to the container but not in it: {', '.join(missing)}", expected, "missing")
    if not good:
        return skip(
            f"no IMEX channel ({driver.IMEX_CHANNEL_DIR}/channelN): only NVLink across nodes (GB200 NVL72 across "
            "trays) needs one, and IMEX makes it per job (a Slurm/AWS PCS prolog, the EKS ComputeDomain)"
        )
    return passed(expected, ", ".join(good))
