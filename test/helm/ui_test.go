package helm

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tendril-net/tendril/pkg/cli"
	"github.com/tendril-net/tendril/pkg/hubble/relay"
)

// containerArgs are the first container's command and args of a workload.
func containerArgs(t *testing.T, o *unstructured.Unstructured) (command, args []string) {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s %s has no container", o.GetKind(), o.GetName())
	}
	c := cs[0].(map[string]any)
	command, _, _ = unstructured.NestedStringSlice(c, "command")
	args, _, _ = unstructured.NestedStringSlice(c, "args")
	return command, args
}

// relayConfig decodes the relay's arguments as its hive would.
func relayConfig(t *testing.T, args []string) relay.Config {
	t.Helper()
	var got relay.Config
	h := hive.New(cell.Config(relay.DefaultConfig), cell.Invoke(func(c relay.Config) { got = c }))
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	h.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the relay refuses the chart's arguments %q: %v", args, err)
	}
	if err := h.Populate(slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("the relay's configuration from %q: %v", args, err)
	}
	return got
}

// TestUIAndRelayArgs: with the UI on (ui-relay-tls, and the defaults with
// --set ui.enabled=true), the UI Deployment's arguments parse with `tendril
// ui`'s flags and name the relay's Service and port; when the relay serves
// TLS, the UI carries the client certificate of its Secret and checks the
// name the relay's certificate must carry, and the relay's arguments pass
// its own checks (client certificates required); without relay TLS the UI
// has no TLS flag. With the UI off there is no UI Deployment.
func TestUIAndRelayArgs(t *testing.T) {
	for name, args := range map[string][]string{
		"ui-relay-tls":           {"-f", "../../deploy/helm/values/ui-relay-tls.yaml"},
		"ui-plain":               {"--set", "ui.enabled=true"},
		"ui-plain-no-hubble-tls": {"--set", "ui.enabled=true", "--set", "hubble.tls.enabled=false"},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := render(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			objs := decode(t, data)
			_, rArgs := containerArgs(t, find(t, objs, "Deployment", "tendril-relay"))
			rc := relayConfig(t, rArgs)
			if err := rc.Validate(); err != nil {
				t.Fatalf("the relay refuses the chart's configuration: %v", err)
			}
			relayTLS := rc.TLSRelayServerCertFile != ""

			dep := find(t, objs, "Deployment", "tendril-ui")
			command, uiArgs := containerArgs(t, dep)
			if strings.Join(command, " ") != "/usr/local/bin/tendril ui" {
				t.Errorf("UI command %q", command)
			}
			var ui *pflag.FlagSet
			root := cli.NewRootCommand()
			for _, c := range root.Commands() {
				if c.Name() == "ui" {
					if err := c.ParseFlags(uiArgs); err != nil {
						t.Fatalf("tendril ui refuses the chart's arguments %q: %v", uiArgs, err)
					}
					ui = c.Flags()
				}
			}
			if ui == nil {
				t.Fatal("no ui command")
			}
			svc := find(t, objs, "Service", "hubble-relay")
			ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			port := fmt.Sprint(ports[0].(map[string]any)["port"])
			if r, _ := ui.GetString("relay"); r != "hubble-relay."+namespace+".svc:"+port {
				t.Errorf("--relay %q, not the relay's Service on port %s", r, port)
			}
			cas, _ := ui.GetStringSlice("tls-relay-server-ca-files")
			cert, _ := ui.GetString("tls-client-cert-file")
			key, _ := ui.GetString("tls-client-key-file")
			sn, _ := ui.GetString("tls-relay-server-name")
			if !relayTLS {
				if len(cas) > 0 || cert != "" || key != "" || sn != "" {
					t.Errorf("TLS flags %q against a plain-text relay", uiArgs)
				}
				return
			}
			if len(cas) != 1 || cert == "" || key == "" || sn != "hubble-relay."+namespace+".svc" {
				t.Errorf("UI TLS flags %q against a relay requiring client certificates", uiArgs)
			}
			vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
			if len(vols) != 1 {
				t.Fatalf("UI volumes %v", vols)
			}
			if s, _, _ := unstructured.NestedString(vols[0].(map[string]any), "secret", "secretName"); s != "hubble-ui-client-certs" {
				t.Errorf("UI certificates from Secret %q", s)
			}
		})
	}
	data, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decode(t, data) {
		if strings.HasPrefix(o.GetName(), "tendril-ui") {
			t.Errorf("%s %s rendered with the UI off", o.GetKind(), o.GetName())
		}
	}
	if _, err := render(t, "--set", "ui.enabled=true", "--set", "hubble.relay.enabled=false"); err == nil || !strings.Contains(err.Error(), "ui.enabled needs") {
		t.Errorf("the UI without the relay: %v", err)
	}
}
