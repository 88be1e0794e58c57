# Sourced by scripts/main.sh and scripts/test.sh (setup.sh runs as a child, so it can't export this):
# on networks whose proxy intercepts TLS, downloads inside builds trust the host's bundle (the build secret imgbuild-ca).
if [[ -z "${IMGBUILD_CA_BUNDLE:-}" && -n "${SSL_CERT_FILE:-}" && -f "${SSL_CERT_FILE}" ]]; then
    export IMGBUILD_CA_BUNDLE="${SSL_CERT_FILE}"
fi
