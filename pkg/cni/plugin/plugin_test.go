package plugin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/delqueue"
)

// invoke runs the plugin with env and stdin and returns its exit code and
// output.
func invoke(t *testing.T, env map[string]string, stdin string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(Env{
		Getenv: func(k string) string { return env[k] },
		Stdin:  strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr,
		Timeout: 10 * time.Second,
	}, "tendril-cni test")
	return code, stdout.String(), stderr.String()
}

// printedError decodes the CNI error the plugin printed.
func printedError(t *testing.T, stdout string) *cni.Error {
	t.Helper()
	var e cni.Error
	if err := json.Unmarshal([]byte(stdout), &e); err != nil || e.Code == 0 {
		t.Fatalf("stdout %q is not a CNI error: %v", stdout, err)
	}
	return &e
}

func addEnv(socketConf string) (map[string]string, string) {
	env := map[string]string{
		"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x",
		"CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"net","type":"tendril-cni","agent-socket":%q}`, socketConf)
	return env, conf
}

func TestVersionAndAbout(t *testing.T) {
	code, out, _ := invoke(t, map[string]string{"CNI_COMMAND": "VERSION"}, "")
	if code != 0 {
		t.Fatalf("VERSION exit %d: %s", code, out)
	}
	var info struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	if info.CNIVersion != "1.1.0" || strings.Join(info.SupportedVersions, ",") != "0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Errorf("VERSION answered %s", out)
	}
	code, out, errOut := invoke(t, map[string]string{}, "")
	if code != 0 || out != "" || !strings.Contains(errOut, "tendril-cni test") || !strings.Contains(errOut, "1.1.0") {
		t.Errorf("without CNI_COMMAND: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestInvocationErrors: what the plugin refuses before talking to the
// agent, with the spec's codes (no agent socket exists here, so reaching
// the agent would be code 11).
func TestInvocationErrors(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none.sock")
	env, conf := addEnv(none)
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range env {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	confWith := func(extra string) string { return strings.TrimSuffix(conf, "}") + "," + extra + "}" }
	cases := []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
	}{
		{"unknown command", with("CNI_COMMAND", "FROB"), conf, cni.ErrInvalidEnvironmentVariables},
		{"no container ID", with("CNI_CONTAINERID", ""), conf, cni.ErrInvalidEnvironmentVariables},
		{"bad container ID", with("CNI_CONTAINERID", "-x/y"), conf, cni.ErrInvalidEnvironmentVariables},
		{"no netns", with("CNI_NETNS", ""), conf, cni.ErrInvalidEnvironmentVariables},
		{"ifname too long", with("CNI_IFNAME", "sixteen-chars-xx"), conf, cni.ErrInvalidEnvironmentVariables},
		{"ifname with slash", with("CNI_IFNAME", "a/b"), conf, cni.ErrInvalidEnvironmentVariables},
		{"no path", with("CNI_PATH", ""), conf, cni.ErrInvalidEnvironmentVariables},
		{"not json", env, `{"cniVersion":`, cni.ErrDecodingFailure},
		{"mtu not a number", env, confWith(`"mtu":"large"`), cni.ErrDecodingFailure},
		{"no name", env, `{"cniVersion":"1.0.0","type":"tendril-cni"}`, cni.ErrInvalidNetworkConfig},
		{"bad name", env, `{"cniVersion":"1.0.0","name":"a b","type":"tendril-cni"}`, cni.ErrInvalidNetworkConfig},
		{"unknown version", env, `{"cniVersion":"9.9.9","name":"n","type":"tendril-cni"}`, cni.ErrIncompatibleCNIVersion},
		{"no version", env, `{"name":"n","type":"tendril-cni"}`, cni.ErrIncompatibleCNIVersion},
		{"CHECK with 0.3.1", with("CNI_COMMAND", "CHECK"), `{"cniVersion":"0.3.1","name":"n","type":"tendril-cni"}`, cni.ErrIncompatibleCNIVersion},
		{"GC with 1.0.0", with("CNI_COMMAND", "GC"), conf, cni.ErrIncompatibleCNIVersion},
		// GC without its list of valid attachments must not reach the
		// agent as "nothing is valid".
		{"GC without valid attachments", with("CNI_COMMAND", "GC"), strings.Replace(conf, "1.0.0", "1.1.0", 1), cni.ErrInvalidNetworkConfig},
		{"GC with null valid attachments", with("CNI_COMMAND", "GC"), strings.Replace(confWith(`"cni.dev/valid-attachments":null`), "1.0.0", "1.1.0", 1), cni.ErrInvalidNetworkConfig},
		{"GC with valid attachments, agent down", with("CNI_COMMAND", "GC"), strings.Replace(confWith(`"cni.dev/valid-attachments":[]`), "1.0.0", "1.1.0", 1), cni.ErrTryAgainLater},
		{"other type", env, `{"cniVersion":"1.0.0","name":"n","type":"bridge"}`, cni.ErrInvalidNetworkConfig},
		{"mtu out of range", env, confWith(`"mtu":100`), cni.ErrInvalidNetworkConfig},
		{"relative socket", env, `{"cniVersion":"1.0.0","name":"n","type":"tendril-cni","agent-socket":"x.sock"}`, cni.ErrInvalidNetworkConfig},
		{"agent down", env, conf, cni.ErrTryAgainLater},
		{"STATUS, agent down", with("CNI_COMMAND", "STATUS"), strings.Replace(conf, "1.0.0", "1.1.0", 1), cni.ErrPluginNotAvailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, _ := invoke(t, c.env, c.stdin)
			if code != 1 {
				t.Fatalf("exit %d, want 1 (stdout %q)", code, out)
			}
			if e := printedError(t, out); e.Code != c.code {
				t.Errorf("code %d (%s), want %d", e.Code, e.Error(), c.code)
			}
		})
	}
}

// fakeAgent serves handler on a unix socket: the agent's answers, canned.
// (The real agent behind the plugin is tested in test/cni.)
func fakeAgent(t *testing.T, handler http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestForwardsToAgent(t *testing.T) {
	const result = "{\n    \"cniVersion\": \"1.0.0\",\n    \"ips\": []\n}\n"
	var got cni.Request
	var gotPath string
	sock := fakeAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Path
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		switch r.URL.Path {
		case "/v1/cni/add":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, result)
		case "/v1/cni/del":
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	env, conf := addEnv("unix://" + sock)
	code, out, _ := invoke(t, env, conf)
	if code != 0 || out != result {
		t.Fatalf("ADD: exit %d, stdout %q, want the agent's result unchanged", code, out)
	}
	if gotPath != "/v1/cni/add" || got.ContainerID != "c1" || got.Netns != "/run/netns/x" || got.IfName != "eth0" ||
		got.Args != env["CNI_ARGS"] || got.Path != "/opt/cni/bin" || string(got.Config) != conf || got.PluginNetNS == "" {
		t.Errorf("agent got %s %+v", gotPath, got)
	}
	env["CNI_COMMAND"] = "DEL"
	delete(env, "CNI_NETNS") // DEL does not need one
	if code, out, _ := invoke(t, env, conf); code != 0 || out != "" || gotPath != "/v1/cni/del" {
		t.Errorf("DEL: exit %d, stdout %q, path %s", code, out, gotPath)
	}
}

// TestAgentAnswers: the agent's CNI errors are printed as they are; other
// failures get a code for what they mean.
func TestAgentAnswers(t *testing.T) {
	cases := []struct {
		name    string
		command string
		status  int
		body    string
		code    uint
		msg     string
	}{
		{"CNI error", "ADD", 500, `{"code":100,"msg":"allocate pod address for ns/p","details":"pool exhausted"}`, cni.ErrAllocation, "allocate pod address for ns/p"},
		{"CNI error on 400", "ADD", 400, `{"code":4,"msg":"CNI_NETNS \"/x\": cannot open"}`, cni.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"agent starting", "ADD", 503, `"endpoints and IPAM are not started yet"`, cni.ErrTryAgainLater, "not ready"},
		{"agent starting, STATUS", "STATUS", 503, `"endpoints and IPAM are not started yet"`, cni.ErrPluginNotAvailable, "not ready"},
		{"old agent", "ADD", 404, `"no such API path"`, cni.ErrAgent, "does not serve /v1/cni/add"},
		{"garbage", "DEL", 502, `<html>`, cni.ErrAgent, "unusable answer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sock := fakeAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.body)
			}))
			env, conf := addEnv(sock)
			env["CNI_COMMAND"] = c.command
			conf = strings.Replace(conf, "1.0.0", "1.1.0", 1)
			code, out, _ := invoke(t, env, conf)
			if code != 1 {
				t.Fatalf("exit %d, stdout %q", code, out)
			}
			e := printedError(t, out)
			if e.Code != c.code || !strings.Contains(e.Msg, c.msg) {
				t.Errorf("printed %+v, want code %d and %q in msg", e, c.code, c.msg)
			}
			if e.CNIVersion != "1.1.0" {
				t.Errorf("error's cniVersion %q, want the configuration's", e.CNIVersion)
			}
		})
	}
}

