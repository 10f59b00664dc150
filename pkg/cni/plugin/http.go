package plugin

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxAnswer bounds the agent's answer (a CNI result is a few hundred bytes).
const maxAnswer = 16 << 20

// post sends one HTTP/1.1 POST with a JSON body to the agent's unix socket
// and returns the answer's status and body. One request per connection
// ("Connection: close"), so the answer ends at its Content-Length, at the
// last chunk or at EOF.
//
// net/http (or even package net) would do the same; this uses the socket
// system calls directly because package net links the C library's
// resolver (cgo), which makes the binary dynamically linked: the dynamic
// loader and libc's start-up cost about 0.8 ms of CPU per process here,
// and a plugin process is started for every pod attachment.
func post(socket, path string, body []byte, deadline time.Time) (int, []byte, error) {
	c, err := dialUnix(socket, deadline)
	if err != nil {
		return 0, nil, err
	}
	defer c.close()
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: tendril-agent\r\nUser-Agent: tendril-cni\r\n"+
		"Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		path, len(body))
	req.Write(body)
	if err := c.writeAll(req.Bytes()); err != nil {
		return 0, nil, fmt.Errorf("send %s: %w", path, err)
	}
	status, answer, err := readResponse(bufio.NewReader(c))
	if err != nil {
		return 0, nil, fmt.Errorf("read the answer to %s: %w", path, err)
	}
	return status, answer, nil
}

// unixConn is a blocking unix stream socket whose reads and writes give up
// at a deadline.
type unixConn struct {
	fd       int
	deadline time.Time
}

func dialUnix(path string, deadline time.Time) (*unixConn, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	c := &unixConn{fd: fd, deadline: deadline}
	// A full listen backlog makes connect wait, bounded by the send
	// timeout.
	if err := c.setTimeout(syscall.SO_SNDTIMEO); err != nil {
		c.close()
		return nil, err
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	return c, nil
}

// setTimeout sets a socket timeout option to the time left until the
// deadline.
func (c *unixConn) setTimeout(opt int) error {
	left := time.Until(c.deadline)
	if left <= 0 {
		return errTimeout
	}
	tv := syscall.NsecToTimeval(left.Nanoseconds())
	if err := syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, opt, &tv); err != nil {
		return fmt.Errorf("set socket timeout: %w", err)
	}
	return nil
}

var errTimeout = errors.New("timed out waiting for the agent")

func (c *unixConn) writeAll(b []byte) error {
	for len(b) > 0 {
		if err := c.setTimeout(syscall.SO_SNDTIMEO); err != nil {
			return err
		}
		n, err := syscall.Write(c.fd, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return errTimeout
		case err != nil:
			return err
		}
		b = b[n:]
	}
	return nil
}

// Read implements io.Reader for bufio.
func (c *unixConn) Read(b []byte) (int, error) {
	for {
		if err := c.setTimeout(syscall.SO_RCVTIMEO); err != nil {
			return 0, err
		}
		n, err := syscall.Read(c.fd, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0, errTimeout
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *unixConn) close() { _ = syscall.Close(c.fd) }

// readResponse reads one HTTP/1.x response: status line, headers, body.
func readResponse(br *bufio.Reader) (int, []byte, error) {
	line, err := readLine(br)
	if err != nil {
		return 0, nil, err
	}
	proto, rest, _ := strings.Cut(line, " ")
	codeText, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(codeText)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || len(codeText) != 3 {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	length, chunked := -1, false
	for {
		h, err := readLine(br)
		if err != nil {
			return 0, nil, err
		}
		if h == "" {
			break
		}
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return 0, nil, fmt.Errorf("malformed header line %q", h)
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "content-length":
			if length, err = strconv.Atoi(v); err != nil || length < 0 {
				return 0, nil, fmt.Errorf("malformed Content-Length %q", v)
			}
		case "transfer-encoding":
			chunked = strings.Contains(strings.ToLower(v), "chunked")
		}
	}
	var body []byte
	switch {
	case chunked:
		body, err = readChunked(br)
	case length > maxAnswer:
		err = fmt.Errorf("answer of %d bytes is larger than %d", length, maxAnswer)
	case length >= 0:
		body = make([]byte, length)
		_, err = io.ReadFull(br, body)
	default:
		body, err = io.ReadAll(io.LimitReader(br, maxAnswer+1))
		if err == nil && len(body) > maxAnswer {
			err = fmt.Errorf("answer larger than %d bytes", maxAnswer)
		}
	}
	if err != nil {
		return 0, nil, err
	}
	return status, body, nil
}

// readChunked reads a chunked body up to its last chunk and trailer.
func readChunked(br *bufio.Reader) ([]byte, error) {
	var body []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, err
		}
		sizeText, _, _ := strings.Cut(line, ";") // chunk extensions are ignored
		size, err := strconv.ParseUint(strings.TrimSpace(sizeText), 16, 32)
		if err != nil {
			return nil, fmt.Errorf("malformed chunk size %q", line)
		}
		if size == 0 {
			for { // trailer fields up to the empty line
				t, err := readLine(br)
				if err != nil {
					return nil, err
				}
				if t == "" {
					return body, nil
				}
			}
		}
		if len(body)+int(size) > maxAnswer {
			return nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
		}
		chunk := make([]byte, size)
		if _, err := io.ReadFull(br, chunk); err != nil {
			return nil, err
		}
		body = append(body, chunk...)
		if crlf, err := readLine(br); err != nil || crlf != "" {
			return nil, errors.New("chunk not followed by CRLF")
		}
	}
}

// readLine reads one CRLF- (or LF-) terminated line without its end.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "", io.ErrUnexpectedEOF
		}
		return "", err
	}
	if len(line) > 64<<10 {
		return "", errors.New("header line too long")
	}
	return strings.TrimRight(line, "\r\n"), nil
}
