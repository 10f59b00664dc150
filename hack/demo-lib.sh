# Helpers of the demo (hack/demo.sh) and its policy step (hack/demo-policy.sh),
# sourced by both. Every probe is compared with the verdict the policy in
# force implies; a mismatch is printed and counted in demo_mismatches, and
# demo_verdict exits 1 at the end when there was one. A probe that could not
# be made (`lab probe` exit 2 or more) is a mismatch whatever was expected:
# it says nothing about the policy.
# Needs: T (the tendril binary), backend (the backend pod's address).

demo_mismatches=0

# demo_compare WHAT WANT CODE DETAIL: WANT is connected or blocked, CODE the
# probe's exit status (0 answered, 1 no answer, 2+ could not probe).
demo_compare() {
	local what=$1 want=$2 code=$3 detail=$4 got
	case $code in
	0) got=connected ;;
	1) got=blocked ;;
	*) got="cannot probe (exit $code)" ;;
	esac
	if [[ $got == "$want" ]]; then
		printf '  %-52s %s%s\n' "$what" "$got" "${detail:+ ($detail)}"
	else
		printf '  %-52s %s, want %s  MISMATCH%s\n' "$what" "$got" "$want" "${detail:+ ($detail)}"
		demo_mismatches=$((demo_mismatches + 1))
	fi
}

# probe FROM PORT connected|blocked [--udp]: from a demo pod to the backend.
probe() {
	local from=$1 port=$2 want=$3 proto=tcp out code=0
	[[ ${4:-} == --udp ]] && proto=udp
	out=$($T lab probe "demo/$from" "$backend:$port" ${4:-} 2>&1) || code=$?
	local detail=
	[[ $code -eq 0 ]] && detail=${out##*answered }
	[[ $code -ge 2 ]] && detail=$out
	demo_compare "$(printf '%-8s -> backend:%s/%s' "$from" "$port" "$proto")" "$want" "$code" "$detail"
}

# svcprobe FROM connected|blocked [TRIES]: from a demo pod to the backend
# Service's ClusterIP (cip). An expected connection is retried up to TRIES
# times (the agents program the Service within moments).
svcprobe() {
	local from=$1 want=$2 out code
	for _ in $(seq "${3:-50}"); do
		code=0
		out=$($T lab probe "demo/$from" "$cip:80" --timeout 500ms 2>&1) || code=$?
		[[ $code -eq 0 || $want == blocked ]] && break
		sleep 0.1
	done
	local detail=
	[[ $code -eq 0 ]] && detail="answered by ${out##*answered }"
	[[ $code -ge 2 ]] && detail=$out
	demo_compare "$(printf '%-8s -> %s:80/tcp (Service demo/backend)' "$from" "$cip")" "$want" "$code" "$detail"
}

# demo_verdict: exit 1 if a probe did not match its expected verdict.
demo_verdict() {
	if ((demo_mismatches > 0)); then
		echo "demo: $demo_mismatches probe(s) did not match what the policy says" >&2
		exit 1
	fi
}
