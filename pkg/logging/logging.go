// Package logging builds the agent's logger from its --log-format and
// --debug options: one slog handler whose level PATCH /v1/config changes
// at run time (through the LevelVar).
package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/cilium/hive/cell"
)

// CheckFormat checks a --log-format value.
func CheckFormat(format string) error {
	if format != "text" && format != "json" {
		return fmt.Errorf("log-format %q: must be text or json", format)
	}
	return nil
}

// New is a logger writing to w in format (text or json) at level, which
// starts at Debug when debug is set and Info otherwise.
func New(w io.Writer, format string, debug bool) (*slog.Logger, *slog.LevelVar, error) {
	if err := CheckFormat(format); err != nil {
		return nil, nil, err
	}
	level := new(slog.LevelVar)
	if debug {
		level.Set(slog.LevelDebug)
	}
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), level, nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), level, nil
}

// For is the logger of a named part of a cell. Cells log through the root
// logger with their own "module" field, as the agent always has (the
// logger hive gives a module already carries one).
func For(root cell.RootLogger, module string) *slog.Logger {
	return (*slog.Logger)(root).With("module", module)
}
