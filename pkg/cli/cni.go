package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/cni"
)

// cniInstall is what `tendril cni install` writes on a node: the plugin
// binary into the runtime's CNI bin directory and the network
// configuration list into its conf directory. The agent's DaemonSet runs it
// as an init container with both host directories mounted.
type cniInstall struct {
	Source      string // the plugin binary to copy (the image's tendril-cni)
	BinDir      string // the node's CNI bin directory (/opt/cni/bin)
	ConfDir     string // the node's CNI conf directory (/etc/cni/net.d)
	ConfName    string // the conflist's file name (05-tendril.conflist)
	AgentSocket string // where the plugin reaches the agent
	LogFile     string // the plugin's log file on the node ("": none)
	MTU         int    // 0: the agent's
}

// conflist is the network configuration the lab's kubelet uses too
// (pkg/lab/kubelet): one tendril-cni plugin that talks to the agent.
func (c cniInstall) conflist() ([]byte, error) {
	plugin := map[string]any{"type": cni.PluginType, "agent-socket": c.AgentSocket}
	if c.LogFile != "" {
		plugin["log-file"] = c.LogFile
	}
	if c.MTU != 0 {
		plugin["mtu"] = c.MTU
	}
	return json.MarshalIndent(map[string]any{"cniVersion": "1.1.0", "name": "tendril", "plugins": []any{plugin}}, "", "  ")
}

// install copies the binary, then writes the configuration, each through a
// temporary file renamed into place: a runtime never runs a half-written
// plugin nor reads a half-written configuration, and the configuration
// only appears once the plugin it names is there.
func (c cniInstall) install() error {
	if c.AgentSocket == "" || c.ConfName == "" {
		return errors.New("cni install: --agent-socket and --conf-name are required")
	}
	bin, err := os.ReadFile(c.Source)
	if err != nil {
		return fmt.Errorf("cni install: read plugin: %w", err)
	}
	if err := writeAtomic(filepath.Join(c.BinDir, cni.PluginType), bin, 0o755); err != nil {
		return fmt.Errorf("cni install: plugin: %w", err)
	}
	conf, err := c.conflist()
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(c.ConfDir, c.ConfName), append(conf, '\n'), 0o644); err != nil {
		return fmt.Errorf("cni install: configuration: %w", err)
	}
	return nil
}

// uninstall removes the configuration first (no new pod is given to a
// plugin about to go), then the binary; what is already gone is fine.
func (c cniInstall) uninstall() error {
	for _, p := range []string{filepath.Join(c.ConfDir, c.ConfName), filepath.Join(c.BinDir, cni.PluginType)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cni uninstall: %w", err)
		}
	}
	return nil
}

func writeAtomic(path string, data []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := errors.Join(tmp.Chmod(mode), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func newCNICommand(*Options) *cobra.Command {
	c := cniInstall{}
	cmd := &cobra.Command{Use: "cni", Short: "Install or remove the CNI plugin and its network configuration on this node"}
	cmd.PersistentFlags().StringVar(&c.BinDir, "cni-bin-dir", "/opt/cni/bin", "The node's CNI bin directory")
	cmd.PersistentFlags().StringVar(&c.ConfDir, "cni-conf-dir", "/etc/cni/net.d", "The node's CNI conf directory")
	cmd.PersistentFlags().StringVar(&c.ConfName, "conf-name", "05-tendril.conflist", "File name of the network configuration (the runtime uses the first in lexical order)")
	install := &cobra.Command{
		Use:   "install",
		Short: "Copy tendril-cni into the CNI bin directory and write its network configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.install(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %s and %s\n", filepath.Join(c.BinDir, cni.PluginType), filepath.Join(c.ConfDir, c.ConfName))
			return nil
		},
	}
	install.Flags().StringVar(&c.Source, "source", "/usr/local/bin/tendril-cni", "The plugin binary to copy")
	install.Flags().StringVar(&c.AgentSocket, "agent-socket", "/var/run/tendril/tendril.sock", "The agent's API socket, as the plugin (on the node) sees it")
	install.Flags().StringVar(&c.LogFile, "log-file", "", "The plugin's log file on the node (empty: none)")
	install.Flags().IntVar(&c.MTU, "mtu", 0, "MTU of pod devices (0: the agent's)")
	uninstall := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove the network configuration and tendril-cni from this node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.uninstall()
		},
	}
	cmd.AddCommand(install, uninstall)
	return cmd
}
