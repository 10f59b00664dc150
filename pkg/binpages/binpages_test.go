package binpages

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestReadOnly(t *testing.T) {
	maps := `00400000-02a00000 r-xp 00000000 08:01 123 /usr/bin/tendril-agent
02a00000-05100000 r--p 02600000 08:01 123 /usr/bin/tendril-agent
05100000-05200000 rw-p 04d00000 08:01 123 /usr/bin/tendril-agent
05200000-05300000 rw-p 00000000 00:00 0 
7f0000000000-7f0000001000 r--s 00000000 08:01 123 /usr/bin/tendril-agent
7f0000002000-7f0000003000 r-xp 00000000 08:01 456 /usr/bin/tendril-agent-old
7f0000004000-7f0000005000 r--p 00000000 08:01 789 /tmp/with space/tendril-agent
garbage line
`
	want := []Segment{{0x400000, 0x2a00000, "r-xp"}, {0x2a00000, 0x5100000, "r--p"}}
	if got := ReadOnly(maps, "/usr/bin/tendril-agent"); !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadOnly = %+v, want %+v", got, want)
	}
	if got := ReadOnly(maps, "/tmp/with space/tendril-agent"); len(got) != 1 || got[0].Start != 0x7f0000004000 {
		t.Fatalf("a path with a space: %+v", got)
	}
}

// rssFileKiB is this process's RssFile.
func rssFileKiB(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "RssFile:"); ok {
			var kb int
			for _, c := range strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")) {
				kb = kb*10 + int(c-'0')
			}
			return kb
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestRelease: the test binary's own read-only pages are unmapped (its
// RssFile falls) and the process keeps running code from them.
func TestRelease(t *testing.T) {
	before := rssFileKiB(t)
	n, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("advised no mapping of the test binary")
	}
	after := rssFileKiB(t)
	if after >= before {
		t.Fatalf("RssFile %d kB before, %d kB after Release", before, after)
	}
	t.Logf("RssFile %d → %d kB (%d MiB of mappings advised)", before, after, n>>20)
}
