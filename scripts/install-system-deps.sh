#!/usr/bin/env bash
# Install the Debian packages that the browser, MPI and Slurm tests need.
# Idempotent: only runs apt-get when something is missing. Never fails the
# caller when it cannot install (no root / no apt): the tests then skip.
set -u

# slurmctld, slurmd, munge: the Slurm tests run a one-node Slurm of their own, with its own
# configuration and munge key; they never use these packages' system services.
PACKAGES=(chromium-headless-shell openmpi-bin libopenmpi-dev openssh-server openssh-client iproute2
    slurmctld slurmd slurm-client munge)

log() { echo "install-system-deps: $*"; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get/dpkg not available; skipping (browser/MPI/Slurm tests will skip)"
    exit 0
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    # "install ok installed" is the only state that means the package is usable.
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    log "all packages already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    log "not root; cannot install: ${missing[*]} (browser/MPI/Slurm tests will skip)"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
if ! apt-get update -qq >/dev/null 2>&1; then
    log "apt-get update failed; skipping (tests needing ${missing[*]} will skip)"
    exit 0
fi

log "installing: ${missing[*]}"
# --no-install-recommends keeps the image small; the browser tests need no more.
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    log "apt-get install failed for: ${missing[*]} (affected tests will skip)"
    exit 0
fi
log "done"
