package ui

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strconv"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxHistoryLine bounds one line of an export file (a flow is well under
// a few kilobytes; a longer line is not one the exporter wrote).
const maxHistoryLine = 1 << 20

// HistoryResult is /api/history's answer: the last Limit matching flows of
// the export files, oldest first, how many matched, and how many lines
// could not be read as flows (skipped, never fatal: a file being written
// ends in a partial line).
type HistoryResult struct {
	FlowList
	Files      []string `json:"files"`
	Unreadable int      `json:"unreadable"`
}

// historyFiles are an export file's rotated backups, oldest first
// (FILE.N ... FILE.1), then the file itself, as far as they exist.
func historyFiles(path string) []string {
	var backups []string
	for i := 1; ; i++ {
		p := path + "." + strconv.Itoa(i)
		if _, err := os.Stat(p); err != nil {
			break
		}
		backups = append([]string{p}, backups...)
	}
	return append(backups, path)
}

// SearchHistory reads the flow export files (docs/observability.md: one
// GetFlowsResponse per line, as `hubble observe -o json` prints) and
// answers the last limit flows that match m, for history beyond the ring.
func SearchHistory(paths []string, m *Matcher, limit int) (*HistoryResult, error) {
	res := &HistoryResult{FlowList: FlowList{Flows: []Row{}}, Files: []string{}}
	ring := make([]*flowpb.Flow, 0, limit)
	next := 0
	for _, path := range paths {
		for _, file := range historyFiles(path) {
			f, err := os.Open(file)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("open export file: %w", err)
			}
			res.Files = append(res.Files, file)
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64*1024), maxHistoryLine)
			for sc.Scan() {
				var resp observerpb.GetFlowsResponse
				if err := protojson.Unmarshal(sc.Bytes(), &resp); err != nil || resp.GetFlow() == nil {
					res.Unreadable++
					continue
				}
				fl := resp.GetFlow()
				if !m.Match(fl) {
					continue
				}
				res.Matched++
				if len(ring) < limit {
					ring = append(ring, fl)
				} else {
					ring[next] = fl
					next = (next + 1) % limit
				}
			}
			err = sc.Err()
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", file, err)
			}
		}
	}
	for i := range ring {
		res.Flows = append(res.Flows, RowOf(ring[(next+i)%len(ring)]))
	}
	return res, nil
}

func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	if len(s.cfg.HistoryFiles) == 0 {
		writeError(w, http.StatusNotFound, errors.New("no flow export file to search: start tendril ui with --history-file"))
		return
	}
	m, q, ok := s.matcher(w, r)
	if !ok {
		return
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	res, err := SearchHistory(s.cfg.HistoryFiles, m, limit)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
