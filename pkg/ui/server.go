package ui

import (
	"context"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

//go:embed assets
var assets embed.FS

// Config configures the UI server.
type Config struct {
	// Relay is the Observer API to read: unix://PATH, a path, or
	// host:port (the relay's, or one node's).
	Relay string
	// RelayTLS secures the connection to the relay (RelayTLS.Config);
	// nil: plain text.
	RelayTLS *tls.Config
	// Capacity is how many recent flows the UI keeps (DefaultCapacity
	// when 0): the map, the table and the policy view see these.
	Capacity int
	// Rules returns the rules in force for what-if (the agent's /policy);
	// nil: what-if compares the candidates with no rules at all.
	Rules func(context.Context) (api.Rules, error)
	// RulesSource names where Rules reads, for the page.
	RulesSource string
	// HistoryFiles are flow export files (the agents'
	// --hubble-export-file-path, with their rotated backups) searched by
	// /api/history, for history beyond the ring.
	HistoryFiles []string
	// AllowedHosts are host names (besides literal addresses and
	// localhost) the page may be reached by, as the Host header names
	// them; a request for any other is refused, so a web site whose name
	// is rebound to the UI's address cannot read the flows.
	AllowedHosts []string
	// StreamBatch is how often the live stream sends what it gathered
	// (DefaultStreamBatch when 0).
	StreamBatch time.Duration
}

// DefaultCapacity is the number of flows kept when Config names none.
const DefaultCapacity = 20000

// DefaultStreamBatch is how often a live stream sends its flows: often
// enough to look live, seldom enough that a page keeps up with thousands
// of flows a second.
const DefaultStreamBatch = 250 * time.Millisecond

// maxStreamRows is the most flows one stream message carries; the rest of
// a batch is counted as skipped (the page shows the count).
const maxStreamRows = 500

// Server serves the UI.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *Store
	mux   *http.ServeMux

	mu        sync.Mutex
	connected bool
	lastErr   string
}

// New returns a server; Run starts reading the relay.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.StreamBatch <= 0 {
		cfg.StreamBatch = DefaultStreamBatch
	}
	s := &Server{cfg: cfg, log: log, store: NewStore(cfg.Capacity), mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	s.mux.Handle("GET /", http.FileServerFS(static))
	s.mux.HandleFunc("GET /api/status", s.status)
	s.mux.HandleFunc("GET /api/namespaces", s.namespaces)
	s.mux.HandleFunc("GET /api/map", s.serviceMap)
	s.mux.HandleFunc("GET /api/flows", s.flows)
	s.mux.HandleFunc("GET /api/stream", s.stream)
	s.mux.HandleFunc("GET /api/policy", s.policy)
	s.mux.HandleFunc("GET /api/history", s.history)
	s.mux.HandleFunc("POST /api/whatif", s.whatif)
	return s
}

// Store is the server's flow store.
func (s *Server) Store() *Store { return s.store }

// Handler serves the page and its API.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// serveHTTP refuses a request for a host name the UI does not answer to:
// the page has no login, and a browser lets any site whose DNS name is
// rebound to the UI's address read it unless the name is checked.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r.Host) {
		writeError(w, http.StatusForbidden, fmt.Errorf("host %q is not one this UI answers to (tendril ui --allowed-host)", r.Host))
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) hostAllowed(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") {
		return true
	}
	for _, h := range s.cfg.AllowedHosts {
		if strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}

// Serve serves HTTP on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve ui: %w", err)
	}
	return nil
}

// DialTarget is the gRPC target of an Observer API address.
func DialTarget(server string) string {
	switch {
	case strings.HasPrefix(server, "unix://"), strings.HasPrefix(server, "dns:"), strings.HasPrefix(server, "passthrough:"):
		return server
	case strings.HasPrefix(server, "/"):
		return "unix://" + server
	}
	return "passthrough:///" + server
}

// resumeOverlap is how far before the newest flow read a reconnection to
// the relay asks again. The relay sends its nodes' flows in arrival order,
// so when the connection breaks, flows the UI has not read yet may be
// older than the newest it read (another node's, come later); those within
// the overlap come on the reconnection, and the ones read already are
// recognised and dropped. A node later than that loses its flows of the gap.
const resumeOverlap = 5 * time.Second

