#!/usr/bin/env bash
# Installs the system packages Tendril's build, tests and lab need (Debian),
# then checks what packages cannot give: the Go toolchain and the kernel's
# features. bpffs needs no step here: the agent and the lab mount it at
# /sys/fs/bpf when it is missing (a fresh machine has none mounted).
# Idempotent: installs nothing when everything is already there.
set -euo pipefail

# check_host fails with one line per missing prerequisite that the
# project cannot install itself.
check_host() {
	local problems=()
	command -v go >/dev/null || problems+=("no Go toolchain on PATH (go.mod needs go $(sed -n 's/^go //p' go.mod 2>/dev/null))")
	[[ -e /sys/kernel/btf/vmlinux ]] || problems+=("the kernel has no BTF (/sys/kernel/btf/vmlinux): needs CONFIG_DEBUG_INFO_BTF")
	[[ -e /proc/self/ns/net ]] || problems+=("the kernel has no network namespaces (CONFIG_NET_NS)")
	grep -qw bpf /proc/filesystems || problems+=("the kernel has no bpffs (CONFIG_BPF_SYSCALL)")
	grep -q cgroup2 /proc/mounts || problems+=("no cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)")
	if ((${#problems[@]} > 0)); then
		printf 'install-deps: %s\n' "${problems[@]}" >&2
		return 1
	fi
	echo "install-deps: host checks passed (Go $(go env GOVERSION), kernel $(uname -r); bpffs is mounted by the agent and the lab when missing)"
}

# gcc and libc6-dev: the race detector (make test runs -race) needs cgo.
# iptables, nftables, conntrack: kube-proxy in the services benchmark (hack/kube-proxy.sh).
packages=(clang llvm libbpf-dev bpftool iproute2 iperf3 iputils-ping ethtool curl jq procps util-linux gcc libc6-dev iptables nftables conntrack)
missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} == 0)); then
	echo "install-deps: all system packages present"
	check_host
	exit
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
check_host
