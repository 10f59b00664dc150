package hubble

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
)

// limitListener bounds the open connections of a listener: a connection
// past the bound is closed as soon as it is accepted, so that it fails at
// once on the client's side (rather than waiting in the kernel's backlog,
// as with a listener that stops accepting) and holds nothing of the
// server's.
type limitListener struct {
	net.Listener
	max    int64
	open   atomic.Int64
	log    *slog.Logger
	warned atomic.Bool
}

func newLimitListener(l net.Listener, max int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: l, max: int64(max), log: log}
}

// Accept returns the next connection within the bound.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			// Once per run of refusals: a flood must not flood the log.
			if !l.warned.Swap(true) {
				l.log.Warn("Hubble TCP connection refused: at the connection limit", "limit", l.max, "remote", c.RemoteAddr().String())
			}
			continue
		}
		l.warned.Store(false)
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its slot back when closed, once.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
