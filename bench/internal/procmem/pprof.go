package procmem

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/tendril-net/tendril/pkg/namedns"
)

// PprofGet fetches path (such as /debug/pprof/heap?gc=1) from the pprof
// server at addr inside the network namespace at netnsPath, where the
// benchmarks' agents serve it on loopback. The connection is made on a
// thread inside the namespace; HTTP runs over it from here.
func PprofGet(netnsPath, addr, path string) ([]byte, error) {
	var conn net.Conn
	if err := namedns.InNetns(netnsPath, func() (err error) {
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		return nil, fmt.Errorf("dial the agent's pprof in %s: %w", netnsPath, err)
	}
	defer conn.Close()
	// A heap profile after a forced GC of a 2 GiB heap takes a while.
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: agent\r\n\r\n", path); err != nil {
		return nil, fmt.Errorf("request %s: %w", path, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return body, nil
}
