package hubble

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/observer"
)

// TestPeerServiceAnnouncesChanges: Notify sends every node of the set
// (address and TLS server name), then each addition, change and deletion.
func TestPeerServiceAnnouncesChanges(t *testing.T) {
	peers := NewPeerSet()
	peers.Upsert(Peer{Name: "node1", Address: "10.0.0.11:4244", TLSServerName: "node1.default.hubble-grpc.tendril.io"})
	peers.Upsert(Peer{Name: "node2", Address: "10.0.0.12:4244", TLSServerName: "node2.default.hubble-grpc.tendril.io"})
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	srv := New(Config{SocketPath: sock, Peers: peers}, observer.New(observer.Config{}, hubbletest.Node{Name: "node1"}, nil), nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(typ peerpb.ChangeNotificationType, name, addr, tlsName string) {
		t.Helper()
		cn, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if cn.GetType() != typ || cn.GetName() != name || cn.GetAddress() != addr || cn.GetTls().GetServerName() != tlsName {
			t.Fatalf("got %v, want %s %s %s %q", cn, typ, name, addr, tlsName)
		}
	}
	expect(peerpb.ChangeNotificationType_PEER_ADDED, "node1", "10.0.0.11:4244", "node1.default.hubble-grpc.tendril.io")
	expect(peerpb.ChangeNotificationType_PEER_ADDED, "node2", "10.0.0.12:4244", "node2.default.hubble-grpc.tendril.io")
	peers.Upsert(Peer{Name: "node2", Address: "10.0.0.22:4244"})
	expect(peerpb.ChangeNotificationType_PEER_UPDATED, "node2", "10.0.0.22:4244", "")
	peers.Delete("node1")
	expect(peerpb.ChangeNotificationType_PEER_DELETED, "node1", "10.0.0.11:4244", "node1.default.hubble-grpc.tendril.io")
	peers.Upsert(Peer{Name: "node3", Address: "10.0.0.13:4244"})
	expect(peerpb.ChangeNotificationType_PEER_ADDED, "node3", "10.0.0.13:4244", "")
}
