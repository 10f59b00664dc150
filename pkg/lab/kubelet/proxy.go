package kubelet

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
)

// listenInNetns opens a TCP listener inside another network namespace:
// the socket is created from a thread switched into it and stays there,
// while this process (and the connections it dials) stay in the machine's
// namespace.
func listenInNetns(netnsPath, addr string) (net.Listener, error) {
	var ln net.Listener
	err := lab.InNetns(netnsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// proxyTCP copies each connection accepted in the node's namespace
// to target on the machine's loopback (the API server, the lab's
// kvstore). TLS passes through
// untouched: the API server's certificate covers 127.0.0.1, which is the
// address the agent dials on its side too.
func proxyTCP(ctx context.Context, ln net.Listener, target string, log *slog.Logger) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("Accept", "error", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				log.Warn("Dial", "target", target, "error", err)
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				// Half-close so the other direction can finish.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(up, c)
			go pipe(c, up)
			wg.Wait()
		}()
	}
}
