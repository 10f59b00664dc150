// Package endpoint models one endpoint (a pod's interface on this node): its
// addresses, interfaces, labels, identity, state machine with a bounded log
// of state changes, its on-disk form and its Cilium v1 API model.
package endpoint

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"time"

	"github.com/tendril-net/tendril/pkg/labels"
)

// State is an endpoint's lifecycle state (the Cilium API's EndpointState).
type State string

const (
	StateWaitingForIdentity  State = "waiting-for-identity"
	StateNotReady            State = "not-ready"
	StateWaitingToRegenerate State = "waiting-to-regenerate"
	StateRegenerating        State = "regenerating"
	StateReady               State = "ready"
	StateRestoring           State = "restoring"
	StateDisconnecting       State = "disconnecting"
	StateDisconnected        State = "disconnected"
	StateInvalid             State = "invalid"
)

// transitions lists the states each state may move to. A new endpoint
// (empty state) starts waiting for its identity, or restoring.
func allowedNext(from State) []State {
	switch from {
	case "":
		return []State{StateWaitingForIdentity, StateRestoring, StateWaitingToRegenerate}
	case StateWaitingForIdentity:
		return []State{StateWaitingToRegenerate, StateNotReady, StateDisconnecting, StateInvalid}
	case StateNotReady:
		return []State{StateWaitingToRegenerate, StateWaitingForIdentity, StateDisconnecting, StateInvalid}
	case StateWaitingToRegenerate:
		return []State{StateRegenerating, StateWaitingForIdentity, StateDisconnecting, StateInvalid}
	case StateRegenerating:
		return []State{StateReady, StateNotReady, StateWaitingToRegenerate, StateWaitingForIdentity, StateDisconnecting, StateInvalid}
	case StateReady:
		return []State{StateWaitingToRegenerate, StateWaitingForIdentity, StateDisconnecting, StateInvalid}
	case StateRestoring:
		return []State{StateWaitingToRegenerate, StateRegenerating, StateWaitingForIdentity, StateDisconnecting, StateInvalid}
	case StateInvalid:
		return []State{StateDisconnecting}
	case StateDisconnecting:
		return []State{StateDisconnected}
	}
	return nil
}

// CanTransition reports whether from → to is allowed.
func CanTransition(from, to State) bool {
	for _, s := range allowedNext(from) {
		if s == to {
			return true
		}
	}
	return false
}

// maxLogEntries bounds the per-endpoint log.
const maxLogEntries = 32

// LogEntry is one state change.
type LogEntry struct {
	Time    time.Time `json:"time"`
	State   State     `json:"state"`
	Message string    `json:"message,omitempty"`
	Failed  bool      `json:"failed,omitempty"`
}

// Endpoint is one endpoint. It is a value: the endpoint manager guards it
// and hands out copies.
type Endpoint struct {
	ID            uint16 `json:"id"`
	ContainerID   string `json:"container-id,omitempty"`
	ContainerName string `json:"container-name,omitempty"`
	// IfName is the interface name inside the pod (CNI_IFNAME).
	IfName string `json:"interface-name,omitempty"`
	// NetworkName is the CNI network (the configuration's "name") whose
	// ADD created the endpoint. CNI GC of a network considers only its
	// own endpoints; empty for endpoints made otherwise (the REST API,
	// state files of older agents), which GC never removes.
	NetworkName string `json:"cni-network,omitempty"`
	// HostIfName and HostIfIndex are the host side of the pod's veth.
	HostIfName  string     `json:"host-interface-name,omitempty"`
	HostIfIndex int        `json:"host-interface-index,omitempty"`
	MAC         string     `json:"mac,omitempty"`
	HostMAC     string     `json:"host-mac,omitempty"`
	IPv4        netip.Addr `json:"ipv4,omitzero"`
	IPv6        netip.Addr `json:"ipv6,omitzero"`
	NetNS       string     `json:"netns,omitempty"`

	PodNamespace string `json:"pod-namespace,omitempty"`
	PodName      string `json:"pod-name,omitempty"`
	K8sUID       string `json:"k8s-uid,omitempty"`

	// Labels are the endpoint's labels as "source:key=value".
	Labels []string `json:"labels,omitempty"`
	// Identity is the security identity of the labels (0 until known).
	Identity uint32 `json:"identity,omitempty"`
	// PolicyRevision is the policy repository revision realized in the
	// datapath for this endpoint.
	PolicyRevision uint64 `json:"policy-revision,omitempty"`
	// DesiredPolicyRevision is the revision the endpoint must realize: the
	// repository's revision when the endpoint last learned of a change.
	// The endpoint has converged when PolicyRevision has reached it and its
	// last regeneration succeeded.
	DesiredPolicyRevision uint64 `json:"desired-policy-revision,omitempty"`
	// PolicyEnforcement records which directions are enforced.
	EnforceIngress bool `json:"enforce-ingress,omitempty"`
	EnforceEgress  bool `json:"enforce-egress,omitempty"`
	// AuditIngress and AuditEgress: an audited policy selects the endpoint
	// in that direction (what it would deny passes, reported as AUDIT).
	AuditIngress bool `json:"audit-ingress,omitempty"`
	AuditEgress  bool `json:"audit-egress,omitempty"`
	// L7Ingress: an ingress allow names the HTTP proxy, so flows from
	// other nodes are looked up for it (the datapath's EP_L7_INGRESS).
	L7Ingress bool `json:"l7-ingress,omitempty"`
	// L7Egress: an egress allow names a proxy, so replies from other
	// nodes are looked up for the HTTP proxy's upstream connection (the
	// datapath's EP2_L7_EGRESS).
	L7Egress bool `json:"l7-egress,omitempty"`

	State   State      `json:"state"`
	Log     []LogEntry `json:"log,omitempty"`
	Created time.Time  `json:"created"`
	// Health is the last regeneration outcome for the healthz API.
	LastRegenerationError string `json:"last-regeneration-error,omitempty"`
	// Regeneration counts the regenerations' outcomes; the manager's retry
	// backoff grows with ConsecutiveFailures.
	Regeneration RegenerationStatus `json:"regeneration,omitzero"`
}

