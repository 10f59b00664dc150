package speaker

import (
	"fmt"
	"log/slog"
	"sync"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	gobgppacket "github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// logger is gobgp's log.Logger on slog. It also keeps, per peer
// address, the last warning or error gobgp logged about the peer: why a
// session is not established (a bad peer AS in the OPEN, a refused
// connection), which gobgp's peer state does not say.
type logger struct {
	log *slog.Logger

	mu   sync.Mutex
	last map[string]string // peer address → last warning or error
	// fresh: the last problem came since the session last dropped.
	fresh map[string]bool
}

func newLogger(l *slog.Logger) *logger {
	return &logger{log: l, last: map[string]string{}, fresh: map[string]bool{}}
}

func (l *logger) attrs(f gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(f))
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}

func (l *logger) remember(msg string, f gobgplog.Fields) {
	if f["Topic"] != "Peer" {
		return
	}
	key, ok := f["Key"].(string)
	if !ok {
		return
	}
	code, cok := f["Code"].(uint8)
	sub, sok := f["Subcode"].(uint8)
	switch {
	case cok && sok:
		msg = fmt.Sprintf("%s: %s", msg, gobgppacket.NewNotificationErrorCode(code, sub))
	case f["Error"] != nil:
		msg = fmt.Sprintf("%s: %v", msg, f["Error"])
	case f["Data"] != nil:
		msg = fmt.Sprintf("%s: %v", msg, f["Data"])
	}
	l.mu.Lock()
	l.last[key], l.fresh[key] = msg, true
	l.mu.Unlock()
}

// dropped notes a session's drop to idle: with the problem logged just
// before it (a notification), or alone.
func (l *logger) dropped(f gobgplog.Fields) {
	key, ok := f["Key"].(string)
	if !ok || f["Topic"] != "Peer" {
		return
	}
	drop := fmt.Sprintf("session dropped from %v: %v", f["old"], f["reason"])
	l.mu.Lock()
	if l.fresh[key] {
		l.last[key] += " (" + drop + ")"
	} else {
		l.last[key] = drop
	}
	l.fresh[key] = false
	l.mu.Unlock()
}

// lastProblem is the last warning or error logged about the peer.
func (l *logger) lastProblem(addr string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[addr]
}

func (l *logger) forget(addr string) {
	l.mu.Lock()
	delete(l.last, addr)
	delete(l.fresh, addr)
	l.mu.Unlock()
}

func (l *logger) Panic(msg string, f gobgplog.Fields) {
	l.log.Error(msg, l.attrs(f)...)
	panic(msg)
}
func (l *logger) Fatal(msg string, f gobgplog.Fields) {
	// gobgp calls Fatal on conditions it cannot go on from; the agent
	// goes on without BGP rather than exit.
	l.log.Error(msg, l.attrs(f)...)
}
func (l *logger) Error(msg string, f gobgplog.Fields) {
	l.remember(msg, f)
	l.log.Error(msg, l.attrs(f)...)
}
func (l *logger) Warn(msg string, f gobgplog.Fields) {
	l.remember(msg, f)
	l.log.Warn(msg, l.attrs(f)...)
}
func (l *logger) Info(msg string, f gobgplog.Fields) { l.log.Info(msg, l.attrs(f)...) }
func (l *logger) Debug(msg string, f gobgplog.Fields) {
	// A session that drops back to idle says why only here, at debug
	// level ("state changed", reason=invalid-msg, hold-timer-expired...).
	switch {
	case msg == "state changed" && fmt.Sprint(f["new"]) == "BGP_FSM_IDLE":
		l.dropped(f)
	case msg == "failed to connect":
		// An unreachable peer: gobgp says so only at debug level.
		l.remember(msg, f)
	}
	l.log.Debug(msg, l.attrs(f)...)
}
func (l *logger) SetLevel(gobgplog.LogLevel) {}

// GetLevel is debug: gobgp tests it before logging a failed connection,
// which lastProblem needs; slog's handler filters what is printed.
func (l *logger) GetLevel() gobgplog.LogLevel { return gobgplog.DebugLevel }
