// Package plugin is tendril-cni, the CNI plugin process: it checks the
// invocation (CNI_* variables, the configuration's shape and cniVersion),
// answers VERSION itself, forwards every other command whole to the agent
// (POST /v1/cni/{command} on the agent's unix socket) and prints the
// agent's result or CNI error.
//
// The agent does the work (addresses, veth, routes, endpoint). The plugin
// stays small because the container runtime starts one plugin process per
// attachment: with 50 pods scheduled at once, 50 processes start on the
// node's CPUs together. It imports only the standard library and pkg/cni
// (no netlink, no Cilium models, not even package net: a few hundred
// lines of HTTP/1.1 over the socket system calls do), so the binary is
// statically linked and a process costs about what starting any static Go
// binary costs.
package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/delqueue"
)

// DefaultTimeout bounds one command, including the agent's synchronous
// endpoint build.
const DefaultTimeout = 2 * time.Minute

// Env is the process environment of one plugin run.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Timeout bounds the exchange with the agent; 0 is DefaultTimeout.
	Timeout time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// OS is the environment of the running process.
func OS() Env {
	return Env{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
}

// Main runs one CNI command and returns the process exit code: 0 on
// success, 1 after printing a CNI error on stdout (as the spec asks). about
// is printed on stderr when the plugin is run without CNI_COMMAND.
func Main(env Env, about string) int {
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Timeout <= 0 {
		env.Timeout = DefaultTimeout
	}
	r := &run{env: env, start: env.Now()}
	err := r.execute(about)
	r.writeLog(err)
	if err == nil {
		return 0
	}
	if err.CNIVersion == "" {
		err.CNIVersion = r.cniVersion()
	}
	out, mErr := json.MarshalIndent(err, "", "    ")
	if mErr != nil {
		out = []byte(fmt.Sprintf(`{"code":%d,"msg":%q}`, cni.ErrInternal, mErr.Error()))
	}
	_, _ = env.Stdout.Write(append(out, '\n'))
	return 1
}

// run is the state of one invocation.
type run struct {
	env     Env
	start   time.Time
	command string
	args    invocation
	conf    *netConf
	// delWithoutAgent: a DEL that found no agent listening and succeeded
	// without it (logged as such).
	delWithoutAgent bool
}

func (r *run) cniVersion() string {
	if r.conf != nil && slices.Contains(cni.SupportedVersions(), r.conf.CNIVersion) {
		return r.conf.CNIVersion
	}
	return cni.ImplementedVersion
}

func (r *run) execute(about string) *cni.Error {
	r.command = r.env.Getenv("CNI_COMMAND")
	switch r.command {
	case "":
		// Run by hand: say what this is, as the CNI library's plugins do.
		fmt.Fprintln(r.env.Stderr, about)
		fmt.Fprintf(r.env.Stderr, "CNI protocol versions supported: %s\n", strings.Join(cni.SupportedVersions(), ", "))
		return nil
	case "VERSION":
		return r.version()
	case cni.CommandAdd, cni.CommandDel, cni.CommandCheck, cni.CommandStatus, cni.CommandGC:
	default:
		return cni.Errorf(cni.ErrInvalidEnvironmentVariables, "unknown CNI_COMMAND: %s", r.command)
	}
	args, err := readInvocation(r.command, r.env.Getenv)
	if err != nil {
		return err
	}
	r.args = args
	stdin, rerr := io.ReadAll(r.env.Stdin)
	if rerr != nil {
		return cni.NewError(cni.ErrIOFailure, "read the network configuration from stdin", rerr.Error())
	}
	conf, err := checkConfig(r.command, stdin)
	r.conf = conf // also on error: its log-file and cniVersion still apply
	if err != nil {
		return err
	}
	socket, serr := socketPath(conf.AgentSocket)
	if serr != nil {
		return cni.NewError(cni.ErrInvalidNetworkConfig, "agent-socket", serr.Error())
	}
	req := cni.Request{
		ContainerID: args.containerID, Netns: args.netns, IfName: args.ifName,
		Args: args.args, Path: args.path, Config: stdin, PluginNetNS: ownNetNS(),
	}
	body, merr := json.Marshal(&req)
	if merr != nil {
		return cni.NewError(cni.ErrInternal, "encode the request to the agent", merr.Error())
	}
	status, answer, herr := post(socket, cni.CommandPath(r.command), body, r.start.Add(r.env.Timeout))
	if herr != nil {
		if r.command == cni.CommandDel && agentAbsent(herr) {
			// No agent listens (uninstalled, crashed, or restarting and
			// not serving yet). "Try again later" would hold the pod in
			// Terminating for as long as no agent comes back: forever
			// after `helm uninstall`. The DEL is recorded for the agent
			// and succeeds; the agent runs it once it has started (and
			// one that restarts also drops every restored endpoint whose
			// host veth went with the pod's namespace).
			if qerr := delqueue.Add(delqueue.Dir(socket), req.ContainerID, req.IfName, body); qerr != nil {
				return r.unreachable(socket, errors.Join(herr, qerr))
			}
			r.delWithoutAgent = true
			return nil
		}
		return r.unreachable(socket, herr)
	}
	if status/100 == 2 {
		if len(answer) > 0 {
			if _, werr := r.env.Stdout.Write(answer); werr != nil {
				return cni.NewError(cni.ErrIOFailure, "write the result", werr.Error())
			}
		}
		return nil
	}
	return r.agentError(socket, status, answer)
}

// version answers VERSION without the agent (and without reading stdin,
// as the spec allows).
func (r *run) version() *cni.Error {
	info := struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}{cni.ImplementedVersion, cni.SupportedVersions()}
	if err := json.NewEncoder(r.env.Stdout).Encode(info); err != nil {
		return cni.NewError(cni.ErrIOFailure, "write the version", err.Error())
	}
	return nil
}

