// Package option resolves the agent's configuration from its sources (flags >
// environment TENDRIL_* > a config directory of one file per key, as a
// Kubernetes ConfigMap mounts it > defaults) and holds the options that may
// change at run time.
package option

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/pflag"
)

// Source names where an option's effective value came from.
type Source string

const (
	SourceDefault   Source = "default"
	SourceConfigDir Source = "config-dir"
	SourceEnv       Source = "env"
	SourceFlag      Source = "flag"
)

// EnvPrefix is the prefix of the options' environment variables (the
// agent's hive binds them with it too).
const EnvPrefix = "TENDRIL_"

// EnvName is the environment variable for a flag: TENDRIL_ + upper snake case
// (--state-dir → TENDRIL_STATE_DIR).
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flag))
}

// Resolver applies the sources to a flag set that has already parsed the
// command line.
type Resolver struct {
	// LookupEnv reads the environment; os.LookupEnv when nil.
	LookupEnv func(string) (string, bool)
	// ConfigDir is the directory of one file per key; empty means none.
	ConfigDir string
}

// Resolve sets every flag not given on the command line from the environment,
// else from the config directory, and returns where each value came from. An
// invalid value is an error naming the key and the source.
func (r Resolver) Resolve(flags *pflag.FlagSet) (map[string]Source, error) {
	lookup := r.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	dirValues, err := readConfigDir(r.ConfigDir)
	if err != nil {
		return nil, err
	}
	sources := map[string]Source{}
	var errs []error
	known := map[string]bool{}
	flags.VisitAll(func(f *pflag.Flag) {
		known[f.Name] = true
		if f.Changed {
			sources[f.Name] = SourceFlag
			return
		}
		if v, ok := lookup(EnvName(f.Name)); ok {
			if err := flags.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("invalid value %q for %s (from environment %s): %w", v, f.Name, EnvName(f.Name), err))
			}
			sources[f.Name] = SourceEnv
			return
		}
		if v, ok := dirValues[f.Name]; ok {
			if err := flags.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("invalid value %q for %s (from %s): %w", v, f.Name, filepath.Join(r.ConfigDir, f.Name), err))
			}
			sources[f.Name] = SourceConfigDir
			return
		}
		sources[f.Name] = SourceDefault
	})
	var unknown []string
	for k := range dirValues {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		errs = append(errs, fmt.Errorf("unknown option %s in config directory %s", k, r.ConfigDir))
	}
	return sources, errors.Join(errs...)
}

// readConfigDir reads one value per regular file; hidden entries (a ConfigMap
// mount's ..data links and ..2024_ timestamped dirs) are skipped, and
// symlinks to files are followed.
func readConfigDir(dir string) (map[string]string, error) {
	values := map[string]string{}
	if dir == "" {
		return values, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read config directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		info, err := os.Stat(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("read config key %s: %w", path, err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config key %s: %w", path, err)
		}
		values[e.Name()] = strings.TrimSpace(string(data))
	}
	return values, nil
}
