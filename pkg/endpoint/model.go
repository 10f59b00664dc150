package endpoint

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/go-openapi/strfmt"
)

// FromChangeRequest builds a new endpoint from an API change request. The
// caller assigns the ID.
func FromChangeRequest(req *models.EndpointChangeRequest) (*Endpoint, error) {
	if req == nil {
		return nil, fmt.Errorf("endpoint change request is empty")
	}
	ep := &Endpoint{
		ContainerID:   req.ContainerID,
		ContainerName: req.ContainerName,
		IfName:        req.ContainerInterfaceName,
		HostIfName:    req.InterfaceName,
		HostIfIndex:   int(req.InterfaceIndex),
		MAC:           req.Mac,
		HostMAC:       req.HostMac,
		PodNamespace:  req.K8sNamespace,
		PodName:       req.K8sPodName,
		K8sUID:        req.K8sUID,
		Labels:        SortedLabels(req.Labels),
	}
	if err := CheckLabels(req.Labels); err != nil {
		return nil, err
	}
	if ns, ok := req.Properties["netns"].(string); ok {
		ep.NetNS = ns
	}
	if ep.IfName == "" && ep.ContainerID != "" {
		ep.IfName = "eth0"
	}
	if req.Addressing != nil {
		if s := req.Addressing.IPV4; s != "" {
			ip, err := netip.ParseAddr(s)
			if err != nil || !ip.Is4() {
				return nil, fmt.Errorf("addressing.ipv4 %q is not an IPv4 address", s)
			}
			ep.IPv4 = ip
		}
		if s := req.Addressing.IPV6; s != "" {
			ip, err := netip.ParseAddr(s)
			if err != nil || !ip.Is6() {
				return nil, fmt.Errorf("addressing.ipv6 %q is not an IPv6 address", s)
			}
			ep.IPv6 = ip
		}
	}
	if !ep.IPv4.IsValid() && !ep.IPv6.IsValid() {
		return nil, fmt.Errorf("endpoint has no address: addressing.ipv4 or addressing.ipv6 is required")
	}
	if (ep.PodName == "") != (ep.PodNamespace == "") {
		return nil, fmt.Errorf("k8s-namespace and k8s-pod-name must be given together")
	}
	return ep, nil
}

func labelsModel(l []string) models.Labels {
	if len(l) == 0 {
		return models.Labels{}
	}
	return append(models.Labels(nil), l...)
}

// Model renders the endpoint as the Cilium API model.
func (e *Endpoint) Model(hostAddressing *models.NodeAddressing) *models.Endpoint {
	state := models.EndpointState(e.State)
	addr := &models.AddressPair{}
	if e.IPv4.IsValid() {
		addr.IPV4 = e.IPv4.String()
	}
	if e.IPv6.IsValid() {
		addr.IPV6 = e.IPv6.String()
	}
	podName := ""
	if k := e.PodKey(); k != "" {
		podName = k
	}
	var log models.EndpointStatusLog
	for _, l := range e.Log {
		code := models.EndpointStatusChangeCodeOk
		if l.Failed {
			code = models.EndpointStatusChangeCodeFailed
		}
		log = append(log, &models.EndpointStatusChange{
			Code: code, Message: l.Message, State: models.EndpointState(l.State), Timestamp: l.Time.Format(time.RFC3339Nano),
		})
	}
	return &models.Endpoint{
		ID: int64(e.ID),
		Spec: &models.EndpointConfigurationSpec{
			LabelConfiguration: &models.LabelConfigurationSpec{User: labelsModel(nil)},
			Options:            e.Options(),
		},
		Status: &models.EndpointStatus{
			State: &state,
			ExternalIdentifiers: &models.EndpointIdentifiers{
				CniAttachmentID: e.AttachmentID(),
				ContainerID:     e.ContainerID,
				ContainerName:   e.ContainerName,
				K8sNamespace:    e.PodNamespace,
				K8sPodName:      e.PodName,
				PodName:         podName,
			},
			Identity: &models.Identity{ID: int64(e.Identity), Labels: labelsModel(e.Labels)},
			Labels: &models.LabelConfigurationStatus{
				Realized:         &models.LabelConfigurationSpec{User: labelsModel(nil)},
				SecurityRelevant: labelsModel(e.Labels),
				Derived:          labelsModel(nil),
			},
			Networking: &models.EndpointNetworking{
				Addressing:             []*models.AddressPair{addr},
				ContainerInterfaceName: e.IfName,
				HostAddressing:         hostAddressing,
				HostMac:                e.HostMAC,
				InterfaceIndex:         int64(e.HostIfIndex),
				InterfaceName:          e.HostIfName,
				Mac:                    e.MAC,
			},
			Health:      e.Health(),
			Log:         log,
			Policy:      e.PolicyStatus(),
			Controllers: models.ControllerStatuses{e.RegenerationController()},
			Realized: &models.EndpointConfigurationSpec{
				LabelConfiguration: &models.LabelConfigurationSpec{User: labelsModel(nil)},
				Options:            e.Options(),
			},
		},
	}
}

