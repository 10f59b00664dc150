package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log"
	"net/netip"
	"path"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
)

// Why Services past -direct-above are written into etcd: kube-apiserver
// v1.36.3 allocates each ClusterIP as an IPAddress object and then, for its
// allocation metrics, lists every IPAddress twice (ipallocator's Used and
// Free, from createIPAddress): a Service create costs O(Services) of API
// server CPU, so creates slow from ≈260/s at 2,500 Services to ≈90/s at
// 10,000 (bench/apifill, with a CPU profile of the API server) and to
// 10–20/s past 20,000 in earlier runs of this benchmark. The agent is not running during the fill; the cost is
// the API server's alone. Past the threshold this writes each Service and
// its IPAddress as the API server stores them (protobuf, its keys); the API
// server's watch cache picks them up from etcd, and everything the agent
// reads still comes from the API server. EndpointSlices still go through
// the API server.

// directWriter puts Services and IPAddresses into the API server's etcd.
type directWriter struct {
	etcd  *clientv3.Client
	codec runtime.Encoder
}

func newDirectWriter(etcdURL string) (*directWriter, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	// The storage encoding: protobuf with the k8s magic, in the objects'
	// storage versions (core/v1, networking.k8s.io/v1).
	// (the objects carry their TypeMeta, which the envelope records).
	return &directWriter{etcd: cli, codec: protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)}, nil
}

func (d *directWriter) close() { _ = d.etcd.Close() }

func randomUID() types.UID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}

// storedService is a ClusterIP Service as the API server stores it after
// defaulting and allocation.
func storedService(name string, ip netip.Addr) *corev1.Service {
	s := service(name, svcPort, backendPort)
	s.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	s.UID = randomUID()
	s.CreationTimestamp = metav1.Now()
	single := corev1.IPFamilyPolicySingleStack
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.ClusterIP, s.Spec.ClusterIPs = ip.String(), []string{ip.String()}
	s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv4Protocol}, &single
	s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	s.Spec.InternalTrafficPolicy = &cluster
	return s
}

// storedIPAddress is the allocator's record of ip held by the Service.
func storedIPAddress(ip netip.Addr, svc string) *networkingv1.IPAddress {
	return &networkingv1.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), UID: randomUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol), networkingv1.LabelManagedBy: "ipallocator.k8s.io"}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: benchNS, Name: svc}},
	}
}

func (d *directWriter) encode(obj runtime.Object) (string, error) {
	var buf bytes.Buffer
	if err := d.codec.Encode(obj, &buf); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// put writes services[i] for i in [from, to) with the given cluster IPs, in
// transactions of up to 64 Services (128 puts: etcd's default limit).
func (d *directWriter) put(ctx context.Context, from int, ips []netip.Addr) error {
	const perTxn = 64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	sem := make(chan struct{}, 8)
	for start := 0; start < len(ips); start += perTxn {
		end := min(start+perTxn, len(ips))
		var ops []clientv3.Op
		for j := start; j < end; j++ {
			name := fmt.Sprintf("svc-%d", from+j)
			svc, err := d.encode(storedService(name, ips[j]))
			if err != nil {
				return fmt.Errorf("encode %s: %w", name, err)
			}
			ipa, err := d.encode(storedIPAddress(ips[j], name))
			if err != nil {
				return fmt.Errorf("encode the IPAddress of %s: %w", name, err)
			}
			ops = append(ops, clientv3.OpPut(path.Join("/registry/services/specs", benchNS, name), svc),
				clientv3.OpPut(path.Join("/registry/ipaddresses", ips[j].String()), ipa))
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := d.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
				select {
				case errc <- fmt.Errorf("etcd txn: %w", err):
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// freeIPs picks n addresses of the service range r that no Service
// holds, from the top of the range down (the allocator picks at random
// from it).
func freeIPs(n int, used []netip.Addr, r netip.Prefix) []netip.Addr {
	taken := make(map[netip.Addr]bool, len(used))
	for _, a := range used {
		taken[a] = true
	}
	out := make([]netip.Addr, 0, n)
	// From below the range's broadcast address down.
	base := r.Masked().Addr().As4()
	var top [4]byte
	binary.BigEndian.PutUint32(top[:], binary.BigEndian.Uint32(base[:])|(1<<(32-r.Bits())-2))
	for a := netip.AddrFrom4(top); len(out) < n; a = a.Prev() {
		if !taken[a] {
			out = append(out, a)
		}
	}
	return out
}

// fillDirect writes Services len(b.services)..size-1 with their IPAddresses
// into etcd, then creates their EndpointSlices through the API server and
// waits until the API server lists every Service.
func (b *bench) fillDirect(ctx context.Context, size int) error {
	from := len(b.services)
	d, err := newDirectWriter(b.etcdURL)
	if err != nil {
		return err
	}
	defer d.close()
	used := append([]netip.Addr{b.iperfIP, netip.MustParseAddr("10.96.0.1")}, b.services...)
	ips := freeIPs(size-from, used, b.serviceRange)
	t0 := time.Now()
	if err := d.put(ctx, from, ips); err != nil {
		return err
	}
	log.Printf("%d Services written into etcd in %s", size-from, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := b.parallel(from, size, func(i int) error {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice(name, backendAddrs(), backendPort), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create slice %s: %w", name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	log.Printf("%d EndpointSlices created through the API server in %s", size-from, time.Since(t0).Round(time.Millisecond))
	// The watch cache has them once a list counts them all.
	for deadline := time.Now().Add(5 * time.Minute); ; {
		got, err := b.countServices(ctx)
		if err == nil && got >= size+1 { // and the iperf service
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("API server lists %d of %d services 5 min after the etcd writes: %v", got, size+1, err)
		}
		time.Sleep(time.Second)
	}
	b.services = append(b.services, ips...)
	return nil
}

// countServices counts the bench namespace's Services the API server lists.
func (b *bench) countServices(ctx context.Context) (int, error) {
	n := 0
	opts := metav1.ListOptions{Limit: 5000}
	for {
		l, err := b.cs.CoreV1().Services(benchNS).List(ctx, opts)
		if err != nil {
			return n, err
		}
		n += len(l.Items)
		if l.Continue == "" {
			return n, nil
		}
		opts.Continue = l.Continue
	}
}
