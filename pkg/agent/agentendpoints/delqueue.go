package agentendpoints

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/delqueue"
)

// deleteQueueInterval is how often the agent looks for DELs tendril-cni
// queued while no agent listened. The first look is at start; later ones
// catch a DEL that found no socket in the moments before the API served.
const deleteQueueInterval = 30 * time.Second

// followDeleteQueue runs the queued DELs now and every interval until ctx
// ends.
func (m *Module) followDeleteQueue(ctx context.Context, dir string) {
	for {
		m.runQueuedDeletes(ctx, dir)
		select {
		case <-ctx.Done():
			return
		case <-time.After(deleteQueueInterval):
		}
	}
}

// permanentDelErrors are the codes a retry cannot change: the request
// itself is wrong. Such an entry is dropped; any other failure is kept
// for the next round.
var permanentDelErrors = []uint{cni.ErrIncompatibleCNIVersion, cni.ErrInvalidEnvironmentVariables,
	cni.ErrDecodingFailure, cni.ErrInvalidNetworkConfig}

// runQueuedDeletes runs every DEL of the queue in dir through the CNI
// server, as if the plugin had sent it, and drops the done ones.
func (m *Module) runQueuedDeletes(ctx context.Context, dir string) {
	srv := m.cniServer()
	if srv == nil {
		return
	}
	entries, errs := delqueue.List(dir)
	for _, err := range errs {
		m.log.Warn("Unreadable queued CNI DEL", "error", err)
	}
	for _, e := range entries {
		var req cni.Request
		if e.Body == nil || json.Unmarshal(e.Body, &req) != nil {
			m.log.Warn("Dropping a queued CNI DEL that is no DEL request", "file", e.Path)
			m.removeQueued(e)
			continue
		}
		if _, cerr := srv.Serve(ctx, cni.CommandDel, &req); cerr != nil {
			if slices.Contains(permanentDelErrors, cerr.Code) {
				m.log.Warn("Dropping a queued CNI DEL the CNI server refuses", "container", req.ContainerID, "error", cerr.Error())
				m.removeQueued(e)
			} else {
				m.log.Warn("Queued CNI DEL failed; trying again later", "container", req.ContainerID, "error", cerr.Error())
			}
			continue
		}
		m.log.Info("Queued CNI DEL done", "container", req.ContainerID, "ifname", req.IfName)
		m.removeQueued(e)
	}
}

func (m *Module) removeQueued(e delqueue.Entry) {
	if err := delqueue.Remove(e); err != nil {
		m.log.Warn("Cannot remove a queued CNI DEL", "error", err)
	}
}
