// Package rawcap captures every frame arriving at or leaving a network
// device, for tests that check what a datapath put on a wire: an AF_PACKET
// socket bound to the device, read by a goroutine until the capture stops.
package rawcap

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Capture is a running capture on one device.
type Capture struct {
	fd      int
	mu      sync.Mutex
	frames  [][]byte
	done    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

// ethPAll is ETH_P_ALL in network byte order, as the socket calls want it.
const ethPAll = uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8

// Start captures on device dev of the calling thread's network namespace
// (the socket stays in that namespace whatever the thread does next).
func Start(dev string) (*Capture, error) {
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return nil, fmt.Errorf("capture on %s: %w", dev, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(ethPAll))
	if err != nil {
		return nil, fmt.Errorf("capture on %s: packet socket: %w", dev, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: ethPAll, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("capture on %s: bind: %w", dev, err)
	}
	// A receive buffer of 8 MiB (forced: the tests run as root), so a
	// burst of GSO frames (up to 64 KiB each) is not dropped before the
	// reader takes it; best effort, the default stays if refused.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	// A read timeout, so the reader sees Stop within a tenth of a second.
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	c := &Capture{fd: fd, done: make(chan struct{}), stopped: make(chan struct{})}
	go c.read()
	return c, nil
}

func (c *Capture) read() {
	defer close(c.stopped)
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.done:
			return
		default:
		}
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue
		}
		c.mu.Lock()
		c.frames = append(c.frames, bytes.Clone(buf[:n]))
		c.mu.Unlock()
	}
}

// Frames returns the frames seen so far.
func (c *Capture) Frames() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.frames)
}

// Stop ends the capture (once; later calls only return) and returns every
// frame it saw.
func (c *Capture) Stop() [][]byte {
	c.once.Do(func() {
		close(c.done)
		<-c.stopped
		// Frames the kernel queued that the reader had not taken yet
		// (it may lag behind a busy machine's traffic) are seen too:
		// the socket is drained before it closes.
		buf := make([]byte, 65536)
		for {
			n, _, err := unix.Recvfrom(c.fd, buf, unix.MSG_DONTWAIT)
			if err != nil {
				break
			}
			c.mu.Lock()
			c.frames = append(c.frames, bytes.Clone(buf[:n]))
			c.mu.Unlock()
		}
		unix.Close(c.fd)
	})
	return c.Frames()
}
