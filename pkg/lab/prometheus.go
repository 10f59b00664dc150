package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
)

// Ports of the components' metrics with `lab up --prometheus`: each agent
// on its node address, the relay on node1's.
const (
	AgentMetricsPort = 9962
	RelayMetricsPort = 9965
)

// Prometheus is the lab's Prometheus (lab up --prometheus): Debian's
// prometheus in the machine's namespace on Port, scraping Targets.
type Prometheus struct {
	Port    int             `json:"port"`
	Targets []MetricsTarget `json:"targets"`
}

// MetricsTarget is one component's metrics endpoint. Prometheus scrapes
// 127.0.0.1:LocalPort; for a component in a node's namespace (Netns set)
// `tendril lab metrics-forward` forwards that port to Addr in there.
type MetricsTarget struct {
	Job       string `json:"job"`
	Name      string `json:"name"`
	Netns     string `json:"netns,omitempty"`
	Addr      string `json:"addr"`
	LocalPort int    `json:"localPort"`
}

// URL is the lab's Prometheus.
func (p *Prometheus) URL() string { return "http://127.0.0.1:" + strconv.Itoa(p.Port) + "/" }

// agentMetricsArgs are the agents' flags for the lab's Prometheus: the
// metrics endpoint on the node's address and every flow metric.
func agentMetricsArgs(n Node) []string {
	return []string{"--prometheus-serve-addr", net.JoinHostPort(n.Address, strconv.Itoa(AgentMetricsPort)),
		"--hubble-metrics", strings.Join(flowmetrics.All, ",")}
}

// planPrometheus picks the Prometheus port and a loopback port per node
// target; the operators' targets are added as they start.
func planPrometheus(st *State) error {
	taken := []int{st.APIPort, st.KVStorePort, st.UIPort}
	pick := func() (int, error) {
		p, err := freeport.Loopback(taken...)
		taken = append(taken, p)
		return p, err
	}
	port, err := pick()
	if err != nil {
		return err
	}
	st.Prometheus = &Prometheus{Port: port}
	for _, n := range st.Nodes {
		p, err := pick()
		if err != nil {
			return err
		}
		st.Prometheus.Targets = append(st.Prometheus.Targets, MetricsTarget{Job: "tendril-agent", Name: n.Name, Netns: n.Netns,
			Addr: net.JoinHostPort(n.Address, strconv.Itoa(AgentMetricsPort)), LocalPort: p})
	}
	p, err := pick()
	if err != nil {
		return err
	}
	n1 := st.Nodes[0]
	st.Prometheus.Targets = append(st.Prometheus.Targets, MetricsTarget{Job: "tendril-relay", Name: "relay", Netns: n1.Netns,
		Addr: net.JoinHostPort(n1.Address, strconv.Itoa(RelayMetricsPort)), LocalPort: p})
	return st.Save()
}

// operatorMetricsPort picks an operator's metrics port and adds its
// target.
func operatorMetricsPort(st *State, role string) (int, error) {
	taken := []int{st.APIPort, st.KVStorePort, st.UIPort, st.Prometheus.Port}
	for _, t := range st.Prometheus.Targets {
		taken = append(taken, t.LocalPort)
	}
	p, err := freeport.Loopback(taken...)
	if err != nil {
		return 0, err
	}
	st.Prometheus.Targets = append(st.Prometheus.Targets, MetricsTarget{Job: "tendril-operator", Name: role,
		Addr: "127.0.0.1:" + strconv.Itoa(p), LocalPort: p})
	return p, st.Save()
}

