package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/icmp"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/kubelet"
	"github.com/tendril-net/tendril/pkg/lab/pingstream"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// Exit codes of `tendril lab probe`: a probe that could not run must never
// look like a denied connection.
const (
	probeConnected = 0
	probeNoAnswer  = 1
	probeBroken    = 2
)

func newLabCommand(*Options) *cobra.Command {
	name := lab.DefaultName
	if v := os.Getenv("TENDRIL_LAB"); v != "" {
		name = v
	}
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A local cluster on this machine: Kubernetes control plane, nodes and pods as network namespaces",
		Long: `The lab runs etcd, kube-apiserver and kube-controller-manager, one network
namespace per node on a bridge, a tendril-agent and a lab kubelet per node, and
pods as network namespaces wired by tendril-cni with a built-in server that
answers with the pod's name. Needs root. See docs/lab.md.`,
	}
	cmd.PersistentFlags().StringVar(&name, "name", name, "Lab name (several labs can run side by side; env TENDRIL_LAB)")
	cmd.AddCommand(
		newLabUpCommand(&name),
		newLabDownCommand(&name),
		newLabEnvCommand(&name),
		newLabStatusCommand(&name),
		newLabExecCommand(&name),
		newLabProbeCommand(&name),
		newLabPingCommand(&name),
		newLabKubeletCommand(&name),
		newLabNodeProxyCommand(&name),
		newLabMetricsForwardCommand(&name),
		newLabWorkloadCommand(),
	)
	return cmd
}

func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
}