// Options are the endpoint's configuration options in the API's form.
func (e *Endpoint) Options() models.ConfigurationMap {
	onOff := func(b bool) string {
		if b {
			return "Enabled"
		}
		return "Disabled"
	}
	return models.ConfigurationMap{
		"PolicyEnforcementIngress": onOff(e.EnforceIngress),
		"PolicyEnforcementEgress":  onOff(e.EnforceEgress),
	}
}

// Health reports the endpoint's health from its state and last regeneration.
func (e *Endpoint) Health() *models.EndpointHealth {
	h := &models.EndpointHealth{Connected: e.State != StateDisconnected && e.State != StateDisconnecting}
	switch {
	case e.State == StateReady:
		h.Bpf, h.Policy, h.OverallHealth = models.EndpointHealthStatusOK, models.EndpointHealthStatusOK, models.EndpointHealthStatusOK
	case e.State == StateInvalid || e.LastRegenerationError != "":
		h.Bpf, h.Policy, h.OverallHealth = models.EndpointHealthStatusFailure, models.EndpointHealthStatusFailure, models.EndpointHealthStatusFailure
	case e.State == StateDisconnected || e.State == StateDisconnecting:
		h.Bpf, h.Policy, h.OverallHealth = models.EndpointHealthStatusDisabled, models.EndpointHealthStatusDisabled, models.EndpointHealthStatusDisabled
	default:
		h.Bpf, h.Policy, h.OverallHealth = models.EndpointHealthStatusPending, models.EndpointHealthStatusPending, models.EndpointHealthStatusBootstrap
	}
	return h
}

// PolicyStatus is the endpoint's policy revisions in the API's form: spec
// is the revision it must realize, realized the one in the datapath. (The
// agent's GET of one endpoint adds the realized identities.)
func (e *Endpoint) PolicyStatus() *models.EndpointPolicyStatus {
	return &models.EndpointPolicyStatus{
		Realized: &models.EndpointPolicy{ID: int64(e.Identity), PolicyRevision: int64(e.PolicyRevision), PolicyEnabled: e.policyEnabled()},
		Spec:     &models.EndpointPolicy{ID: int64(e.Identity), PolicyRevision: int64(e.DesiredPolicyRevision), PolicyEnabled: e.policyEnabled()},
	}
}

func (e *Endpoint) policyEnabled() models.EndpointPolicyEnabled {
	switch {
	case e.EnforceIngress && e.EnforceEgress:
		return models.EndpointPolicyEnabledBoth
	case e.EnforceIngress:
		return models.EndpointPolicyEnabledIngress
	case e.EnforceEgress:
		return models.EndpointPolicyEnabledEgress
	}
	return models.EndpointPolicyEnabledNone
}

// RegenerationControllerName names the controller status that reports an
// endpoint's regenerations (Cilium reports its endpoint controllers alike).
func RegenerationControllerName(id uint16) string {
	return "endpoint-regeneration (" + strconv.Itoa(int(id)) + ")"
}

// RegenerationController is the endpoint's regeneration bookkeeping as a
// controller status: counts, last failure message, timestamps.
func (e *Endpoint) RegenerationController() *models.ControllerStatus {
	r := e.Regeneration
	st := &models.ControllerStatusStatus{
		SuccessCount: int64(r.Successes), FailureCount: int64(r.Failures),
		ConsecutiveFailureCount: int64(r.ConsecutiveFailures), LastFailureMsg: e.LastRegenerationError,
	}
	if !r.LastSuccess.IsZero() {
		st.LastSuccessTimestamp = strfmt.DateTime(r.LastSuccess)
	}
	if !r.LastFailure.IsZero() {
		st.LastFailureTimestamp = strfmt.DateTime(r.LastFailure)
	}
	return &models.ControllerStatus{
		Name:          RegenerationControllerName(e.ID),
		Configuration: &models.ControllerStatusConfiguration{ErrorRetry: true},
		Status:        st,
	}
}
