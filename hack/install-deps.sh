#!/usr/bin/env bash
# Installs the system packages Tendril's build, tests and lab need (Debian),
# then checks what packages cannot give: the Go toolchain and the kernel's
# features. bpffs needs no step here: the agent and the lab mount it at
# /sys/fs/bpf when it is missing (a fresh machine has none mounted).
# Idempotent: installs nothing when everything is already there.
set -euo pipefail

# The Go toolchain go.mod asks for, and where ensure_go puts it when the
# machine's go is missing or older (the Makefile puts its bin first on PATH).
GO_WANT=go$(sed -n 's/^go //p' go.mod)
GO_CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}/go

# go_older A B: whether Go version A (go1.19.8) is older than B.
go_older() {
	[[ $1 != "$2" && $(printf '%s\n%s\n' "${1#go}" "${2#go}" | sort -V | head -1) == "${1#go}" ]]
}

# ensure_go makes go.mod's toolchain available when the machine's go is
# missing or older. It bootstraps with any go (Debian 12's golang-go is
# 1.19, installed when there is none): that go downloads the toolchain
# module golang.org/toolchain@v0.0.1-<version>.linux-<arch> from the Go
# module proxy (the module Go 1.21+ switches toolchains with), and its
# GOROOT is copied to $GO_CACHE with the executable bits a module zip does
# not keep. Nothing outside the cache changes besides the apt package.
ensure_go() {
	if [[ -x $GO_CACHE/bin/go ]] && ! go_older "$("$GO_CACHE/bin/go" env GOVERSION)" "$GO_WANT"; then
		return
	fi
	if command -v go >/dev/null && ! go_older "$(go env GOVERSION)" "$GO_WANT"; then
		return
	fi
	if ! command -v go >/dev/null; then
		[[ $(id -u) -eq 0 ]] || { echo "install-deps: no go on PATH; as root, this installs Debian's golang-go to bootstrap $GO_WANT" >&2; return 1; }
		echo "install-deps: no go on PATH: installing Debian's golang-go to bootstrap $GO_WANT"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
		export PATH=$PATH:/usr/lib/go/bin
	fi
	local arch mod scratch dir
	arch=$(go env GOARCH)
	mod=golang.org/toolchain@v0.0.1-$GO_WANT.linux-$arch
	echo "install-deps: $(go env GOVERSION) is older than go.mod's $GO_WANT: fetching $mod into $GO_CACHE"
	scratch=$(mktemp -d)
	# go mod download needs a module to run in; the toolchain's own go.mod
	# is not needed.
	(cd "$scratch" && go mod init tendril-go-bootstrap >/dev/null 2>&1 &&
		GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "$mod") >"$scratch/out.json"
	dir=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' "$scratch/out.json")
	rm -rf "$scratch"
	[[ -d $dir ]] || { echo "install-deps: cannot download $mod from the module proxy" >&2; return 1; }
	rm -rf "$GO_CACHE.tmp"
	mkdir -p "$(dirname "$GO_CACHE")"
	cp -r "$dir" "$GO_CACHE.tmp"
	chmod -R u+w "$GO_CACHE.tmp"
	chmod +x "$GO_CACHE.tmp"/bin/* "$GO_CACHE.tmp"/pkg/tool/*/*
	rm -rf "$GO_CACHE"
	mv "$GO_CACHE.tmp" "$GO_CACHE"
	echo "install-deps: $("$GO_CACHE/bin/go" version) in $GO_CACHE/bin (make puts it first on PATH; elsewhere: export PATH=$GO_CACHE/bin:\$PATH)"
}

# check_host fails with one line per missing prerequisite that the
# project cannot install itself.
check_host() {
	local problems=()
	if [[ -x $GO_CACHE/bin/go ]]; then
		export PATH=$GO_CACHE/bin:$PATH
	fi
	command -v go >/dev/null || problems+=("no Go toolchain on PATH (go.mod needs $GO_WANT)")
	if command -v go >/dev/null && go_older "$(go env GOVERSION)" "$GO_WANT"; then
		problems+=("go on PATH is $(go env GOVERSION), older than go.mod's $GO_WANT")
	fi
	[[ -e /sys/kernel/btf/vmlinux ]] || problems+=("the kernel has no BTF (/sys/kernel/btf/vmlinux): needs CONFIG_DEBUG_INFO_BTF")
	[[ -e /proc/self/ns/net ]] || problems+=("the kernel has no network namespaces (CONFIG_NET_NS)")
	grep -qw bpf /proc/filesystems || problems+=("the kernel has no bpffs (CONFIG_BPF_SYSCALL)")
	grep -q cgroup2 /proc/mounts || problems+=("no cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)")
	# Not failures: the agent runs without them and says what it cannot do.
	local kernel
	kernel=$(uname -r | sed 's/[^0-9.].*//')
	if [[ $(printf '%s\n6.6\n' "$kernel" | sort -V | head -1) != 6.6 ]]; then
		echo "install-deps: warning: kernel $kernel has no TCX (Linux 6.6): the agent needs --datapath-attach-mode=tc" >&2
	fi
	if [[ $(printf '%s\n6.5\n' "$kernel" | sort -V | head -1) != 6.5 ]]; then
		echo "install-deps: warning: kernel $kernel has no bpf_sock_destroy (Linux 6.5): sockets on removed Service backends are not terminated" >&2
	fi
	if ((${#problems[@]} > 0)); then
		printf 'install-deps: %s\n' "${problems[@]}" >&2
		return 1
	fi
	echo "install-deps: host checks passed (Go $(go env GOVERSION), kernel $(uname -r); bpffs is mounted by the agent and the lab when missing)"
}

# gcc and libc6-dev: the race detector (make test runs -race) needs cgo.
# iptables, nftables, conntrack: kube-proxy in the services benchmark (hack/kube-proxy.sh).
# runc: the OCI runtime of the lab's real nodes (tendril lab up --runtime
# containerd; containerd and the kubelet come from hack/node-binaries.sh).
# bird2: the lab's BGP router (tendril lab up --bgp, pkg/lab/bgp.go).
# chromium: the web UI's browser tests (pkg/ui, headless, driven by chromedp).
# prometheus: the lab's Prometheus (tendril lab up --prometheus, pkg/lab/prometheus.go).
packages=(clang llvm libbpf-dev bpftool iproute2 iperf3 iputils-ping ethtool curl jq procps util-linux gcc libc6-dev iptables nftables conntrack runc bird2 chromium prometheus)
missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} == 0)); then
	echo "install-deps: all system packages present"
	ensure_go
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
ensure_go
check_host
