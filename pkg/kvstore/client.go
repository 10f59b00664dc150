// Package kvstore is Tendril's etcd layer: a client with a connection
// status, key operations optionally bound to a session lease, a
// list-then-watch event stream that survives compaction and reconnects,
// sessions renewed when their lease is lost, distributed locks, a shared
// store that keeps a node's keys written. The in-process etcd server for
// tests and labs is pkg/kvstore/kvembed, outside this package so that the
// agent, which links this one, does not link etcd's server.
// See docs/kvstore.md for the key layout and the semantics.
package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/tendril-net/tendril/pkg/kvstore/etcdlog"
)

// Key layout conventions (see docs/kvstore.md).
const (
	// Prefix is the root of every Tendril key.
	Prefix = "tendril/"
	// StatePrefix holds state that agents and the operator recreate when
	// it is removed or corrupted (nodes, identities, ipcache, services).
	StatePrefix = Prefix + "state/"
	// LockPrefix holds the keys of distributed locks.
	LockPrefix = Prefix + "locks/"
)

// probeTimeout bounds one health probe or lease grant: an answer slower
// than this counts as no answer, and the next attempt follows.
const probeTimeout = 5 * time.Second

// State is the connection state reported by Status.
type State string

// Connection states.
const (
	StateConnecting   State = "connecting"
	StateConnected    State = "connected"
	StateDisconnected State = "disconnected"
	StateClosed       State = "closed"
)

// Status is the kvstore's line in `tendril status`.
type Status struct {
	State State
	// Endpoint is the endpoint that answered the last probe (the first
	// configured one while none does).
	Endpoint string
	// Message details the last probe: server version, leader, revision,
	// or the error.
	Message string
	// Since is when State last changed.
	Since time.Time
}

// KeyValue is a key as read from etcd.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
	// Lease is the ID of the lease the key is bound to, 0 for none.
	Lease int64
}

func fromKV(kv *mvccpb.KeyValue) KeyValue {
	return KeyValue{Key: string(kv.Key), Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Lease: kv.Lease}
}

// LeaseMode says whether a written key is bound to the client's session
// lease: such a key disappears when the session does (the client closes,
// crashes, or loses etcd for longer than the lease TTL).
type LeaseMode int

// Lease modes.
const (
	NoLease LeaseMode = iota
	SessionLease
)

// Client is a connection to etcd. Create it with Connect and release it
// with Close. Safe for concurrent use.
type Client struct {
	cfg  Config
	opts options
	log  *slog.Logger
	etcd *clientv3.Client

	// ctx bounds the background loops (health, session, lock collector).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	statusMu sync.Mutex
	status   Status

	sessions *sessionManager
	locks    *lockRegistry

	closeOnce sync.Once
	closeErr  error
}

// Connect creates a client and waits, retrying with backoff, until etcd
// answers and the first session exists, or Config.ConnectTimeout or ctx
// ends. The client then keeps probing the connection for Status, renewing
// its session, and collecting stale locks until Close.
func Connect(ctx context.Context, cfg Config, log *slog.Logger) (*Client, error) {
	opts, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	tlsConfig, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	etcd, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  tlsConfig,
		Username:             opts.username,
		Password:             opts.password,
		DialKeepAliveTime:    opts.keepaliveHeartbeat,
		DialKeepAliveTimeout: opts.keepaliveTimeout,
		Logger:               etcdlog.New(log.With("component", "etcd-client"), nil),
		// gRPC's default reconnect backoff grows to two minutes: after an
		// etcd restart the client would stay away long after etcd is back.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: probeTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("kvstore: create etcd client for %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	c := &Client{
		cfg: cfg, opts: opts, log: log, etcd: etcd, ctx: loopCtx, cancel: cancel,
		status: Status{State: StateConnecting, Endpoint: cfg.Endpoints[0], Since: time.Now()},
		locks:  newLockRegistry(),
	}
	c.sessions = newSessionManager(c)

	connectCtx, cancelConnect := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancelConnect()
	if err := c.waitConnected(connectCtx); err != nil {
		_ = c.closeNow()
		return nil, fmt.Errorf("kvstore: connect to %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	c.start(c.healthLoop, c.sessions.run, c.lockCollectorLoop)
	if _, err := c.sessions.wait(connectCtx); err != nil {
		_ = c.Close(ctx)
		return nil, fmt.Errorf("kvstore: first session with %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	log.Info("Connected to kvstore", "endpoints", cfg.Endpoints, "status", c.Status().Message)
	return c, nil
}

func (c *Client) start(loops ...func(context.Context)) {
	for _, loop := range loops {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			loop(c.ctx)
		}()
	}
}

// waitConnected probes until one probe succeeds.
func (c *Client) waitConnected(ctx context.Context) error {
	b := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		err := c.probe(ctx)
		if err == nil {
			return nil
		}
		c.log.Debug("kvstore not reachable yet; retrying", "error", err)
		if werr := b.wait(ctx); werr != nil {
			return fmt.Errorf("%w (last error: %v)", werr, err)
		}
	}
}

// probe checks that etcd serves a linearizable read (which needs a quorum)
// and records the outcome in the status.
func (c *Client) probe(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, probeTimeout)
	defer cancel()
	resp, err := c.etcd.Get(ctx, Prefix+".health", clientv3.WithCountOnly())
	if err != nil {
		if parent.Err() == nil {
			// Not our own cancellation: etcd did not answer in time.
			c.setStatus(StateDisconnected, c.cfg.Endpoints[0], err.Error())
		}
		return err
	}
	endpoint, detail := c.describeServer(ctx)
	c.setStatus(StateConnected, endpoint, fmt.Sprintf("revision %d; %s", resp.Header.Revision, detail))
	return nil
}