// RegenerationStatus is the bookkeeping of an endpoint's regenerations (the
// API's controller status).
type RegenerationStatus struct {
	Successes           int       `json:"successes,omitempty"`
	Failures            int       `json:"failures,omitempty"`
	ConsecutiveFailures int       `json:"consecutive-failures,omitempty"`
	LastSuccess         time.Time `json:"last-success,omitzero"`
	LastFailure         time.Time `json:"last-failure,omitzero"`
}

// RecordRegeneration books one regeneration's outcome: the error (empty on
// success) and the counters.
func (e *Endpoint) RecordRegeneration(err error, now time.Time) {
	if err != nil {
		e.LastRegenerationError = err.Error()
		e.Regeneration.Failures++
		e.Regeneration.ConsecutiveFailures++
		e.Regeneration.LastFailure = now
		return
	}
	e.LastRegenerationError = ""
	e.Regeneration.Successes++
	e.Regeneration.ConsecutiveFailures = 0
	e.Regeneration.LastSuccess = now
}

// Converged reports whether the endpoint realizes what it should: ready,
// its last regeneration succeeded and its realized policy revision has
// reached the desired one.
func (e *Endpoint) Converged() bool {
	return e.State == StateReady && e.LastRegenerationError == "" && e.PolicyRevision >= e.DesiredPolicyRevision
}

// SetState moves the endpoint to state, logging the change; a transition the
// state machine forbids is an error and changes nothing.
func (e *Endpoint) SetState(to State, msg string, now time.Time) error {
	if e.State == to {
		e.appendLog(LogEntry{Time: now, State: to, Message: msg})
		return nil
	}
	if !CanTransition(e.State, to) {
		return fmt.Errorf("endpoint %d: invalid state transition %s → %s", e.ID, e.State, to)
	}
	e.State = to
	e.appendLog(LogEntry{Time: now, State: to, Message: msg})
	return nil
}

// LogFailure records a failed step without changing state.
func (e *Endpoint) LogFailure(msg string, now time.Time) {
	e.appendLog(LogEntry{Time: now, State: e.State, Message: msg, Failed: true})
}

func (e *Endpoint) appendLog(l LogEntry) {
	e.Log = append(e.Log, l)
	if len(e.Log) > maxLogEntries {
		e.Log = append([]LogEntry(nil), e.Log[len(e.Log)-maxLogEntries:]...)
	}
}

// Clone returns a deep copy.
func (e *Endpoint) Clone() *Endpoint {
	c := *e
	c.Labels = append([]string(nil), e.Labels...)
	c.Log = append([]LogEntry(nil), e.Log...)
	return &c
}

// PodKey is "namespace/name", empty when the endpoint is not a pod.
func (e *Endpoint) PodKey() string {
	if e.PodName == "" {
		return ""
	}
	return e.PodNamespace + "/" + e.PodName
}

// AttachmentID is the CNI attachment ID "container-id:ifname".
func (e *Endpoint) AttachmentID() string {
	if e.ContainerID == "" {
		return ""
	}
	return e.ContainerID + ":" + e.IfName
}

// IPAMOwner is the owner under which the endpoint's addresses are allocated.
func (e *Endpoint) IPAMOwner() string {
	if k := e.PodKey(); k != "" {
		return k
	}
	return e.ContainerID
}

// Addresses returns the endpoint's valid addresses.
func (e *Endpoint) Addresses() []netip.Addr {
	var out []netip.Addr
	for _, a := range []netip.Addr{e.IPv4, e.IPv6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// CheckLabels checks labels an API client gives an endpoint: each must pass
// labels.CheckString, since they become the labels of its identity.
func CheckLabels(ls []string) error {
	for _, l := range ls {
		if err := labels.CheckString(l); err != nil {
			return fmt.Errorf("labels: %w", err)
		}
	}
	return nil
}

// SortedLabels returns the labels sorted, without duplicates.
func SortedLabels(labels []string) []string {
	seen := map[string]bool{}
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// String is a short description for logs.
func (e *Endpoint) String() string {
	s := strconv.Itoa(int(e.ID))
	if k := e.PodKey(); k != "" {
		s += " (" + k + ")"
	}
	return s
}