func TestReadResponse(t *testing.T) {
	cases := []struct {
		name, raw string
		status    int
		body      string
		bad       bool
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", 200, "hello", false},
		{"chunked", "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n", 201, "hello world", false},
		{"until EOF", "HTTP/1.0 500 Internal Server Error\r\n\r\n\"boom\"", 500, `"boom"`, false},
		{"no content", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 204, "", false},
		{"LF only", "HTTP/1.1 200 OK\nContent-Length: 2\n\nok", 200, "ok", false},
		{"bad status line", "HTTP/2 200\r\n\r\n", 0, "", true},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", true},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0, "", true},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "", true},
		{"truncated headers", "HTTP/1.1 200 OK\r\nContent-Len", 0, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body, err := readResponse(bufio.NewReader(strings.NewReader(c.raw)))
			if c.bad {
				if err == nil {
					t.Fatalf("accepted %q", c.raw)
				}
				return
			}
			if err != nil || status != c.status || string(body) != c.body {
				t.Errorf("got %d %q %v, want %d %q", status, body, err, c.status, c.body)
			}
		})
	}
}

func TestLogFile(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "cni.log")
	env, _ := addEnv("")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"n","type":"tendril-cni","agent-socket":%q,"log-file":%q}`,
		filepath.Join(t.TempDir(), "none.sock"), logFile)
	if code, _, _ := invoke(t, env, conf); code != 1 {
		t.Fatal("ADD without an agent succeeded")
	}
	raw, err := os.ReadFile(logFile)
	data := string(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(data, "command=ADD") || !strings.Contains(data, "container=c1") || !strings.Contains(data, "code=11") {
		t.Errorf("log line %q", data)
	}
}

// TestDelWithoutAgent: DEL succeeds when no agent listens on the socket
// (none there, or a stale socket file nobody accepts on) and says so in
// the log file; ADD without an agent still asks the runtime to try again.
// The runtime would otherwise retry DEL for as long as no agent runs: a
// pod stays Terminating forever after the agent is uninstalled.
func TestDelWithoutAgent(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the file stays, nobody accepts: ECONNREFUSED
	for name, sock := range map[string]string{"no socket": filepath.Join(dir, "none.sock"), "stale socket": stale} {
		t.Run(name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "cni.log")
			env, conf := addEnv(sock)
			conf = strings.Replace(conf, `"agent-socket"`, fmt.Sprintf(`"log-file":%q,"agent-socket"`, logFile), 1)
			env["CNI_COMMAND"] = "DEL"
			if code, out, errOut := invoke(t, env, conf); code != 0 {
				t.Fatalf("DEL without an agent: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			b, err := os.ReadFile(logFile)
			if err != nil || !strings.Contains(string(b), "done without the agent") {
				t.Errorf("log file %q (%v) does not say the DEL ran without the agent", b, err)
			}
			// Recorded for the agent, beside its socket.
			entries, errs := delqueue.List(delqueue.Dir(sock))
			if len(errs) != 0 || len(entries) != 1 || !strings.Contains(string(entries[0].Body), `"container-id":"c1"`) {
				t.Errorf("delete queue %v %v, want the DEL's request", entries, errs)
			}
			for _, e := range entries {
				_ = delqueue.Remove(e)
			}
			env["CNI_COMMAND"] = "ADD"
			code, out, _ := invoke(t, env, conf)
			if code != 1 {
				t.Fatalf("ADD without an agent: exit %d, stdout %q", code, out)
			}
			if e := printedError(t, out); e.Code != cni.ErrTryAgainLater {
				t.Errorf("ADD without an agent printed %+v, want code %d", e, cni.ErrTryAgainLater)
			}
		})
	}
}
