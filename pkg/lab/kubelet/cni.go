package kubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// nodeExec runs CNI plugins inside the node's network namespace through
// nsenter, as a container runtime on that node would run them.
type nodeExec struct {
	netnsPath string
	decoder   version.PluginDecoder
}

func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, "nsenter", "--net="+e.netnsPath, pluginPath)
	c.Env = environ
	c.Stdin = bytes.NewReader(stdinData)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		perr := &types.Error{}
		if jerr := json.Unmarshal(stdout.Bytes(), perr); jerr != nil || (perr.Code == 0 && perr.Msg == "") {
			return nil, fmt.Errorf("plugin %s: %w: stdout %q stderr %q", pluginPath, err, stdout.String(), strings.TrimSpace(stderr.String()))
		}
		return nil, perr
	}
	return stdout.Bytes(), nil
}

func (e *nodeExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *nodeExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return e.decoder.Decode(jsonBytes)
}

// cniRuntime is the node's CNI runtime: tendril-cni talking to the node's
// agent, results cached for DEL.
type cniRuntime struct {
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newCNIRuntime(binDir, cacheDir, nodeNetns, agentSocket, logFile string) (*cniRuntime, error) {
	raw, err := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "tendril",
		"plugins": []any{map[string]any{"type": "tendril-cni", "agent-socket": agentSocket, "log-file": logFile}},
	})
	if err != nil {
		return nil, err
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("CNI configuration: %w", err)
	}
	return &cniRuntime{
		cni:  libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, &nodeExec{netnsPath: nodeNetns}),
		list: list,
	}, nil
}

// attachment is what a kubelet passes the plugin for one pod sandbox.
type attachment struct {
	ContainerID, NetnsPath, Namespace, Name, UID string
}

func (a attachment) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: a.ContainerID,
		NetNS:       a.NetnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", a.Namespace},
			{"K8S_POD_NAME", a.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", a.ContainerID},
			{"K8S_POD_UID", a.UID},
		},
	}
}

// add runs ADD and returns the pod's addresses.
func (r *cniRuntime) add(ctx context.Context, a attachment) ([]string, error) {
	res, err := r.cni.AddNetworkList(ctx, r.list, a.runtimeConf())
	if err != nil {
		return nil, fmt.Errorf("CNI ADD: %w", err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD result: %w", err)
	}
	var ips []string
	for _, ip := range cur.IPs {
		ips = append(ips, ip.Address.IP.String())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD gave no address")
	}
	return ips, nil
}

// del runs DEL (repeatable: a missing attachment is success).
func (r *cniRuntime) del(ctx context.Context, a attachment) error {
	if err := r.cni.DelNetworkList(ctx, r.list, a.runtimeConf()); err != nil {
		return fmt.Errorf("CNI DEL: %w", err)
	}
	return nil
}
