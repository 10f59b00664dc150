package hubble

import (
	"sort"
	"sync"

	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
)

// Peer is one node as the Peer service announces it.
type Peer struct {
	Name string
	// Address is the node's Hubble API (host:port); empty when the node
	// serves no TCP listener.
	Address string
	// TLSServerName is the name on the node's server certificate; empty
	// when the node serves plain text.
	TLSServerName string
}

// PeerSet is the cluster's nodes as the Peer service announces them: the
// agent fills it from the Node objects it watches. Safe for concurrent use.
type PeerSet struct {
	mu      sync.Mutex
	peers   map[string]Peer
	changed chan struct{}
}

// NewPeerSet returns an empty set.
func NewPeerSet() *PeerSet {
	return &PeerSet{peers: map[string]Peer{}, changed: make(chan struct{})}
}

// Upsert adds or replaces a peer.
func (s *PeerSet) Upsert(p Peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.peers[p.Name]; ok && old == p {
		return
	}
	s.peers[p.Name] = p
	s.wake()
}

// Delete removes a peer; a missing one is no change.
func (s *PeerSet) Delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.peers[name]; !ok {
		return
	}
	delete(s.peers, name)
	s.wake()
}

func (s *PeerSet) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// List is the peers by name and a channel closed at the next change.
func (s *PeerSet) List() ([]Peer, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Peer, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, s.changed
}

func notification(p Peer, t peerpb.ChangeNotificationType) *peerpb.ChangeNotification {
	n := &peerpb.ChangeNotification{Name: p.Name, Address: p.Address, Type: t}
	if p.TLSServerName != "" {
		n.Tls = &peerpb.TLS{ServerName: p.TLSServerName}
	}
	return n
}

type peerService struct {
	peerpb.UnimplementedPeerServer
	s *Server
}

// Notify announces every node (PEER_ADDED), then each change as it comes
// (PEER_ADDED, PEER_UPDATED, PEER_DELETED) until the client goes. Without
// a peer set the node announces only itself.
func (p *peerService) Notify(_ *peerpb.NotifyRequest, stream grpc.ServerStreamingServer[peerpb.ChangeNotification]) error {
	set := p.s.cfg.Peers
	if set == nil {
		self := Peer{Name: p.s.obs.NodeName(), Address: p.s.peerAddress(), TLSServerName: p.s.cfg.TLSServerName}
		if err := stream.Send(notification(self, peerpb.ChangeNotificationType_PEER_ADDED)); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	sent := map[string]Peer{}
	for {
		peers, changed := set.List()
		now := map[string]bool{}
		for _, peer := range peers {
			now[peer.Name] = true
			old, ok := sent[peer.Name]
			switch {
			case !ok:
				if err := stream.Send(notification(peer, peerpb.ChangeNotificationType_PEER_ADDED)); err != nil {
					return err
				}
			case old != peer:
				if err := stream.Send(notification(peer, peerpb.ChangeNotificationType_PEER_UPDATED)); err != nil {
					return err
				}
			}
			sent[peer.Name] = peer
		}
		for name, old := range sent {
			if !now[name] {
				if err := stream.Send(notification(old, peerpb.ChangeNotificationType_PEER_DELETED)); err != nil {
					return err
				}
				delete(sent, name)
			}
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}
