# shellcheck shell=bash
# Entrypoint hook of the sshd block: sourced by imgbuild-entrypoint (after the sagemaker block's hook, which may
# add a port), with the command as its arguments. Prepares and starts sshd. Its data: sshd.conf in IMGBUILD_ETC
# (default /etc/imgbuild), KEY=VALUE lines: SSH_KEY_DIR (/run/imgbuild/ssh), SSHD_LOG.
#
#   IMGBUILD_SSHD=0               do not start sshd
#   IMGBUILD_SSH_DIR=DIR          a mounted folder holding this run's keys: authorized_keys and/or
#                                 id_ed25519 | id_ecdsa | id_rsa (+ .pub); private keys never live in the image.
#                                 Default /run/imgbuild/ssh (SSH_KEY_DIR); in SageMaker images, where that folder
#                                 does not exist, the SageMaker channel /opt/ml/input/data/ssh
#   IMGBUILD_AUTHORIZED_KEYS=...  public key line(s) to authorize, instead of or besides the folder
#   IMGBUILD_SSH_PRIVATE_KEY=...  a private key (PEM/OpenSSH text) for ssh to peers; its public half is authorized
#   IMGBUILD_SSHD_PORTS=22,3022   extra ports for sshd (SageMaker mode adds SageMaker's ssh port)
#
# /root/.ssh/authorized_keys is rebuilt from these sources at every start: a key that came with the image is
# never trusted (unless authorized_keys itself is bind-mounted, which is then used as it is).

sshd_log() { printf 'imgbuild-entrypoint: %s\n' "$*" >&2; }

declare -A sshd_conf=()
while IFS='=' read -r sshd_key sshd_value || [[ -n "${sshd_key}" ]]; do
    [[ -z "${sshd_key}" || "${sshd_key}" == '#'* ]] || sshd_conf["${sshd_key}"]="${sshd_value}"
done <"${IMGBUILD_ETC:-/etc/imgbuild}/sshd.conf"

sshd_dir() {
    printf '%s' "${IMGBUILD_SSH_DIR:-${sshd_conf[SSH_KEY_DIR]}}"
}

sshd_is_mounted() {
    grep -q " $1 " /proc/self/mountinfo 2>/dev/null
}

# The private key's file name follows its type, so that ssh finds it without an IdentityFile line.
sshd_install_private_key() {
    local src="$1" pub name
    pub="$(ssh-keygen -y -f "${src}" 2>/dev/null)" || { sshd_log "ignoring ${2:-${src}}: not a private key without passphrase"; return 0; }
    case "${pub}" in
        ssh-ed25519*) name=id_ed25519 ;;
        ecdsa-*) name=id_ecdsa ;;
        ssh-rsa*) name=id_rsa ;;
        *) sshd_log "ignoring ${2:-${src}}: unsupported key type"; return 0 ;;
    esac
    install -m 600 "${src}" "/root/.ssh/${name}"
    printf '%s\n' "${pub}" >"/root/.ssh/${name}.pub"
    printf '%s\n' "${pub}" >>"${keys}"
}