// ReadRelay follows the relay's flows into the store until ctx ends,
// reconnecting after a failure. It first asks for as many past flows as the
// store holds, then, after a failure, for those since resumeOverlap before
// the newest read, each once.
func (s *Server) ReadRelay(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if s.cfg.RelayTLS != nil {
		creds = credentials.NewTLS(s.cfg.RelayTLS)
	}
	conn, err := grpc.NewClient(DialTarget(s.cfg.Relay), grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("connect to relay %s: %w", s.cfg.Relay, err)
	}
	defer conn.Close()
	client := observerpb.NewObserverClient(conn)
	read := newReadSet(resumeOverlap)
	for {
		req := &observerpb.GetFlowsRequest{Follow: true, Number: uint64(s.cfg.Capacity)}
		if !read.newest.IsZero() {
			// After a reconnection: what came since shortly before the
			// newest flow read.
			req.Number, req.Since = 0, timestamppb.New(read.newest.Add(-resumeOverlap))
		}
		err := s.follow(ctx, client, req, read)
		if ctx.Err() != nil {
			return nil
		}
		s.setState(false, err)
		s.log.Warn("Reading flows from the relay failed; retrying", "relay", s.cfg.Relay, "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

func (s *Server) follow(ctx context.Context, client observerpb.ObserverClient, req *observerpb.GetFlowsRequest, read *readSet) error {
	stream, err := client.GetFlows(ctx, req)
	if err != nil {
		return err
	}
	s.setState(true, nil)
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the relay ended the stream")
			}
			return err
		}
		if f := resp.GetFlow(); f != nil && read.first(f) {
			s.store.Add(f)
		}
	}
}

// readSet remembers the flows read within window of the newest, so those
// a reconnection's overlap sends again are recognised.
type readSet struct {
	window time.Duration
	newest time.Time
	recent map[string]time.Time
	pruned time.Time
}

func newReadSet(window time.Duration) *readSet {
	return &readSet{window: window, recent: map[string]time.Time{}}
}

// first reports whether f was not read before (within the window), and
// remembers it.
func (r *readSet) first(f *flowpb.Flow) bool {
	t := f.GetTime().AsTime()
	key := flowKey(f)
	if _, dup := r.recent[key]; dup {
		return false
	}
	if t.After(r.newest) {
		r.newest = t
	}
	horizon := r.newest.Add(-r.window)
	if !t.Before(horizon) {
		r.recent[key] = t
	}
	// Forget what fell out of the window, once per window.
	if r.pruned.Before(horizon) {
		for k, at := range r.recent {
			if at.Before(horizon) {
				delete(r.recent, k)
			}
		}
		r.pruned = r.newest
	}
	return true
}

// flowKey names a flow: its UUID (the agents' observers give every flow
// one), else its node, time and addresses.
func flowKey(f *flowpb.Flow) string {
	if id := f.GetUuid(); id != "" {
		return id
	}
	proto, sport, dport := protoPorts(f)
	return fmt.Sprintf("%s %d %s:%d %s:%d %s %s", f.GetNodeName(), f.GetTime().AsTime().UnixNano(),
		f.GetIP().GetSource(), sport, f.GetIP().GetDestination(), dport, proto, f.GetVerdict())
}

