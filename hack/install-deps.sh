#!/usr/bin/env bash
# Installs the system packages Tendril's build, tests and lab need (Debian).
# Idempotent: does nothing when everything is already there.
set -euo pipefail

packages=(clang llvm libbpf-dev bpftool iproute2 iperf3 iputils-ping ethtool curl jq procps util-linux)
missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} == 0)); then
	echo "install-deps: all system packages present"
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "install-deps: need root to install: ${missing[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "install-deps: done"
