// Command verifierstats loads the pod programs (bpf_lxc.c, or another
// object's) with the agent's default constants and prints what the
// kernel's verifier spent on each:
// instructions processed, states, verification time (the numbers veristat
// prints). With -profile it also attributes the processed instructions to
// the subprograms and source lines they belong to, from the verifier's
// instruction log: where the states do not prune, the same lines are
// walked over and over.
//
//	go run ./hack/verifierstats [-object lxc] [-trace=per-connection] [-verdicts] [-const LB_DSR=1] [-profile 25]
//
// It needs root (BPF_PROG_LOAD); maps are created unpinned and freed on
// exit. VSTATS_DUMP=dir writes each program's verifier log to dir.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

var statsRe = regexp.MustCompile(`processed (\d+) insns \(limit \d+\) max_states_per_insn (\d+) total_states (\d+) peak_states (\d+)`)
var timeRe = regexp.MustCompile(`verification time (\d+) usec`)
var insnRe = regexp.MustCompile(`^(\d+): \(`)

func main() {
	trace := flag.String("trace", "per-connection", "trace events: off, per-connection (the agent's default) or all")
	verdicts := flag.Bool("verdicts", true, "policy verdict events (the agent's default: on)")
	profile := flag.Int("profile", 0, "print the N source lines the verifier walked most, and the instructions per subprogram")
	object := flag.String("object", "lxc", "object: lxc (bpf_lxc.c), host, sock, sockterm or overlay")
	progs := flag.String("progs", "", "programs to load (default: all of the object's)")
	consts := flag.String("const", "", "more one-byte constants to set, NAME=V[,NAME=V] (LB_DSR=1: the DSR paths)")
	flag.Parse()

	load, ok := map[string]func() (*ebpf.CollectionSpec, error){
		"lxc": bpf.LoadLxc, "host": bpf.LoadHost, "sock": bpf.LoadSock, "sockterm": bpf.LoadSockTerm, "overlay": bpf.LoadOverlay,
	}[*object]
	if !ok {
		check(fmt.Errorf("unknown object %q", *object))
	}
	spec, err := load()
	check(err)
	if *progs == "" {
		var names []string
		for n := range spec.Programs {
			names = append(names, n)
		}
		sort.Strings(names)
		*progs = strings.Join(names, ",")
	}
	set := func(name string, v uint8) {
		// An older object may lack a constant: it then has no such
		// events.
		if vs, ok := spec.Variables[name]; ok {
			check(vs.Set(v))
		}
	}
	set("TRACE_EVENTS", b2u(*trace != "off"))
	set("TRACE_EVERY_PACKET", b2u(*trace == "all"))
	set("POLICY_VERDICT_EVENTS", b2u(*verdicts))
	for _, kv := range strings.Split(*consts, ",") {
		if kv == "" {
			continue
		}
		name, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(v, 10, 8)
		if !ok || err != nil {
			check(fmt.Errorf("-const %q: want NAME=V, V 0-255", kv))
		}
		if _, ok := spec.Variables[name]; !ok {
			check(fmt.Errorf("-const: the object has no constant %s", name))
		}
		set(name, uint8(n))
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for _, name := range strings.Split(*progs, ",") {
		ps, ok := spec.Programs[name]
		if !ok {
			check(fmt.Errorf("no program %s", name))
		}
		one := spec.Copy()
		for n := range one.Programs {
			if n != name {
				delete(one.Programs, n)
			}
		}
		level := ebpf.LogLevelStats
		if *profile > 0 {
			level |= ebpf.LogLevelInstruction
		}
		opts := ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: level, LogSizeStart: logSize(*profile)}}
		coll, err := ebpf.NewCollectionWithOptions(one, opts)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			var verr *ebpf.VerifierError
			if errors.As(err, &verr) {
				for _, l := range verr.Log[max(0, len(verr.Log)-20):] {
					fmt.Fprintln(os.Stderr, l)
				}
			}
			os.Exit(1)
		}
		log := coll.Programs[name].VerifierLog
		if d := os.Getenv("VSTATS_DUMP"); d != "" {
			check(os.WriteFile(d+"/"+name+".log", []byte(log), 0o644))
		}
		st := statsRe.FindStringSubmatch(log)
		tm := timeRe.FindStringSubmatch(log)
		if st == nil || tm == nil {
			check(fmt.Errorf("%s: no statistics in the verifier log", name))
		}
		fmt.Printf("%-10s insns %5d  processed %7s  states total %6s peak %5s max/insn %3s  time %7s us\n",
			name, count(ps.Instructions), st[1], st[3], st[4], st[2], tm[1])
		if *profile > 0 {
			profileLog(ps.Instructions, log, *profile)
		}
		coll.Close()
	}
}

// profileLog attributes every instruction the log shows as processed to
// its function and source line.
func profileLog(insns asm.Instructions, log string, top int) {
	fn := map[uint64]string{}
	src := map[uint64]string{}
	cur, line := "", ""
	iter := insns.Iterate()
	for iter.Next() {
		if s := iter.Ins.Symbol(); s != "" {
			cur = s
		}
		if s := iter.Ins.Source(); s != nil {
			line = strings.TrimSpace(s.String())
		}
		off := uint64(iter.Offset)
		fn[off] = cur
		src[off] = fmt.Sprintf("%s: %s", cur, line)
	}
	perFn := map[string]int{}
	perLine := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := insnRe.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		off, _ := strconv.ParseUint(m[1], 10, 64)
		perFn[fn[off]]++
		perLine[src[off]]++
	}
	printTop("  per subprogram", perFn, 1000)
	printTop("  per source line", perLine, top)
}

func printTop(title string, m map[string]int, n int) {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	fmt.Println(title)
	for i, e := range all {
		if i == n {
			break
		}
		k := e.k
		if len(k) > 150 {
			k = k[:150]
		}
		fmt.Printf("  %8d  %s\n", e.v, k)
	}
}

func count(insns asm.Instructions) int {
	n := 0
	for _, i := range insns {
		n += int(i.Size() / asm.InstructionSize)
	}
	return n
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "verifierstats:", err)
		os.Exit(1)
	}
}

// logSize is the verifier log buffer: the instruction log of a program
// that processes 300,000 instructions is some hundred MiB, and the kernel
// keeps only the log's tail when it does not fit.
func logSize(profile int) uint32 {
	if profile > 0 {
		return 1 << 30
	}
	return 1 << 20
}