func (s *Server) setState(connected bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = connected
	if err != nil {
		s.lastErr = err.Error()
	} else if connected {
		s.lastErr = ""
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// Status is /api/status's answer.
type Status struct {
	Relay       string `json:"relay"`
	RelayTLS    bool   `json:"relayTLS"`
	Connected   bool   `json:"connected"`
	Error       string `json:"error,omitempty"`
	Flows       int    `json:"flows"`
	Seen        uint64 `json:"seen"`
	Capacity    int    `json:"capacity"`
	RulesSource string `json:"rulesSource"`
	// History says whether /api/history has files to search.
	History bool `json:"history"`
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	st := Status{Relay: s.cfg.Relay, RelayTLS: s.cfg.RelayTLS != nil, Connected: s.connected, Error: s.lastErr, Capacity: s.cfg.Capacity, RulesSource: s.cfg.RulesSource,
		History: len(s.cfg.HistoryFiles) > 0}
	s.mu.Unlock()
	st.Flows, st.Seen = s.store.Len(), s.store.Seen()
	if st.RulesSource == "" {
		st.RulesSource = "none"
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) namespaces(w http.ResponseWriter, _ *http.Request) {
	seen := map[string]bool{}
	for _, f := range s.store.Flows(nil) {
		for _, e := range []*flowpb.Endpoint{f.GetSource(), f.GetDestination()} {
			if ns := e.GetNamespace(); ns != "" {
				seen[ns] = true
			}
		}
	}
	out := []string{}
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) matcher(w http.ResponseWriter, r *http.Request) (*Matcher, Query, bool) {
	q, err := ParseQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return nil, q, false
	}
	m, err := q.Compile()
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return nil, q, false
	}
	return m, q, true
}

func (s *Server) serviceMap(w http.ResponseWriter, r *http.Request) {
	// The map takes the time range (since, until) of a query; the
	// namespace scopes it rather than filtering flows by either side.
	v := r.URL.Query()
	ns := v.Get("namespace")
	v.Del("namespace")
	q, err := ParseQuery(v, time.Now())
	if err == nil {
		var m *Matcher
		if m, err = q.Compile(); err == nil {
			writeJSON(w, http.StatusOK, BuildMap(s.store.Flows(m), ns))
			return
		}
	}
	writeError(w, http.StatusBadRequest, err)
}

// FlowList is /api/flows's answer: the last Limit matching flows, oldest
// first, how many matched, and the cursor of the position after them: a
// stream opened with after=Cursor starts where the list ended.
type FlowList struct {
	Flows   []Row  `json:"flows"`
	Matched int    `json:"matched"`
	Cursor  string `json:"cursor"`
}

func (s *Server) flows(w http.ResponseWriter, r *http.Request) {
	m, q, ok := s.matcher(w, r)
	if !ok {
		return
	}
	flows, cursor := s.store.Snapshot(m)
	limit := q.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	out := FlowList{Flows: []Row{}, Matched: len(flows), Cursor: cursor}
	for _, f := range flows[max(0, len(flows)-limit):] {
		out.Flows = append(out.Flows, RowOf(f))
	}
	writeJSON(w, http.StatusOK, out)
}

// StreamMessage is one message of /api/stream: the flows gathered since
// the last one (at most maxStreamRows) and how many more were left out.
// Its event id is the cursor of the position after them.
type StreamMessage struct {
	Flows   []Row  `json:"flows"`
	Skipped uint64 `json:"skipped"`
}

// stream sends matching flows as Server-Sent Events, batched: the new ones,
// or with after=CURSOR (a flow list's) the ones since that list first, so
// nothing that arrived between the list and the stream is missed. Each
// message's id is the cursor after it; an EventSource reconnecting sends
// the last one as Last-Event-ID, which takes the place of after, so the
// reconnected stream neither repeats nor misses flows the store still
// holds.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	m, _, ok := s.matcher(w, r)
	if !ok {
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, errors.New("streaming unsupported"))
		return
	}
	from := r.URL.Query().Get("after")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		from = id
	}
	sub, err := s.store.Subscribe(m, 4*maxStreamRows, from)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	defer s.store.Unsubscribe(sub)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": tendril ui stream\n\n")
	flusher.Flush()
	tick := time.NewTicker(s.cfg.StreamBatch)
	defer tick.Stop()
	var batch []*flowpb.Flow
	var skipped, reported uint64
	pos := sub.From // the cursor of the messages' ids
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-sub.C:
			pos = e.Seq + 1
			if len(batch) < maxStreamRows {
				batch = append(batch, e.Flow)
			} else {
				skipped++
			}
		case <-tick.C:
			lost, scanned, idle := s.store.Progress(sub)
			if idle {
				// Everything matching before scanned was received.
				pos = max(pos, scanned)
			}
			if len(batch) == 0 && skipped == 0 && lost == reported {
				continue
			}
			msg := StreamMessage{Flows: make([]Row, 0, len(batch)), Skipped: skipped + lost - reported}
			for _, f := range batch {
				msg.Flows = append(msg.Flows, RowOf(f))
			}
			data, err := json.Marshal(msg)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "id: %s\ndata: %s\n\n", s.store.Cursor(pos), data); err != nil {
				return
			}
			flusher.Flush()
			batch, skipped, reported = batch[:0], 0, lost
		}
	}
}
