#!/usr/bin/env bash
# The L7 proxies against their baselines, in alternating rounds (each round
# runs the baseline and the proxy back to back, so a ratio compares
# neighbours on a noisy machine):
#   - HTTP: GET requests through the HTTP proxy enforcing an L7 rule against
#     the same requests through a TCP splice (L4 only), 1 and 16 keep-alive
#     clients (BenchmarkHTTP, pkg/l7proxy): req/s and p99, ratio l7/l4;
#   - DNS: lookups through the DNS proxy against directly to the lab's
#     CoreDNS binary (hack/coredns.sh) and to a miekg/dns server, on loopback
#     (BenchmarkDNSLookup, pkg/fqdn): p50 and p99, ratio proxy/direct;
# then the heap of the DNS proxy and its FQDN cache at 10,000 names
# (BenchmarkProxyMemory10kNames). docs/benchmarks.md records the results.
#
#   bench/l7/run.sh               # 5 rounds
#   ROUNDS=3 HTTP_N=5000 DNS_N=3000 bench/l7/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
HTTP_N=${HTTP_N:-5000}
DNS_N=${DNS_N:-3000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go test -c -o "$dir/l7proxy.test" ./pkg/l7proxy
go test -c -o "$dir/fqdn.test" ./pkg/fqdn
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
# metric NAME UNIT FILE: the value before UNIT on the line of benchmark NAME.
metric() {
	awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 2; i <= NF; i++) if ($i == unit) print $(i-1) }' "$3"
}
for round in $(seq "$ROUNDS"); do
	"$dir/l7proxy.test" -test.run '^$' -test.bench '^BenchmarkHTTP$' -test.benchtime "${HTTP_N}x" >"$dir/http.out"
	"$dir/fqdn.test" -test.run '^$' -test.bench '^BenchmarkDNSLookup$' -test.benchtime "${DNS_N}x" >"$dir/dns.out"
	line="round $round:"
	for c in c1 c16; do
		l4=$(metric "BenchmarkHTTP/$c/l4" req/s "$dir/http.out")
		l7=$(metric "BenchmarkHTTP/$c/l7" req/s "$dir/http.out")
		p4=$(metric "BenchmarkHTTP/$c/l4" p99-µs "$dir/http.out")
		p7=$(metric "BenchmarkHTTP/$c/l7" p99-µs "$dir/http.out")
		c4=$(metric "BenchmarkHTTP/$c/l4" cpu-µs/req "$dir/http.out")
		c7=$(metric "BenchmarkHTTP/$c/l7" cpu-µs/req "$dir/http.out")
		line+=$(printf ' HTTP %s l4 %.0f req/s p99 %.0f µs %.1f CPU-µs/req, l7 %.0f req/s p99 %.0f µs %.1f CPU-µs/req (%.2fx req/s, %.2fx CPU);' \
			"$c" "$l4" "$p4" "$c4" "$l7" "$p7" "$c7" "$(echo "$l7 / $l4" | bc -l)" "$(echo "$c7 / $c4" | bc -l)")
	done
	for u in coredns miekg; do
		d50=$(metric "BenchmarkDNSLookup/$u/direct" p50-µs "$dir/dns.out")
		d99=$(metric "BenchmarkDNSLookup/$u/direct" p99-µs "$dir/dns.out")
		x50=$(metric "BenchmarkDNSLookup/$u/proxy" p50-µs "$dir/dns.out")
		x99=$(metric "BenchmarkDNSLookup/$u/proxy" p99-µs "$dir/dns.out")
		dc=$(metric "BenchmarkDNSLookup/$u/direct" cpu-µs/lookup "$dir/dns.out")
		xc=$(metric "BenchmarkDNSLookup/$u/proxy" cpu-µs/lookup "$dir/dns.out")
		[[ -n $d50 ]] || { line+=" DNS $u: skipped ($(grep -o 'no CoreDNS binary[^)]*' "$dir/dns.out" | head -1));"; continue; }
		line+=$(printf ' DNS %s direct p50/p99 %.0f/%.0f µs %.1f CPU-µs, proxy %.0f/%.0f µs %.1f CPU-µs;' "$u" "$d50" "$d99" "$dc" "$x50" "$x99" "$xc")
	done
	echo "$line"
done
"$dir/fqdn.test" -test.run '^$' -test.bench '^BenchmarkProxyMemory10kNames$' -test.benchtime 1x >"$dir/mem.out"
printf 'DNS proxy + FQDN cache at 10,000 names: %s MiB heap (%s B a name)\n' \
	"$(metric BenchmarkProxyMemory10kNames heap-MiB "$dir/mem.out")" "$(metric BenchmarkProxyMemory10kNames B/name "$dir/mem.out")"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
