package option

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func newFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("state-dir", "/default/state", "")
	fs.String("socket", "/default/sock", "")
	fs.Bool("debug", false, "")
	fs.Duration("k8s-cache-sync-timeout", 0, "")
	return fs
}

func TestResolvePrecedence(t *testing.T) {
	dir := t.TempDir()
	write := func(k, v string) {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("state-dir", "/from/dir")
	write("socket", "/from/dir.sock")
	write("debug", "true")
	// A ConfigMap mount's hidden entries are skipped.
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TENDRIL_SOCKET": "/from/env.sock", "TENDRIL_STATE_DIR": "/from/env"}

	fs := newFlags()
	if err := fs.Parse([]string{"--state-dir", "/from/flag"}); err != nil {
		t.Fatal(err)
	}
	sources, err := Resolver{LookupEnv: mapEnv(env), ConfigDir: dir}.Resolve(fs)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key, want string
		source    Source
	}{
		{"state-dir", "/from/flag", SourceFlag},
		{"socket", "/from/env.sock", SourceEnv},
		{"debug", "true", SourceConfigDir},
		{"k8s-cache-sync-timeout", "0s", SourceDefault},
	}
	for _, tt := range tests {
		if got := fs.Lookup(tt.key).Value.String(); got != tt.want {
			t.Errorf("%s = %q, want %q", tt.key, got, tt.want)
		}
		if sources[tt.key] != tt.source {
			t.Errorf("%s source = %s, want %s", tt.key, sources[tt.key], tt.source)
		}
	}
}

func TestResolveInvalidValueNamesTheKey(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		dir     map[string]string
		wantErr string
	}{
		{"env", map[string]string{"TENDRIL_DEBUG": "maybe"}, nil, "debug (from environment TENDRIL_DEBUG)"},
		{"dir", nil, map[string]string{"k8s-cache-sync-timeout": "soon"}, "k8s-cache-sync-timeout"},
		{"unknown key in dir", nil, map[string]string{"no-such-option": "1"}, "unknown option no-such-option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for k, v := range tt.dir {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fs := newFlags()
			_ = fs.Parse(nil)
			_, err := Resolver{LookupEnv: mapEnv(tt.env), ConfigDir: dir}.Resolve(fs)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestResolveMissingConfigDir(t *testing.T) {
	fs := newFlags()
	_ = fs.Parse(nil)
	_, err := Resolver{LookupEnv: mapEnv(nil), ConfigDir: "/nonexistent/tendril-config"}.Resolve(fs)
	if err == nil || !strings.Contains(err.Error(), "read config directory") {
		t.Fatalf("error = %v", err)
	}
}

func TestRuntimeApply(t *testing.T) {
	isKnown := func(k string) bool { return k == "state-dir" }
	tests := []struct {
		name        string
		options     map[string]string
		enforcement string
		wantErr     any
		want        RuntimeValues
	}{
		{"enforcement", nil, "always", nil, RuntimeValues{EnforcementAlways, false}},
		{"debug Enabled", map[string]string{"Debug": "Enabled"}, "", nil, RuntimeValues{EnforcementDefault, true}},
		{"debug true lower", map[string]string{"debug": "true"}, "never", nil, RuntimeValues{EnforcementNever, true}},
		{"bad mode", nil, "sometimes", errors.New(""), RuntimeValues{EnforcementDefault, false}},
		{"immutable", map[string]string{"state-dir": "/x"}, "always", &ErrImmutable{}, RuntimeValues{EnforcementDefault, false}},
		{"unknown", map[string]string{"Bogus": "1"}, "", &ErrUnknown{}, RuntimeValues{EnforcementDefault, false}},
		{"bad bool changes nothing", map[string]string{"Debug": "perhaps"}, "always", errors.New(""), RuntimeValues{EnforcementDefault, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := NewRuntime(RuntimeValues{PolicyEnforcement: EnforcementDefault})
			var notified []RuntimeValues
			rt.Subscribe(func(v RuntimeValues) { notified = append(notified, v) })
			err := rt.Apply(tt.options, tt.enforcement, isKnown)
			switch want := tt.wantErr.(type) {
			case nil:
				if err != nil {
					t.Fatalf("Apply: %v", err)
				}
				if len(notified) != 1 {
					t.Fatalf("subscribers called %d times", len(notified))
				}
			case *ErrImmutable:
				var e *ErrImmutable
				if !errors.As(err, &e) {
					t.Fatalf("error = %v, want ErrImmutable", err)
				}
			case *ErrUnknown:
				var e *ErrUnknown
				if !errors.As(err, &e) {
					t.Fatalf("error = %v, want ErrUnknown", err)
				}
			default:
				_ = want
				if err == nil {
					t.Fatal("want an error")
				}
			}
			if got := rt.Values(); got != tt.want {
				t.Fatalf("values = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}
