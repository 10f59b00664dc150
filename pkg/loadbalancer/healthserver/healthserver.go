// Package healthserver answers the health check node ports of services
// with externalTrafficPolicy Local, as kube-proxy does: an external load
// balancer asks each node how many of the service's backends it holds, and
// sends traffic only to nodes that answer 200 (200 with the local backend
// count, 503 with none). It reads the load-balancer tables; one listener
// per health check node port, opened and closed as services come and go.
package healthserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Response is the body of an answer, kube-proxy's format.
type Response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// Server runs the health check listeners of one node.
type Server struct {
	tables   *loadbalancer.Tables
	nodeName string
	log      *slog.Logger
	// listen opens a listener on a port (tests listen on loopback).
	listen func(port uint16) (net.Listener, error)

	mu        sync.Mutex
	listeners map[uint16]*listener
	// serving counts the listeners' serve loops, joined when Run ends.
	serving sync.WaitGroup
	// examined counts the services Run has read: its work, which must
	// follow the health-checked services, not all of them.
	examined atomic.Int64
}

type listener struct {
	service loadbalancer.ServiceName
	srv     *http.Server
}

// New returns a server for node nodeName's services, listening on every
// address of the node's network namespace.
func New(tables *loadbalancer.Tables, nodeName string, log *slog.Logger) *Server {
	return &Server{tables: tables, nodeName: nodeName, log: log, listeners: map[uint16]*listener{},
		listen: func(port uint16) (net.Listener, error) {
			return net.Listen("tcp", ":"+strconv.Itoa(int(port)))
		}}
}

// retryInterval is how soon a port that could not be opened (another
// process holds it) is tried again.
const retryInterval = 5 * time.Second

// Run keeps the listeners in line with the services until ctx ends, then
// closes them.
func (s *Server) Run(ctx context.Context) error {
	defer s.closeAll()
	for {
		// Only the health-checked services, by their index: reading
		// (and waking for) every service made each change of any
		// service cost a pass over all of them.
		txn := s.tables.DB.ReadTxn()
		svcs, watch := s.tables.Services.ListWatch(txn, loadbalancer.ServiceByHealthCheck.Query(true))
		want := map[uint16]loadbalancer.ServiceName{}
		for svc := range svcs {
			s.examined.Add(1)
			want[svc.HealthCheckNodePort] = svc.Name
		}
		failed := s.sync(want)
		var retry <-chan time.Time
		if failed {
			retry = time.After(retryInterval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-retry:
		}
	}
}

// sync opens and closes listeners to match want; it reports whether a port
// could not be opened.
func (s *Server) sync(want map[uint16]loadbalancer.ServiceName) (failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, l := range s.listeners {
		if name, ok := want[port]; !ok || name != l.service {
			l.srv.Close()
			delete(s.listeners, port)
			s.log.Info("Health check node port closed", "port", port, "service", l.service)
		}
	}
	for port, name := range want {
		if _, ok := s.listeners[port]; ok {
			continue
		}
		ln, err := s.listen(port)
		if err != nil {
			s.log.Warn("Health check node port not opened; retrying", "port", port, "service", name, "error", err)
			failed = true
			continue
		}
		srv := &http.Server{Handler: s.handler(name), ReadHeaderTimeout: 5 * time.Second}
		s.listeners[port] = &listener{service: name, srv: srv}
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("Health check node port stopped", "port", port, "error", err)
			}
		}()
		s.log.Info("Health check node port open", "port", port, "service", name)
	}
	return failed
}

func (s *Server) closeAll() {
	s.mu.Lock()
	for port, l := range s.listeners {
		l.srv.Close()
		delete(s.listeners, port)
	}
	s.mu.Unlock()
	s.serving.Wait()
}

// Ports lists the open health check node ports and their services.
func (s *Server) Ports() map[uint16]loadbalancer.ServiceName {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint16]loadbalancer.ServiceName, len(s.listeners))
	for p, l := range s.listeners {
		out[p] = l.service
	}
	return out
}

// LocalBackends counts the service's ready backends on this node (each
// address once, whatever its ports).
func (s *Server) LocalBackends(name loadbalancer.ServiceName) int {
	txn := s.tables.DB.ReadTxn()
	seen := map[string]bool{}
	for b := range loadbalancer.ServiceBackends(txn, s.tables.Backends, name) {
		if b.NodeName == s.nodeName && b.Ready && !b.Terminating {
			seen[b.Addr.Addr().String()] = true
		}
	}
	return len(seen)
}

// handler answers for one service, whatever the path (kube-proxy's does
// the same).
func (s *Server) handler(name loadbalancer.ServiceName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var r Response
		r.Service.Namespace, r.Service.Name = name.Namespace, name.Name
		r.LocalEndpoints = s.LocalBackends(name)
		r.ServiceProxyHealthy = true
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(r.LocalEndpoints))
		if r.LocalEndpoints == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusOK)
		}
		if err := json.NewEncoder(w).Encode(r); err != nil {
			s.log.Debug("Health check answer not written", "service", name, "error", err)
		}
	})
}

// String describes the open ports, for the status.
func (s *Server) String() string {
	ports := s.Ports()
	if len(ports) == 0 {
		return "none open"
	}
	return fmt.Sprintf("%d open", len(ports))
}
