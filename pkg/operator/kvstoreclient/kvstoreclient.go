// Package kvstoreclient is the operator's optional kvstore cell: with
// --kvstore etcd it connects to the etcd of --kvstore-endpoints at start
// (failing the start, naming the endpoints, when etcd does not answer)
// and provides the client; without it, it provides nil and the kvstore
// jobs stay off.
package kvstoreclient

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/kvstore"
)

// Config selects the kvstore.
type Config struct {
	KVStore               string
	KVStoreEndpoints      []string
	KVStoreTLSCAFile      string
	KVStoreTLSCertFile    string
	KVStoreTLSKeyFile     string
	KVStoreConnectTimeout time.Duration
	KVStoreLeaseTTL       time.Duration
}

// DefaultConfig is no kvstore.
func DefaultConfig() Config {
	return Config{KVStoreConnectTimeout: time.Minute, KVStoreLeaseTTL: 15 * time.Minute}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("kvstore", c.KVStore, `Kvstore kind: "etcd", or empty for none`)
	fs.StringSlice("kvstore-endpoints", c.KVStoreEndpoints, "etcd client URLs")
	fs.String("kvstore-tls-ca-file", c.KVStoreTLSCAFile, "CA bundle verifying the etcd server")
	fs.String("kvstore-tls-cert-file", c.KVStoreTLSCertFile, "Client certificate for etcd")
	fs.String("kvstore-tls-key-file", c.KVStoreTLSKeyFile, "Client key for etcd")
	fs.Duration("kvstore-connect-timeout", c.KVStoreConnectTimeout, "How long the start waits for etcd")
	fs.Duration("kvstore-lease-ttl", c.KVStoreLeaseTTL, "TTL of the operator's session lease (its shared-store keys)")
}

// Client holds the kvstore client once the start connected it.
type Client struct {
	configured bool
	kv         *kvstore.Client
}

// Cell provides *Client.
var Cell = cell.Module("kvstore", "Optional etcd kvstore client",
	cell.Config(DefaultConfig()),
	cell.Provide(newClient),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
}

func newClient(p params) (*Client, error) {
	c := &Client{configured: p.Config.KVStore != ""}
	switch p.Config.KVStore {
	case "":
		return c, nil
	case "etcd":
	default:
		return nil, fmt.Errorf("kvstore: unknown kind %q (want etcd or empty)", p.Config.KVStore)
	}
	if len(p.Config.KVStoreEndpoints) == 0 {
		return nil, fmt.Errorf("kvstore etcd: --kvstore-endpoints is empty")
	}
	cfg := kvstore.DefaultConfig()
	cfg.Endpoints = p.Config.KVStoreEndpoints
	cfg.TLSCAFile, cfg.TLSCertFile, cfg.TLSKeyFile = p.Config.KVStoreTLSCAFile, p.Config.KVStoreTLSCertFile, p.Config.KVStoreTLSKeyFile
	cfg.ConnectTimeout = p.Config.KVStoreConnectTimeout
	cfg.LeaseTTL = p.Config.KVStoreLeaseTTL
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(ctx cell.HookContext) error {
			kv, err := kvstore.Connect(ctx, cfg, p.Log)
			if err != nil {
				return fmt.Errorf("kvstore %v: %w", cfg.Endpoints, err)
			}
			c.kv = kv
			return nil
		},
		OnStop: func(ctx cell.HookContext) error {
			if c.kv == nil {
				return nil
			}
			return c.kv.Close(context.WithoutCancel(ctx))
		},
	})
	return c, nil
}

// Enabled reports whether a kvstore is configured (known while the hive
// is built, before the connection exists).
func (c *Client) Enabled() bool { return c != nil && c.configured }

// KV is the connected client: nil before the start and without a kvstore.
func (c *Client) KV() *kvstore.Client {
	if c == nil {
		return nil
	}
	return c.kv
}

// ForClient wraps a connected client (tests and benchmarks that run a
// collector without the hive).
func ForClient(kv *kvstore.Client) *Client { return &Client{configured: true, kv: kv} }