// describeServer asks the member the client is connected to for its
// version and role, for the status message, and finds which configured
// endpoint it is. It uses the client's own connection: Client.Status(ep)
// would dial (and, with etcd users, authenticate) anew on every probe.
func (c *Client) describeServer(ctx context.Context) (endpoint, detail string) {
	endpoint = c.cfg.Endpoints[0]
	maint := clientv3.NewMaintenanceFromMaintenanceClient(pb.NewMaintenanceClient(c.etcd.ActiveConnection()), c.etcd)
	st, err := maint.Status(ctx, "")
	if err != nil {
		return endpoint, fmt.Sprintf("status: %v", err)
	}
	role := "follower"
	if st.Leader == st.Header.MemberId {
		role = "leader"
	}
	if members, err := c.etcd.MemberList(ctx); err == nil {
		for _, m := range members.Members {
			if m.ID != st.Header.MemberId {
				continue
			}
			for _, u := range m.ClientURLs {
				if slices.Contains(c.cfg.Endpoints, u) {
					endpoint = u
				}
			}
		}
	}
	return endpoint, fmt.Sprintf("etcd %s, member %x (%s), db %d bytes", st.Version, st.Header.MemberId, role, st.DbSize)
}

func (c *Client) setStatus(state State, endpoint, message string) {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	if c.status.State == StateClosed {
		return
	}
	if c.status.State != state {
		if state == StateDisconnected {
			c.log.Warn("kvstore disconnected", "endpoint", endpoint, "error", message)
		} else if c.status.State == StateDisconnected {
			c.log.Info("kvstore reconnected", "endpoint", endpoint)
		}
		c.status.State = state
		c.status.Since = time.Now()
	}
	c.status.Endpoint = endpoint
	c.status.Message = message
}

// Status returns the connection status as of the last probe.
func (c *Client) Status() Status {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	return c.status
}

func (c *Client) healthLoop(ctx context.Context) {
	t := time.NewTicker(c.opts.healthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.probe(ctx) // recorded in the status
		}
	}
}

// Close stops the background loops and the client's ListAndWatch streams,
// revokes the session lease (so that keys bound to it disappear now rather
// than after the TTL) and closes the connection. ctx bounds the
// revocation. Calls after the first return its result.
func (c *Client) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		c.sessions.setCloseContext(ctx)
		c.cancel()
		c.wg.Wait()
		c.closeErr = c.closeNow()
	})
	return c.closeErr
}

func (c *Client) closeNow() error {
	c.cancel()
	c.statusMu.Lock()
	c.status = Status{State: StateClosed, Endpoint: c.status.Endpoint, Since: time.Now()}
	c.statusMu.Unlock()
	if err := c.etcd.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("kvstore: close etcd client: %w", err)
	}
	return nil
}

// leaseOption returns the put option binding a key as mode says.
func (c *Client) leaseOption(ctx context.Context, mode LeaseMode) ([]clientv3.OpOption, clientv3.LeaseID, error) {
	if mode != SessionLease {
		return nil, clientv3.NoLease, nil
	}
	s, err := c.sessions.wait(ctx)
	if err != nil {
		return nil, 0, err
	}
	return []clientv3.OpOption{clientv3.WithLease(s.Lease())}, s.Lease(), nil
}

