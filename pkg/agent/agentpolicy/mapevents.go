package agentpolicy

import (
	"fmt"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/mapevents"
)

// recordPolicyMap records pm's writes in ring (GET
// /v1/map/{name}/events); nil ring: pm as it is.
func recordPolicyMap(pm PolicyMap, ring *mapevents.Ring) PolicyMap {
	if ring == nil || pm == nil {
		return pm
	}
	return recordingPolicyMap{PolicyMap: pm, ring: ring}
}

type recordingPolicyMap struct {
	PolicyMap
	ring *mapevents.Ring
}

func policyKeyString(k maps.PolicyKey) string {
	dir := "ingress"
	if k.Direction == maps.DirEgress {
		dir = "egress"
	}
	return fmt.Sprintf("endpoint=%d %s identity=%d proto=%d port=%d/%d", k.EndpointID, dir, k.Identity, k.Proto, k.Port, k.PortPrefixLen)
}

func (r recordingPolicyMap) Upsert(k maps.PolicyKey, v maps.PolicyValue) error {
	err := r.PolicyMap.Upsert(k, v)
	verdict := "allow"
	if v.Deny {
		verdict = "deny"
	}
	r.ring.Record(models.MapEventActionUpdate, policyKeyString(k), fmt.Sprintf("%s cookie=%d flags=%#x", verdict, v.Cookie, v.Flags), err)
	return err
}

func (r recordingPolicyMap) Delete(k maps.PolicyKey) error {
	err := r.PolicyMap.Delete(k)
	r.ring.Record(models.MapEventActionDelete, policyKeyString(k), "", err)
	return err
}

func (r recordingPolicyMap) DeleteEndpoint(id uint16) error {
	err := r.PolicyMap.DeleteEndpoint(id)
	r.ring.Record(models.MapEventActionDelete, fmt.Sprintf("endpoint=%d (all entries)", id), "", err)
	return err
}