func newLabUpCommand(name *string) *cobra.Command {
	// One operator: it gives LoadBalancer Services their address from the
	// lab's pool (lab.LBPoolCIDR).
	cfg := lab.Config{Nodes: 2, PodsPerNode: 3, Operators: 1}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Bring a lab up (removing the leftovers of an earlier one first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext(cmd)
			defer cancel()
			cfg.Name, cfg.Out = *name, cmd.OutOrStdout()
			if cfg.BinDir == "" {
				self, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the tendril binaries: %w (use --bin-dir)", err)
				}
				cfg.BinDir = filepath.Dir(self)
			}
			if cfg.ImagesDir == "" {
				// make build's bin/ and make images' _output/images are
				// siblings in a checkout.
				cfg.ImagesDir = filepath.Join(cfg.BinDir, "..", "_output", "images")
			}
			if _, err := lab.Up(ctx, cfg); err != nil {
				if logs := filepath.Join(lab.Dir(*name), "logs"); fileExists(logs) {
					return fmt.Errorf("lab up: %w\n(logs under %s; tendril lab down removes what was made)", err, logs)
				}
				return fmt.Errorf("lab up: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "Number of nodes")
	cmd.Flags().IntVar(&cfg.PodsPerNode, "pods-per-node", cfg.PodsPerNode, "Pods to start per node (default/pod-N, label app=lab)")
	cmd.Flags().StringVar(&cfg.BinDir, "bin-dir", "", "Directory with tendril, tendril-agent and tendril-cni (default: this binary's)")
	cmd.Flags().IntVar(&cfg.Operators, "operators", cfg.Operators, "tendril-operator replicas to run (leader election on a Lease; with 1 or more, LoadBalancer Services get addresses from the pool "+lab.LBPoolCIDR+")")
	cmd.Flags().StringVar(&cfg.IPAM, "ipam", cfg.IPAM, "cluster-pool: the operators allocate node pod CIDRs from "+lab.ClusterPoolCIDR+" (with --ip-family dual also a /64 each from "+lab.ClusterPoolCIDR6+") and the agents check and take them (needs --operators)")
	cmd.Flags().StringVar(&cfg.RoutingMode, "routing-mode", "", "The agents' --routing-mode: native (routes to the other nodes' pod CIDRs via them) or tunnel (VXLAN between the nodes, no pod CIDR route via the lab bridge)")
	cmd.Flags().StringVar(&cfg.TunnelProtocol, "tunnel-protocol", "", "The agents' --tunnel-protocol with --routing-mode tunnel: vxlan (the default) or geneve (built in eBPF where the kernel has no Geneve module)")
	cmd.Flags().StringVar(&cfg.Topology, "topology", "", "flat (the default: the nodes share one subnet on the lab bridge) or routed (each node in its own subnet 172.30.N.0/24, the world routing between them but not to the pod CIDRs, as cloud VMs in different subnets: native routing cannot route the pod CIDRs there, the tunnel can)")
	cmd.Flags().StringVar(&cfg.IPFamily, "ip-family", lab.IPFamilyIPv4, "ipv4 or dual: with dual every node, pod and the world get an IPv6 address too (nodes on "+lab.NodeSubnet6Prefix+"/64, pod CIDRs from "+lab.ClusterCIDR6+", services in "+lab.ServiceCIDR6+"; with --ipam cluster-pool from "+lab.ClusterPoolCIDR6+"; with --bgp an IPv6 session per node too and the pool "+lab.BGPPoolCIDR6+"); the tunnel carries IPv6 pod traffic over the nodes' IPv4 addresses")
	cmd.Flags().StringVar(&cfg.Encryption, "encryption", "", "wireguard: the agents encrypt pod traffic between the nodes (--enable-wireguard; the userspace device where the kernel has no WireGuard module)")
	cmd.Flags().BoolVar(&cfg.KVStore, "kvstore", false, "Run an etcd as Tendril's kvstore: agents and operators allocate identities there (--identity-allocation-mode kvstore) and the agents publish their endpoints' ipcache keys")
	cmd.Flags().BoolVar(&cfg.BGP, "bgp", false, "Run a BGP router (BIRD) in the world that every node's agent peers with (--enable-bgp-control-plane): the nodes announce their pod CIDRs and the load-balancer addresses of Services labelled "+lab.BGPServiceLabel+"=true, from the pool "+lab.BGPPoolCIDR+", which the world reaches through the learned routes")
	cmd.Flags().BoolVar(&cfg.Prometheus, "prometheus", false, "Run Debian's prometheus (in the machine's namespace, on a free loopback port) scraping every agent (with every flow metric), the operators and the relay; dashboards in install/grafana")
	cmd.Flags().StringArrayVar(&cfg.OperatorArgs, "operator-arg", nil, "Extra flag for every tendril-operator, repeatable (e.g. --operator-arg=--identity-gc-interval=10s)")
	cmd.Flags().StringArrayVar(&cfg.AgentArgs, "agent-arg", nil, "Extra flag for every node's tendril-agent, repeatable (e.g. --agent-arg=--datapath-attach-mode=tc)")
	cmd.Flags().StringVar(&cfg.Runtime, "runtime", "", "containerd: run each node as the upstream kubelet and containerd (hack/node-binaries.sh builds them), with the images of make images imported (docs/install.md)")
	cmd.Flags().StringVar(&cfg.ImagesDir, "images-dir", "", "Image archives of make images, for --runtime containerd (default: ../_output/images from the bin dir)")
	cmd.Flags().StringVar(&cfg.ChartDir, "chart-dir", "", "The Helm chart --runtime containerd installs (default: deploy/helm/tendril of the tree tendril was built from); e.g. a previous release's, to try helm upgrade from it")
	return cmd
}

func newLabDownCommand(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the lab: processes, network namespaces, pinned BPF objects, its directory (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.CheckHost(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "==> removing lab %s\n", *name)
			return lab.Down(*name, cmd.OutOrStdout())
		},
	}
}

func newLabEnvCommand(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "env",
		Short: "Print the lab's KUBECONFIG, node sockets and a PATH with its kubectl as shell exports (eval \"$(tendril lab env)\")",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*name)
			if err != nil {
				return err
			}
			env, err := st.EnvExports()
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), env)
			return err
		},
	}
}

func newLabStatusCommand(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the lab's nodes and pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*name)
			if err != nil {
				return err
			}
			cs, err := st.Clientset()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return lab.Summary(ctx, st, cs, cmd.OutOrStdout())
		},
	}
}

