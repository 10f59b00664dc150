package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	var buf bytes.Buffer
	log, level, err := New(&buf, "json", true)
	if err != nil {
		t.Fatal(err)
	}
	if level.Level() != slog.LevelDebug {
		t.Errorf("level %v, want debug", level.Level())
	}
	log.Debug("hello")
	if !strings.HasPrefix(buf.String(), "{") {
		t.Errorf("json output %q", buf.String())
	}
	if _, _, err := New(&buf, "xml", false); err == nil || !strings.Contains(err.Error(), "log-format") {
		t.Errorf("xml: error %v, want one naming log-format", err)
	}
}
