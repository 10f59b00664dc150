package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tendril-net/tendril/pkg/freeport"
)

// UIURL is the address of the lab's web UI (tendril ui), "" when the lab
// runs none.
func (s *State) UIURL() string {
	if s.UIPort == 0 {
		return ""
	}
	return "http://127.0.0.1:" + strconv.Itoa(s.UIPort) + "/"
}

// startUI runs `tendril ui` in the machine's namespace on a free loopback
// port, over the lab's relay socket, with node1's agent API for what-if.
// It waits until the UI reads flows from the relay.
func startUI(ctx context.Context, st *State, exited map[string]<-chan error) error {
	avoid := []int{st.APIPort, st.KVStorePort}
	if p := st.Prometheus; p != nil {
		avoid = append(avoid, p.Port)
		for _, t := range p.Targets {
			avoid = append(avoid, t.LocalPort)
		}
	}
	port, err := freeport.Loopback(avoid...)
	if err != nil {
		return fmt.Errorf("pick the UI's port: %w", err)
	}
	st.UIPort = port
	if err := st.Save(); err != nil {
		return err
	}
	argv := []string{filepath.Join(st.BinDir, "tendril"), "ui",
		"--relay", "unix://" + st.RelaySocket(),
		"--listen", "127.0.0.1:" + strconv.Itoa(port),
		"--agent", st.Nodes[0].Socket}
	cmd, _, err := StartDetached(st.PidDir(), "ui", filepath.Join(st.LogDir(), "ui.log"), argv)
	if err != nil {
		return err
	}
	exited["ui"] = watchExit(cmd)
	hc := &http.Client{Timeout: 2 * time.Second}
	return poll(ctx, "wait for the UI to read the relay", 60*time.Second, st, map[string]<-chan error{"ui": exited["ui"]}, func() (bool, error) {
		resp, err := hc.Get(st.UIURL() + "api/status")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		var status struct {
			Connected bool
			Error     string
		}
		if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
			return false, fmt.Errorf("the UI's status: %w", err)
		}
		if !status.Connected {
			return false, fmt.Errorf("the UI does not reach the relay: %s", status.Error)
		}
		return true, nil
	})
}