// labPod finds a running pod's record and moves this process into the
// cgroup of the pod's container, below its node's: what it then connects
// (or execs) is seen by that node's socket load-balancing, like the pod's
// own workload, and named as the pod's in flows.
func labPod(name, ref string) (*lab.PodRecord, error) {
	st, rec, err := findLabPod(name, ref)
	if err != nil {
		return nil, err
	}
	if err := st.EnterPodCgroup(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// worldRecord stands for the lab's world where a pod's record is used:
// its network namespace, no resolv.conf.
func worldRecord(name string) (*lab.PodRecord, error) {
	st, err := lab.LoadState(name)
	if err != nil {
		return nil, err
	}
	if st.World == nil {
		return nil, fmt.Errorf("lab %s has no world (made by an older lab up)", name)
	}
	ips := []string{st.World.ClientIP}
	if st.World.ClientIP6 != "" {
		ips = append(ips, st.World.ClientIP6)
	}
	return &lab.PodRecord{Name: lab.WorldRef, Netns: st.World.Netns, IPs: ips}, nil
}

// findLabPod finds a running pod's record and its lab.
func findLabPod(name, ref string) (*lab.State, *lab.PodRecord, error) {
	ns, pod, err := lab.ParsePodRef(ref)
	if err != nil {
		return nil, nil, err
	}
	st, err := lab.LoadState(name)
	if err != nil {
		return nil, nil, err
	}
	rec, err := st.Pod(ns, pod)
	if err != nil {
		return nil, nil, err
	}
	return st, rec, nil
}

func newLabExecCommand(name *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec NS/POD|world -- CMD [ARG...]",
		Short: "Run a command in a pod's network namespace (resolving names through the cluster DNS as the pod does), or in the world outside the cluster",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errors.New("tendril lab exec needs root (it enters a network namespace)")
			}
			var rec *lab.PodRecord
			var err error
			if args[0] == lab.WorldRef {
				rec, err = worldRecord(*name)
			} else {
				rec, err = labPod(*name, args[0])
			}
			if err != nil {
				return err
			}
			nsenter, err := exec.LookPath("nsenter")
			if err != nil {
				return errors.New("nsenter not found (apt-get install util-linux)")
			}
			// Replace this process, so the command's exit status, signals
			// and terminal are the caller's.
			command := args[1:]
			if command[0] == "--" {
				command = command[1:]
			}
			if len(command) == 0 {
				return errors.New("no command given: tendril lab exec NS/POD -- CMD [ARG...]")
			}
			argv := append([]string{"nsenter", "--net=" + rec.NetnsFile(), "--"}, command...)
			// The mount namespace with the pod's resolv.conf belongs to this
			// thread, which must be the one that execs.
			runtime.LockOSThread()
			if rec.ResolvConf != "" {
				if err := lab.MountPodResolvConf(rec.ResolvConf, lab.MachineResolvConf); err != nil {
					return fmt.Errorf("give %s its resolv.conf: %w", args[0], err)
				}
			}
			return syscall.Exec(nsenter, argv, os.Environ())
		},
	}
	// Everything after the pod belongs to the command, dash-dash or not.
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newLabProbeCommand(name *string) *cobra.Command {
	var udp, dnsTCP, useTLS, outside bool
	var timeout time.Duration
	broken := func(err error) error { return &ExitError{Code: probeBroken, Msg: "cannot probe: " + err.Error()} }
	cmd := &cobra.Command{
		Use:   "probe NS/POD|world HOST:PORT [--udp] [--dns-tcp] [--tls] [--outside-node-cgroup] [--timeout 1s]",
		Short: "Connect from inside a pod, or from the world's client address, and wait for an answer (exit 0 answered, 1 no connection or answer, 2+ could not probe)",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return broken(fmt.Errorf("want NS/POD HOST:PORT, got %d arguments", len(args)))
			}
			host, port, err := net.SplitHostPort(args[1])
			if err != nil {
				return broken(fmt.Errorf("%q: want HOST:PORT: %w", args[1], err))
			}
			if net.ParseIP(host) == nil && !validDNSName(host) {
				return broken(fmt.Errorf("%q: the host must be an IP address or a DNS name", args[1]))
			}
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				return broken(fmt.Errorf("%q: port must be 1-65535", args[1]))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return broken(errors.New("needs root (it enters the pod's network namespace)"))
			}
			if timeout <= 0 {
				return broken(fmt.Errorf("--timeout %s: must be positive", timeout))
			}
			var st *lab.State
			var rec *lab.PodRecord
			var source net.IP
			var err error
			world := args[0] == lab.WorldRef
			if world {
				// The world client: its own address, in no node's cgroup,
				// no cluster DNS.
				if rec, err = worldRecord(*name); err != nil {
					return broken(err)
				}
				source = net.ParseIP(rec.IPs[0])
				// An IPv6 target is dialled from the world's IPv6 client
				// (a dual-stack lab's).
				if host, _, serr := net.SplitHostPort(args[1]); serr == nil && len(rec.IPs) > 1 {
					if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
						source = net.ParseIP(rec.IPs[1])
					}
				}
				outside = true
			} else if st, rec, err = findLabPod(*name, args[0]); err != nil {
				return broken(err)
			}
			if world {
				err = lab.EnterRootCgroup()
			} else if outside {
				// In the pod's network namespace but in no node's cgroup:
				// socket load-balancing does not see the connection, the pod
				// programs' per-packet NAT must translate it.
				err = lab.EnterRootCgroup()
			} else {
				err = st.EnterPodCgroup(rec)
			}
			if err != nil {
				return broken(err)
			}
			var roots *x509.CertPool
			if useTLS {
				if st == nil {
					return broken(errors.New("--tls is for pods"))
				}
				if udp {
					return broken(errors.New("--tls is TCP only"))
				}
				pem, err := os.ReadFile(st.CAFile())
				if err != nil {
					return broken(fmt.Errorf("the lab's CA: %w", err))
				}
				roots = x509.NewCertPool()
				if !roots.AppendCertsFromPEM(pem) {
					return broken(fmt.Errorf("no certificate in %s", st.CAFile()))
				}
			}
			proto := "tcp"
			if udp {
				proto = "udp"
			}
			host, port, _ := net.SplitHostPort(args[1])
			var resolver *workload.Resolver
			if net.ParseIP(host) == nil {
				if world {
					return broken(errors.New("the world has no cluster DNS: give an address"))
				}
				if resolver, err = podResolver(rec, dnsTCP, timeout); err != nil {
					return broken(err)
				}
			}
			var answer, resolved string
			var resolveErr, probeErr error
			err = lab.InNetns(rec.NetnsFile(), func() error {
				target := args[1]
				if resolver != nil {
					// From the pod's namespace, to the pod's nameserver.
					addrs, fqdn, err := resolver.LookupIPv4(context.Background(), host)
					if err != nil {
						resolveErr = err
						return nil
					}
					target = net.JoinHostPort(addrs[0].String(), port)
					resolved = fmt.Sprintf(" (%s is %s, DNS over %s)", fqdn, addrs[0], map[bool]string{false: "UDP", true: "TCP"}[dnsTCP])
				}
				if roots != nil {
					answer, probeErr = workload.ProbeTLS(context.Background(), target, host, roots, timeout)
				} else {
					answer, probeErr = workload.ProbeFrom(context.Background(), source, target, udp, timeout)
				}
				return nil
			})
			if err != nil {
				return broken(err)
			}
			if resolveErr != nil {
				return &ExitError{Code: probeNoAnswer, Msg: fmt.Sprintf("%s -> %s/%s: %v", args[0], args[1], proto, resolveErr)}
			}
			if probeErr != nil {
				return &ExitError{Code: probeNoAnswer, Msg: fmt.Sprintf("%s -> %s/%s%s: no answer: %v", args[0], args[1], proto, resolved, probeErr)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s -> %s/%s%s: answered %q\n", args[0], args[1], proto, resolved, answer)
			return nil
		},
	}
	cmd.Flags().BoolVar(&udp, "udp", false, "Probe over UDP (default TCP)")
	cmd.Flags().BoolVar(&dnsTCP, "dns-tcp", false, "Resolve a HOST name with DNS queries over TCP (default UDP)")
	cmd.Flags().BoolVar(&useTLS, "tls", false, "TLS handshake verified against the lab's CA for HOST; the answer is the server certificate's common name")
	cmd.Flags().BoolVar(&outside, "outside-node-cgroup", false, "Probe from the machine's root cgroup, not the pod node's: Services are then translated per packet, not by socket load-balancing")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Second, "How long to wait for the connection and the answer")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return broken(err) })
	return cmd
}

