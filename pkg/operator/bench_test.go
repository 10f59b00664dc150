package operator

import (
	"context"
	"fmt"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// BenchmarkOperatorMemory measures the operator process's resident
// memory once it leads (its caches synced), with no TendrilEndpoint (the
// baseline, same run) and with 10,000 TendrilEndpoints (and as many
// identities' worth of index entries).
func BenchmarkOperatorMemory(b *testing.B) {
	e := env.Need(b)
	rc := e.RESTConfig()
	rc.QPS, rc.Burst = 2000, 2000
	c, err := k8s.NewClientsForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	measure := func(ns string) float64 {
		newNamespace(b, e, ns)
		p := startProcess(b, e, ns, "mem-"+ns, 15*time.Second, 10*time.Second, 2*time.Second)
		// Leading means the start (and the informer sync) is done.
		operatortest.WaitFor(b, "the status write", 2*time.Minute, func() bool {
			cm, err := c.Core.CoreV1().ConfigMaps(ns).Get(context.Background(), status.ConfigMapName, metav1.GetOptions{})
			return err == nil && cm.Data[status.KeyHolder] == "mem-"+ns
		})
		time.Sleep(2 * time.Second) // let the first GC passes run
		rss := rssMiB(b, p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
		return rss
	}
	for i := 0; i < b.N; i++ {
		base := measure(fmt.Sprintf("mem-base-%d", i))
		createEndpoints(b, c, "default", 10000, i)
		with := measure(fmt.Sprintf("mem-10k-%d", i))
		b.ReportMetric(base, "MiB-baseline")
		b.ReportMetric(with, "MiB-10k-endpoints")
		b.ReportMetric(with/base, "ratio")
		b.ReportMetric((with-base)*1024*1024/10000, "bytes/endpoint")
		b.StopTimer()
		if err := c.Tendril.TendrilV1alpha1().TendrilEndpoints("default").DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func createEndpoints(b *testing.B, c *k8s.Clients, ns string, n, round int) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				ep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d-%d", round, i), Namespace: ns},
					Status: v1alpha1.EndpointStatus{ID: int64(i), State: "ready",
						Identity:   &v1alpha1.EndpointIdentity{ID: int64(256 + i%500), Labels: []string{"k8s:app=bench", "k8s:io.kubernetes.pod.namespace=" + ns}},
						Networking: &v1alpha1.EndpointNetworking{NodeIP: "192.0.2.1", Addressing: []v1alpha1.AddressPair{{IPv4: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)}}}}}
				if _, err := c.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).Create(context.Background(), ep, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func rssMiB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
