package bpf_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// loadShared loads testdata/shared_maps.o, a second object built from the
// shared headers (hack/generate-bpf.sh compiles it), under the BPF root
// dir.
func loadShared(t *testing.T, dir string) (*ebpf.CollectionSpec, *ebpf.Collection) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec("testdata/shared_maps.o")
	if err != nil {
		t.Fatalf("load second object's spec: %v", err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		t.Fatalf("load second object next to the pod programs' maps: %v", err)
	}
	t.Cleanup(coll.Close)
	return spec, coll
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel reports no map ID")
	}
	return id
}

// TestPrivilegedSecondObjectSharesMaps loads the pod programs, then a
// second object that includes bpf/lib/maps.h, under one BPF root: the
// second object must get the very kernel maps of the first (pinned by
// name, same layout), and its code, built from the shared parser and
// ipcache headers, must read what was written through the first.
func TestPrivilegedSecondObjectSharesMaps(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "tendril-shared-maps-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	var lxc bpf.LxcObjects
	if err := bpf.LoadLxcObjects(&lxc, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		t.Fatalf("load pod programs: %v", err)
	}
	t.Cleanup(func() { lxc.Close() })
	lxcSpec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	sharedSpec, shared := loadShared(t, dir)

	var lxcNames, sharedNames []string
	for name := range lxcSpec.Maps {
		if lxcSpec.Maps[name].Pinning == ebpf.PinByName {
			lxcNames = append(lxcNames, name)
		}
	}
	for name, m := range shared.Maps {
		if sharedSpec.Maps[name].Pinning != ebpf.PinByName {
			continue // its own .bss
		}
		sharedNames = append(sharedNames, name)
		spec := lxcSpec.Maps[name]
		if spec == nil {
			t.Errorf("second object has map %s the pod programs do not", name)
			continue
		}
		pinned, err := ebpf.LoadPinnedMap(dir+"/"+name, nil)
		if err != nil {
			t.Errorf("map %s is not pinned: %v", name, err)
			continue
		}
		if a, b := mapID(t, m), mapID(t, pinned); a != b {
			t.Errorf("map %s: second object has kernel map %d, the pin is %d", name, a, b)
		}
		pinned.Close()
	}
	sort.Strings(lxcNames)
	sort.Strings(sharedNames)
	if fmt.Sprint(sharedNames) != fmt.Sprint(lxcNames) {
		t.Errorf("second object's maps %v, want the pod programs' pinned maps %v", sharedNames, lxcNames)
	}

	// 10.0.0.0/8 has identity 1234 through the pod programs' handle.
	key := bpf.LxcIpcacheKey{Prefixlen: 32 + 8, Family: 4}
	copy(key.Addr[:], []byte{10})
	if err := lxc.TdrIpcacheV2.Put(&key, &bpf.LxcIpcacheInfo{Identity: 1234}); err != nil {
		t.Fatal(err)
	}
	prog := shared.Programs["dst_identity"]
	if prog == nil {
		t.Fatal("second object has no dst_identity program")
	}
	for _, tc := range []struct {
		dst  [4]byte
		want uint32
	}{
		{[4]byte{10, 1, 2, 3}, 1234},
		{[4]byte{192, 168, 1, 1}, 2}, // unknown: world
	} {
		ret, err := prog.Run(&ebpf.RunOptions{Data: udp4([4]byte{10, 9, 9, 9}, tc.dst)})
		if err != nil {
			t.Fatalf("run dst_identity: %v", err)
		}
		if ret != tc.want {
			t.Errorf("identity of %v through the second object = %d, want %d", tc.dst, ret, tc.want)
		}
	}
	if shared.Programs["connect4"] == nil {
		t.Error("second object has no connect4 program")
	}
}

// udp4 is an Ethernet + IPv4 + UDP frame from src to dst.
func udp4(src, dst [4]byte) []byte {
	b := make([]byte, 14+20+8)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 20+8)
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 53)
	binary.BigEndian.PutUint16(udp[4:], 8)
	return b
}