func newLabPingCommand(name *string) *cobra.Command {
	var interval, duration, wait time.Duration
	var count int
	broken := func(err error) error { return &ExitError{Code: probeBroken, Msg: "cannot ping: " + err.Error()} }
	cmd := &cobra.Command{
		Use:   "ping NS/POD ADDRESS [--interval 10ms] [--count N] [--duration D]",
		Short: "Send ICMP echo requests from inside a pod on a fixed schedule until interrupted, --count or --duration; print ping's summary line, the rate and the longest gap between replies (exit 0 none lost, 1 some lost, 2+ could not ping)",
		Long: `Unlike ping -i, the requests keep to an absolute schedule: a late wake-up is
caught up, so the rate asked is the rate sent (iputils ping sends about 56 a
second on this machine when asked for 100). For traffic checks across restarts
and upgrades.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return broken(fmt.Errorf("want NS/POD ADDRESS, got %d arguments", len(args)))
			}
			if _, err := netip.ParseAddr(args[1]); err != nil {
				return broken(fmt.Errorf("%q: want an IP address: %w", args[1], err))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return broken(errors.New("needs root (a raw ICMP socket in the pod's network namespace)"))
			}
			if interval <= 0 || count < 0 || duration < 0 || wait < 0 {
				return broken(fmt.Errorf("--interval must be positive, --count, --duration and --wait not negative"))
			}
			dst := netip.MustParseAddr(args[1])
			_, rec, err := findLabPod(*name, args[0])
			if err != nil {
				return broken(err)
			}
			var conn *icmp.PacketConn
			if err := lab.InNetns(rec.NetnsFile(), func() (err error) { conn, err = pingstream.Listen(dst); return err }); err != nil {
				return broken(err)
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			if duration > 0 {
				var stop context.CancelFunc
				ctx, stop = context.WithTimeout(ctx, duration)
				defer stop()
			}
			st, err := pingstream.Run(ctx, conn, pingstream.Config{Dst: dst, Interval: interval, Count: count, Wait: wait})
			fmt.Fprint(cmd.OutOrStdout(), st.Summary())
			if err != nil {
				return broken(err)
			}
			if st.Received < st.Sent {
				return &ExitError{Code: probeNoAnswer, Msg: fmt.Sprintf("%s -> %s: %d of %d requests lost", args[0], dst, st.Sent-st.Received, st.Sent)}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Millisecond, "Time between two requests")
	cmd.Flags().IntVar(&count, "count", 0, "Stop after this many requests (0: until interrupted or --duration)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "Stop sending after this long (0: until interrupted or --count)")
	cmd.Flags().DurationVar(&wait, "wait", time.Second, "How long to wait for the last replies once sending stops")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return broken(err) })
	return cmd
}

func newLabKubeletCommand(name *string) *cobra.Command {
	var node string
	var schedule bool
	cmd := &cobra.Command{
		Use:    "kubelet --node NODE",
		Short:  "The lab's kubelet of one node (started by lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*name)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return kubelet.Run(ctx, kubelet.Config{Lab: st, Node: node, Schedule: schedule, Log: log})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "The node this kubelet runs")
	cmd.Flags().BoolVar(&schedule, "schedule", false, "Also bind unscheduled pods to nodes")
	return cmd
}

func newLabMetricsForwardCommand(name *string) *cobra.Command {
	return &cobra.Command{
		Use:    "metrics-forward",
		Short:  "Forward the lab Prometheus' loopback ports to the metrics of the agents and the relay in the node namespaces (started by lab up --prometheus)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*name)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			return lab.RunMetricsForward(ctx, st, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)))
		},
	}
}

func newLabNodeProxyCommand(name *string) *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:    "node-proxy --node NODE",
		Short:  "Forward the API server (and kvstore) into a real node's namespace (started by lab up --runtime containerd)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(*name)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return kubelet.RunProxies(ctx, kubelet.Config{Lab: st, Node: node, Log: log})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "The node whose namespace gets the proxies")
	return cmd
}

func newLabWorkloadCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "workload --pod-name NAME --tcp PORTS --udp PORTS",
		Short:  "A lab pod's server: answers every TCP connection and UDP datagram with the pod's name",
		Long:   "The same server as the tendril-workload binary, which the lab's kubelet starts per pod (flags: --pod-name, --tcp, --udp, --ready-fd, --address, --report-peer).",
		Hidden: true,
		// The flags are the workload package's, parsed there, so that
		// this command and tendril-workload cannot drift apart.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := signalContext(cmd)
			defer cancel()
			return workload.RunCommand(ctx, "tendril lab workload", args, cmd.ErrOrStderr())
		},
	}
}

// validDNSName accepts what a pod might look up: labels of letters,
// digits and dashes (underscores for SRV-style names), dot-separated,
// optionally rooted.
func validDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || strings.HasPrefix(l, "-") || strings.HasSuffix(l, "-") {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// podResolver resolves names as the pod does: its resolv.conf (written by
// the lab kubelet), queries sent from its network namespace.
func podResolver(rec *lab.PodRecord, tcp bool, timeout time.Duration) (*workload.Resolver, error) {
	if rec.ResolvConf == "" {
		return nil, fmt.Errorf("pod %s/%s does not use the cluster DNS (dnsPolicy), so its names cannot be resolved here", rec.Namespace, rec.Name)
	}
	f, err := os.Open(rec.ResolvConf)
	if err != nil {
		return nil, fmt.Errorf("the pod's resolv.conf: %w", err)
	}
	defer f.Close()
	conf, err := workload.ParseResolvConf(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rec.ResolvConf, err)
	}
	return &workload.Resolver{Config: conf, TCP: tcp, Timeout: timeout}, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