// agentAbsent reports whether err says nothing listens on the agent's
// socket (no socket file, or nobody accepting on it), as opposed to an
// agent that took the request and did not answer in time.
func agentAbsent(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// unreachable is the error for an agent that did not answer: "try again
// later" (the agent may be restarting and the runtime retries), and for
// STATUS "not available", the code the spec gives STATUS for it.
func (r *run) unreachable(socket string, err error) *cni.Error {
	code := cni.ErrTryAgainLater
	if r.command == cni.CommandStatus {
		code = cni.ErrPluginNotAvailable
	}
	return cni.NewError(code, fmt.Sprintf("%s: agent not reachable at %s", r.command, socket), err.Error())
}

// agentError turns a non-2xx answer into the CNI error to print: the
// agent's own CNI error when the body is one, else a code for the status
// (an agent not started yet answers 503; an agent without the CNI
// endpoint 404).
func (r *run) agentError(socket string, status int, body []byte) *cni.Error {
	var e cni.Error
	if json.Unmarshal(body, &e) == nil && e.Code != 0 {
		return &e
	}
	var msg string
	if json.Unmarshal(body, &msg) != nil {
		msg = strings.TrimSpace(string(body))
	}
	details := fmt.Sprintf("HTTP %d: %s", status, msg)
	switch {
	case r.command == cni.CommandStatus:
		return cni.NewError(cni.ErrPluginNotAvailable, "STATUS: agent at "+socket+" is not ready", details)
	case status == 503:
		return cni.NewError(cni.ErrTryAgainLater, r.command+": agent at "+socket+" is not ready", details)
	case status == 404 || status == 405:
		return cni.NewError(cni.ErrAgent, r.command+": the agent at "+socket+" does not serve "+cni.CommandPath(r.command)+" (an agent older than this plugin?)", details)
	}
	return cni.NewError(cni.ErrAgent, r.command+": unusable answer from the agent at "+socket, details)
}

// writeLog appends one line per command to the configuration's log-file:
// the runtime keeps only stdout. Logging never fails a command.
func (r *run) writeLog(err *cni.Error) {
	if r.conf == nil || r.conf.LogFile == "" {
		return
	}
	f, oerr := os.OpenFile(r.conf.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if oerr != nil {
		return
	}
	defer f.Close()
	// One write of one buffered line, so lines of concurrent plugin
	// processes do not interleave.
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	attrs := []any{"pid", os.Getpid(), "command", r.command, "container", r.args.containerID,
		"ifname", r.args.ifName, "duration", r.env.Now().Sub(r.start)}
	switch {
	case err != nil:
		log.Warn("CNI command failed", append(attrs, "code", err.Code, "error", err.Error())...)
	case r.delWithoutAgent:
		log.Warn("CNI DEL done without the agent: none listens; the DEL is queued for it", attrs...)
	default:
		log.Info("CNI command done", attrs...)
	}
	_, _ = f.Write(buf.Bytes())
}

// ownNetNS identifies the plugin's network namespace as "device:inode";
// empty when /proc is not readable (the agent then cannot compare).
func ownNetNS() string {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// socketPath accepts "unix:///path", "unix:/path" or "/path".
func socketPath(s string) (string, error) {
	p := s
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	}
	if !strings.HasPrefix(p, "/") {
		return "", errors.New("agent socket " + s + ": want unix:///path or an absolute path")
	}
	return p, nil
}
