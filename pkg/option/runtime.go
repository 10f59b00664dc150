package option

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
)

// Policy enforcement modes, as Cilium names them.
const (
	EnforcementDefault = "default"
	EnforcementAlways  = "always"
	EnforcementNever   = "never"
)

// ValidateEnforcement checks a policy enforcement mode.
func ValidateEnforcement(mode string) error {
	switch mode {
	case EnforcementDefault, EnforcementAlways, EnforcementNever:
		return nil
	}
	return fmt.Errorf("policy-enforcement %q: must be default, always or never", mode)
}

// Modes of --policy-revoke-established: which established flows a
// policy change ends (pkg/agent/agentpolicy, RevokeEstablished).
const (
	// RevokeDeny ends the flows a deny rule of the new policy covers.
	RevokeDeny = "deny"
	// RevokeAll also ends the flows no allow of the new policy admits
	// any more.
	RevokeAll = "all"
	// RevokeNone ends nothing: established flows outlive any policy
	// change until they close or expire (Cilium's behaviour).
	RevokeNone = "none"
)

// ValidateRevokeMode checks a --policy-revoke-established value.
func ValidateRevokeMode(mode string) error {
	switch mode {
	case RevokeDeny, RevokeAll, RevokeNone:
		return nil
	}
	return fmt.Errorf("policy-revoke-established %q: must be deny, all or none", mode)
}

// ErrImmutable is returned when a known option cannot change at run time.
type ErrImmutable struct{ Key string }

func (e *ErrImmutable) Error() string {
	return fmt.Sprintf("option %s cannot change at run time; restart the agent with the new value", e.Key)
}

// ErrUnknown is returned for an option the agent does not have.
type ErrUnknown struct{ Key string }

func (e *ErrUnknown) Error() string { return fmt.Sprintf("unknown option %s", e.Key) }

// Runtime holds the options that PATCH /v1/config may change, and tells
// subscribers when they do.
type Runtime struct {
	mu          sync.Mutex
	enforcement string
	debug       bool
	subscribers []func(RuntimeValues)
}

// RuntimeValues is a snapshot of the runtime-mutable options.
type RuntimeValues struct {
	PolicyEnforcement string
	Debug             bool
}

// NewRuntime starts with the resolved start-up values.
func NewRuntime(v RuntimeValues) *Runtime {
	return &Runtime{enforcement: v.PolicyEnforcement, debug: v.Debug}
}

// Values returns the current values.
func (r *Runtime) Values() RuntimeValues {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RuntimeValues{PolicyEnforcement: r.enforcement, Debug: r.debug}
}

// NewLoggedRuntime is NewRuntime whose debug option sets level (the
// agent's log level) and whose changes are logged to log.
func NewLoggedRuntime(v RuntimeValues, log *slog.Logger, level *slog.LevelVar) *Runtime {
	rt := NewRuntime(v)
	rt.Subscribe(func(v RuntimeValues) {
		if v.Debug {
			level.Set(slog.LevelDebug)
		} else {
			level.Set(slog.LevelInfo)
		}
		log.Info("Runtime options changed", "policy-enforcement", v.PolicyEnforcement, "debug", v.Debug)
	})
	return rt
}

// Subscribe calls fn after every change, with the new values.
func (r *Runtime) Subscribe(fn func(RuntimeValues)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.subscribers = append(r.subscribers, fn)
}

// debugOption is the API's options-map name of the debug option.
const debugOption = "Debug"

// Apply validates all changes first and applies them only if every one is
// valid, so a bad request changes nothing. options is the API's options map
// (keys case-insensitive: Debug); enforcement may be empty. isKnown tells
// whether a key names a start-up option, to answer "immutable" instead of
// "unknown".
func (r *Runtime) Apply(options map[string]string, enforcement string, isKnown func(string) bool) error {
	next := r.Values()
	if enforcement != "" {
		mode := strings.ToLower(enforcement)
		if err := ValidateEnforcement(mode); err != nil {
			return err
		}
		next.PolicyEnforcement = mode
	}
	for key, value := range options {
		lower := strings.ToLower(key)
		switch lower {
		case "debug":
			b, err := parseBoolOption(value)
			if err != nil {
				return fmt.Errorf("option %s: %w", key, err)
			}
			next.Debug = b
		case "policy-enforcement", "policyenforcement":
			mode := strings.ToLower(value)
			if err := ValidateEnforcement(mode); err != nil {
				return err
			}
			next.PolicyEnforcement = mode
		default:
			if isKnown != nil && isKnown(lower) {
				return &ErrImmutable{Key: key}
			}
			return &ErrUnknown{Key: key}
		}
	}
	r.mu.Lock()
	changed := next.PolicyEnforcement != r.enforcement || next.Debug != r.debug
	r.enforcement, r.debug = next.PolicyEnforcement, next.Debug
	subs := append(([]func(RuntimeValues))(nil), r.subscribers...)
	r.mu.Unlock()
	if changed {
		for _, fn := range subs {
			fn(next)
		}
	}
	return nil
}

// parseBoolOption accepts Cilium's Enabled/Disabled as well as true/false.
func parseBoolOption(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "enabled", "enable", "on":
		return true, nil
	case "disabled", "disable", "off":
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean (Enabled, Disabled, true, false)", v)
	}
	return b, nil
}

// OptionsMap renders the mutable options as the API's options map.
func (v RuntimeValues) OptionsMap() map[string]string {
	debug := "Disabled"
	if v.Debug {
		debug = "Enabled"
	}
	return map[string]string{debugOption: debug}
}