sshd_prepare_ssh() {
    local dir key keys
    dir="$(sshd_dir)"
    ssh-keygen -A >/dev/null
    install -d -m 700 /root/.ssh
    keys="$(mktemp)"
    if [[ -n "${IMGBUILD_AUTHORIZED_KEYS:-}" ]]; then
        printf '%s\n' "${IMGBUILD_AUTHORIZED_KEYS}" >>"${keys}"
    fi
    if [[ -f "${dir}/authorized_keys" ]]; then
        cat "${dir}/authorized_keys" >>"${keys}"
    fi
    for key in "${dir}"/id_ed25519 "${dir}"/id_ecdsa "${dir}"/id_rsa; do
        [[ -f "${key}" ]] || continue
        sshd_install_private_key "${key}"
    done
    if [[ -n "${IMGBUILD_SSH_PRIVATE_KEY:-}" ]]; then
        local tmp
        tmp="$(mktemp)"
        printf '%s\n' "${IMGBUILD_SSH_PRIVATE_KEY}" >"${tmp}"
        sshd_install_private_key "${tmp}" IMGBUILD_SSH_PRIVATE_KEY
        rm -f "${tmp}"
    fi
    if sshd_is_mounted /root/.ssh/authorized_keys || sshd_is_mounted /root/.ssh; then
        sshd_log "/root/.ssh/authorized_keys is mounted: using it as it is"
    else
        grep -v '^[[:space:]]*$' "${keys}" | sort -u >/root/.ssh/authorized_keys || true
        chmod 600 /root/.ssh/authorized_keys
        [[ -s /root/.ssh/authorized_keys ]] || sshd_log "no authorized key given (${dir}, IMGBUILD_AUTHORIZED_KEYS): nobody can log in"
    fi
    rm -f "${keys}"
    # A locked root account ('!' in shadow) refuses public-key logins without PAM.
    if [[ "$(getent shadow root | cut -d: -f2)" == "!"* ]]; then
        usermod -p '*' root
    fi
    mkdir -p /etc/ssh/imgbuild.d
    (umask 077 && sshd_setenv_directive >/etc/ssh/imgbuild.d/env.conf)
    : >/etc/ssh/imgbuild.d/ports.conf
    if [[ -n "${IMGBUILD_SSHD_PORTS:-}" ]]; then
        local port
        for port in ${IMGBUILD_SSHD_PORTS//,/ }; do
            grep -qx "Port ${port}" /etc/ssh/sshd_config /etc/ssh/imgbuild.d/ports.conf \
                || echo "Port ${port}" >>/etc/ssh/imgbuild.d/ports.conf
        done
    fi
}

# ssh sessions (mpirun's daemons on the other hosts, and the ranks they start) don't inherit the container's
# environment: sshd sets it for them from ONE SetEnv directive, since sshd keeps only the first SetEnv line it
# reads. It carries every variable of the container's environment (the image's ENV, the recipe's env, what the
# run adds such as SageMaker's) except those sshd or the login sets per session and the run's credentials, which
# are not written to disk. Each value is double-quoted for OpenSSH's argument splitting, which undoes \\ and \"
# inside quotes and keeps anything else as it is; a config line cannot hold a newline, so a value with one is
# left out, with a warning.
sshd_setenv_directive() {
    local name value line=SetEnv
    for name in $(compgen -e | LC_ALL=C sort); do
        case "${name}" in
            HOME | HOSTNAME | LOGNAME | MAIL | OLDPWD | PWD | SHELL | SHLVL | TERM | USER | _ | SSH_*) continue ;;
            IMGBUILD_AUTHORIZED_KEYS | IMGBUILD_SSH_PRIVATE_KEY | AWS_ACCESS_KEY_ID | AWS_SECRET_ACCESS_KEY | AWS_SESSION_TOKEN) continue ;;
        esac
        value="${!name}"
        if [[ "${value}" == *$'\n'* ]]; then
            sshd_log "warning: not passing ${name} to ssh sessions: sshd_config cannot carry a newline in a value"
            continue
        fi
        # sed, not ${value//...}: bash 5.1 and 5.2 treat backslashes in a replacement differently.
        line+=" ${name}=\"$(printf '%s' "${value}" | sed 's/[\\"]/\\&/g')\""
    done
    [[ "${line}" == SetEnv ]] || printf '%s\n' "${line}"
}

# Starts sshd, or restarts it when one is already running (train does that to add a port).
sshd_start() {
    local pid
    /usr/sbin/sshd -t || { sshd_log "sshd configuration is invalid"; exit 1; }
    if [[ -f /run/sshd.pid ]] && pid="$(cat /run/sshd.pid)" && kill -0 "${pid}" 2>/dev/null; then
        kill "${pid}"
        while kill -0 "${pid}" 2>/dev/null; do sleep 0.1; done
    fi
    /usr/sbin/sshd -E "${sshd_conf[SSHD_LOG]}"
    sshd_log "sshd listening on $(grep -h '^Port ' /etc/ssh/sshd_config /etc/ssh/imgbuild.d/*.conf | awk '{print $2}' | paste -sd, -)"
}

if [[ "${IMGBUILD_SSHD:-1}" != 0 && -x /usr/sbin/sshd && "$(id -u)" == 0 ]]; then
    sshd_prepare_ssh
    sshd_start
fi
unset sshd_conf sshd_key sshd_value
