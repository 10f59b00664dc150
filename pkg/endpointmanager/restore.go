// Restore: the endpoints a previous run persisted come back at start with
// their IDs and addresses re-reserved (or are removed when their interface
// is gone), then regenerate, several at a time.

package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

// RestoreResult says what Restore did.
type RestoreResult struct {
	Restored []uint16
	// Removed are endpoints whose interface was gone.
	Removed []uint16
	// Failed are endpoints whose addresses could not be re-reserved.
	Failed []uint16
}

// Restore reads the endpoints persisted by a previous run. Each endpoint
// whose host interface still exists (linkExists) gets its ID and addresses
// re-reserved and comes back in state restoring; the others are removed.
// Call it before any new allocation.
func (m *Manager) Restore(ctx context.Context, linkExists func(name string) (bool, error)) (RestoreResult, error) {
	var res RestoreResult
	eps, err := m.store.LoadAll()
	if err != nil {
		return res, err
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].ID < eps[j].ID })
	for _, ep := range eps {
		if ep.ID == 0 || ep.ID > MaxID {
			// Not an ID this agent hands out: the datapath's per-endpoint
			// maps have no slot for it. The state stays on disk to be
			// looked at.
			m.log.Error("Endpoint state has an ID out of range; endpoint not restored",
				"endpoint", ep.ID, "max", MaxID, "dir", m.store.Dir)
			res.Failed = append(res.Failed, ep.ID)
			continue
		}
		exists := true
		if ep.HostIfName != "" && linkExists != nil {
			ok, err := linkExists(ep.HostIfName)
			if err != nil {
				return res, fmt.Errorf("restore endpoint %d: check interface %s: %w", ep.ID, ep.HostIfName, err)
			}
			exists = ok
		}
		if !exists {
			m.log.Info("Endpoint's interface is gone; removing it", "endpoint", ep.ID, "interface", ep.HostIfName)
			_ = m.store.Remove(ep.ID)
			res.Removed = append(res.Removed, ep.ID)
			continue
		}
		var reserved []netip.Addr
		var failed error
		if m.ipam != nil {
			for _, ip := range ep.Addresses() {
				if err := m.ipam.Restore(ip, ep.IPAMOwner()); err != nil {
					failed = err
					break
				}
				reserved = append(reserved, ip)
			}
		}
		if failed != nil {
			for _, ip := range reserved {
				_ = m.ipam.Release(ip)
			}
			m.log.Error("Cannot re-reserve endpoint addresses; endpoint not restored", "endpoint", ep.ID, "error", failed)
			res.Failed = append(res.Failed, ep.ID)
			continue
		}
		ep.State = ""
		ep.LastRegenerationError = ""
		ep.Regeneration.ConsecutiveFailures = 0
		// Policy revisions count from 1 again in every run of the agent: the
		// previous run's numbers mean nothing now, and the restored
		// endpoint realizes the current policy when it regenerates.
		ep.PolicyRevision, ep.DesiredPolicyRevision = 0, m.policyRevision
		_ = ep.SetState(endpoint.StateRestoring, "Restored from disk after agent restart", m.now())
		m.mu.Lock()
		m.insertLocked(ep)
		m.mu.Unlock()
		res.Restored = append(res.Restored, ep.ID)
	}
	return res, nil
}

// regenerateWorkers bounds how many restored endpoints regenerate at once.
const regenerateWorkers = 8

// RegenerateRestored regenerates the endpoints in state restoring, several
// at a time (each waits mostly on its state file's fsync).
func (m *Manager) RegenerateRestored(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	work := make(chan uint16)
	for w := 0; w < regenerateWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				if err := m.Regenerate(ctx, id, "Restored endpoint"); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("regenerate restored endpoint %d: %w", id, err))
					mu.Unlock()
				}
				m.notify(Event{Kind: EventUpsert, Endpoint: m.mustGet(id)})
			}
		}()
	}
	for _, ep := range m.List() {
		if ep.State == endpoint.StateRestoring {
			work <- ep.ID
		}
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}
