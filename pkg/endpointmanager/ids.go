// Endpoint IDs: 1 to MaxID, handed out after a cursor that is persisted
// ahead of the IDs given out, so a freed ID is not reused at once, not
// even across a restart.

package endpointmanager

import (
	"fmt"
	"strconv"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

// MaxID is the largest endpoint ID.
const MaxID = 4095

// cursorBlock is how far the persisted ID cursor runs ahead of the IDs
// handed out: the cursor file is written once per cursorBlock creates, not
// on every one. After a restart the manager starts at the persisted cursor,
// so at most cursorBlock IDs are skipped and none handed out before is
// reused at once.
const cursorBlock = 64

// pickIDLocked gives ep its ID: the one requested, or the next free one
// after the cursor; newMark is allocateIDLocked's. It takes nothing to give
// back: the endpoint's entry in the table takes the ID, and until then the
// held lock keeps it (a cursor moved past it stays moved, as freed IDs are
// not reused at once).
func (m *Manager) pickIDLocked(ep *endpoint.Endpoint, requested uint16) (newMark bool, err error) {
	if requested != 0 {
		if requested > MaxID {
			return false, fmt.Errorf("%w: %d is above %d", ErrInvalidID, requested, MaxID)
		}
		if _, used := m.endpoints[requested]; used {
			return false, fmt.Errorf("%w: ID %d", ErrExists, requested)
		}
		ep.ID = requested
		return false, nil
	}
	id, newMark, err := m.allocateIDLocked()
	if err != nil {
		return false, err
	}
	ep.ID = id
	return newMark, nil
}

// allocateIDLocked picks the next free ID after the cursor, so a freed ID
// is not reused at once. newMark reports that the cursor on disk must move
// (persistCursor) before the ID may be reported to anyone.
func (m *Manager) allocateIDLocked() (id uint16, newMark bool, err error) {
	for n := 0; n < MaxID; n++ {
		id := m.nextID
		m.nextID = nextCursor(m.nextID, 1)
		m.ahead--
		if _, used := m.endpoints[id]; !used {
			if m.ahead < 0 {
				m.mark, m.ahead = nextCursor(m.nextID, cursorBlock), cursorBlock
				newMark = true
			}
			return id, newMark, nil
		}
	}
	return 0, false, ErrNoIDs
}

// nextCursor is the ID n steps after id, wrapping from MaxID to 1.
func nextCursor(id uint16, n int) uint16 {
	return uint16((int(id)-1+n)%MaxID + 1)
}

// persistCursor writes the current mark unless a write of it (or of a
// later one) is already done.
func (m *Manager) persistCursor() error {
	m.cursorMu.Lock()
	defer m.cursorMu.Unlock()
	m.mu.Lock()
	mark := m.mark
	m.mu.Unlock()
	if mark == m.persisted {
		return nil
	}
	if err := m.store.WriteFile("next-id", []byte(strconv.Itoa(int(mark)))); err != nil {
		return err
	}
	m.persisted = mark
	return nil
}
