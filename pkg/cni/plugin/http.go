package plugin

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxAnswer bounds the agent's answer (a CNI result is a few hundred bytes).
const maxAnswer = 16 << 20

// post sends one HTTP/1.1 POST with a JSON body to the agent's unix socket
// and returns the answer's status and body. One request per connection
// ("Connection: close"), so the answer ends at its Content-Length, at the
// last chunk or at EOF. net/http would do the same; this exists because a
// plugin process is started for every pod attachment and the plugin
// should link and initialise as little as possible.
func post(socket, path string, body []byte, deadline time.Time) (int, []byte, error) {
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("unix", socket)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: tendril-agent\r\nUser-Agent: tendril-cni\r\n"+
		"Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		path, len(body))
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return 0, nil, fmt.Errorf("send %s: %w", path, err)
	}
	status, answer, err := readResponse(bufio.NewReader(conn))
	if err != nil {
		return 0, nil, fmt.Errorf("read the answer to %s: %w", path, err)
	}
	return status, answer, nil
}

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