// prometheusConfig is prometheus.yml: one job per component, each target
// labelled with its node (or replica) name.
func prometheusConfig(p *Prometheus) string {
	var b strings.Builder
	b.WriteString("# Written by tendril lab up --prometheus.\nglobal:\n  scrape_interval: 5s\n  evaluation_interval: 5s\nscrape_configs:\n")
	jobs := []string{}
	for _, t := range p.Targets {
		if !contains(jobs, t.Job) {
			jobs = append(jobs, t.Job)
		}
	}
	for _, j := range jobs {
		fmt.Fprintf(&b, "- job_name: %s\n  static_configs:\n", j)
		for _, t := range p.Targets {
			if t.Job == j {
				fmt.Fprintf(&b, "  - targets: ['127.0.0.1:%d']\n    labels: {name: %s}\n", t.LocalPort, t.Name)
			}
		}
	}
	return b.String()
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// startPrometheus starts the forwarder of the node targets and Debian's
// prometheus, and waits until every target is scraped.
func startPrometheus(ctx context.Context, st *State, exited map[string]<-chan error) error {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		return errors.New("prometheus not found: apt-get install prometheus (hack/install-deps.sh installs it)")
	}
	p := st.Prometheus
	fwd, _, err := StartDetached(st.PidDir(), "metrics-forward", filepath.Join(st.LogDir(), "metrics-forward.log"),
		[]string{filepath.Join(st.BinDir, "tendril"), "lab", "metrics-forward", "--name", st.Name})
	if err != nil {
		return err
	}
	exited["metrics-forward"] = watchExit(fwd)
	dir := filepath.Join(st.Dir, "prometheus")
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(prometheusConfig(p)), 0o644); err != nil {
		return err
	}
	cmd, _, err := StartDetached(st.PidDir(), "prometheus", filepath.Join(st.LogDir(), "prometheus.log"), []string{bin,
		"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:" + strconv.Itoa(p.Port)})
	if err != nil {
		return err
	}
	exited["prometheus"] = watchExit(cmd)
	hc := &http.Client{Timeout: 2 * time.Second}
	return poll(ctx, "wait for prometheus to scrape every component", 90*time.Second, st,
		map[string]<-chan error{"prometheus": exited["prometheus"], "metrics-forward": exited["metrics-forward"]}, func() (bool, error) {
			up, err := PrometheusTargetsUp(hc, p)
			if err != nil {
				return false, err
			}
			if up != len(p.Targets) {
				return false, fmt.Errorf("prometheus: %d of %d targets up", up, len(p.Targets))
			}
			return true, nil
		})
}

// PrometheusTargetsUp counts the targets the lab's Prometheus scraped
// successfully last.
func PrometheusTargetsUp(hc *http.Client, p *Prometheus) (int, error) {
	resp, err := hc.Get(p.URL() + "api/v1/targets")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
				ScrapeURL string `json:"scrapeUrl"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("prometheus targets: %w", err)
	}
	up := 0
	var errs []string
	for _, t := range out.Data.ActiveTargets {
		if t.Health == "up" {
			up++
		} else if t.LastError != "" {
			errs = append(errs, t.ScrapeURL+": "+t.LastError)
		}
	}
	if len(errs) > 0 && up < len(out.Data.ActiveTargets) {
		return up, fmt.Errorf("prometheus: %d of %d targets up: %s", up, len(out.Data.ActiveTargets), strings.Join(errs, "; "))
	}
	return up, nil
}

// RunMetricsForward forwards each node target's loopback port to its
// address in the node's namespace until ctx ends: the sockets to the
// targets are made in the node's namespace, the listeners in the
// machine's, where Prometheus runs.
func RunMetricsForward(ctx context.Context, st *State, log *slog.Logger) error {
	if st.Prometheus == nil {
		return errors.New("the lab has no Prometheus (lab up --prometheus)")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, t := range st.Prometheus.Targets {
		if t.Netns == "" {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(t.LocalPort))
		if err != nil {
			return fmt.Errorf("forward %s %s: %w", t.Job, t.Name, err)
		}
		go func() { <-ctx.Done(); ln.Close() }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go forward(c, t, log)
			}
		}()
	}
	<-ctx.Done()
	return nil
}

func forward(c net.Conn, t MetricsTarget, log *slog.Logger) {
	defer c.Close()
	var up net.Conn
	err := InNetns(NetnsPath(t.Netns), func() error {
		var err error
		up, err = net.DialTimeout("tcp", t.Addr, 5*time.Second)
		return err
	})
	if err != nil {
		log.Warn("Cannot reach a metrics target", "job", t.Job, "name", t.Name, "addr", t.Addr, "error", err)
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