// noteWriteError ends the session early when a write bound to it failed
// because etcd no longer knows its lease.
func (c *Client) noteWriteError(err error, lease clientv3.LeaseID) {
	if lease != clientv3.NoLease && errors.Is(err, rpctypes.ErrLeaseNotFound) {
		c.sessions.invalidate(lease)
	}
}

// Get reads one key; found is false when it does not exist.
func (c *Client) Get(ctx context.Context, key string) (kv KeyValue, found bool, err error) {
	resp, err := c.etcd.Get(ctx, key)
	if err != nil {
		return KeyValue{}, false, fmt.Errorf("kvstore get %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return KeyValue{}, false, nil
	}
	return fromKV(resp.Kvs[0]), true, nil
}

// GetPrefix reads every key under prefix, in key order, as of one
// revision (returned), in pages of the list limit.
func (c *Client) GetPrefix(ctx context.Context, prefix string) ([]KeyValue, int64, error) {
	var out []KeyValue
	rev, err := c.listPages(ctx, prefix, func(kvs []KeyValue) error {
		out = append(out, kvs...)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return out, rev, nil
}

// listPages reads prefix page by page at the revision of the first page
// and hands each page to fn. Pages keep memory bounded on large prefixes
// and keep each etcd response small.
func (c *Client) listPages(ctx context.Context, prefix string, fn func([]KeyValue) error) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(c.opts.listLimit)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.etcd.Get(ctx, from, opts...)
		if err != nil {
			return 0, fmt.Errorf("kvstore list %q: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		page := make([]KeyValue, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			page[i] = fromKV(kv)
		}
		if err := fn(page); err != nil {
			return 0, err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		// The next page starts just after the last key of this one.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Update writes key unconditionally.
func (c *Client) Update(ctx context.Context, key string, value []byte, lease LeaseMode) error {
	opts, leaseID, err := c.leaseOption(ctx, lease)
	if err != nil {
		return fmt.Errorf("kvstore update %q: %w", key, err)
	}
	if _, err := c.etcd.Put(ctx, key, string(value), opts...); err != nil {
		c.noteWriteError(err, leaseID)
		return fmt.Errorf("kvstore update %q: %w", key, err)
	}
	return nil
}

// UpdateIfMissing writes key unless it already holds value bound to the
// lease that lease asks for: a missing key (deleted, or gone with a lost
// lease), another value or another lease is (re)written; an identical key
// is left alone, so watchers see no event. It reports whether it wrote.
func (c *Client) UpdateIfMissing(ctx context.Context, key string, value []byte, lease LeaseMode) (bool, error) {
	opts, leaseID, err := c.leaseOption(ctx, lease)
	if err != nil {
		return false, fmt.Errorf("kvstore update-if-missing %q: %w", key, err)
	}
	// A value comparison against a missing key fails, so a missing key
	// takes the Else branch too.
	resp, err := c.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", string(value)), clientv3.Compare(clientv3.LeaseValue(key), "=", leaseID)).
		Else(clientv3.OpPut(key, string(value), opts...)).
		Commit()
	if err != nil {
		c.noteWriteError(err, leaseID)
		return false, fmt.Errorf("kvstore update-if-missing %q: %w", key, err)
	}
	return !resp.Succeeded, nil
}

// CreateOnly writes key only if it does not exist (its create revision is
// 0) and reports whether it did. Of concurrent callers, exactly one wins.
func (c *Client) CreateOnly(ctx context.Context, key string, value []byte, lease LeaseMode) (bool, error) {
	opts, leaseID, err := c.leaseOption(ctx, lease)
	if err != nil {
		return false, fmt.Errorf("kvstore create %q: %w", key, err)
	}
	resp, err := c.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), opts...)).
		Commit()
	if err != nil {
		c.noteWriteError(err, leaseID)
		return false, fmt.Errorf("kvstore create %q: %w", key, err)
	}
	return resp.Succeeded, nil
}

// Delete removes key (no error when it does not exist).
func (c *Client) Delete(ctx context.Context, key string) error {
	if _, err := c.etcd.Delete(ctx, key); err != nil {
		return fmt.Errorf("kvstore delete %q: %w", key, err)
	}
	return nil
}

// DeletePrefix removes every key under prefix and returns how many went.
func (c *Client) DeletePrefix(ctx context.Context, prefix string) (int64, error) {
	if prefix == "" {
		return 0, fmt.Errorf("kvstore delete prefix: empty prefix would delete everything")
	}
	resp, err := c.etcd.Delete(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("kvstore delete prefix %q: %w", prefix, err)
	}
	return resp.Deleted, nil
}
