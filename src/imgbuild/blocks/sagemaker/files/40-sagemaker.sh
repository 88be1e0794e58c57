# shellcheck shell=bash
# Entrypoint hook of the sagemaker block: sourced by imgbuild-entrypoint before sshd's hook, with the command as
# its arguments. Its data: sagemaker.conf in IMGBUILD_ETC (default /etc/imgbuild), KEY=VALUE lines.
#
# SageMaker mode (`docker run IMAGE train`): sshd also listens on SageMaker's ssh port (SSH_SAGEMAKER_PORT), where the
# SageMaker training toolkit looks for peers (added to IMGBUILD_SSHD_PORTS), and the job markers of a previous run of
# `train` (the leader's, and a worker's own code-fetched one) are cleared before sshd starts, so that the leader's
# first contact (see train) can never be lost.
# Any command: the run's ssh keys come from the SageMaker input channel `ssh` (SSH_CHANNEL, /opt/ml/input/data/ssh)
# when IMGBUILD_SSH_DIR is unset and sshd's default folder (SSH_KEY_DIR) does not exist.

declare -A sagemaker_conf=()
while IFS='=' read -r sagemaker_key sagemaker_value || [[ -n "${sagemaker_key}" ]]; do
    [[ -z "${sagemaker_key}" || "${sagemaker_key}" == '#'* ]] || sagemaker_conf["${sagemaker_key}"]="${sagemaker_value}"
done <"${IMGBUILD_ETC:-/etc/imgbuild}/sagemaker.conf"

if [[ "${1:-}" == train || "${1:-}" == "${sagemaker_conf[TRAIN]}" ]]; then
    IMGBUILD_SSHD_PORTS="${IMGBUILD_SSHD_PORTS:+${IMGBUILD_SSHD_PORTS},}${sagemaker_conf[SSH_SAGEMAKER_PORT]}"
    export IMGBUILD_SSHD_PORTS
    rm -f "${sagemaker_conf[LEADER_SEEN]}" "${sagemaker_conf[JOB_DONE]}" "${sagemaker_conf[JOB_DONE]}.tmp" \
        "${sagemaker_conf[WORKER_READY]}"
fi
# Set for sshd's hook, not exported: the command's environment stays as the run gave it.
if [[ -z "${IMGBUILD_SSH_DIR:-}" && ! -d "${sagemaker_conf[SSH_KEY_DIR]}" ]]; then
    IMGBUILD_SSH_DIR="${sagemaker_conf[SSH_CHANNEL]}"
fi
unset sagemaker_conf sagemaker_key sagemaker_value
