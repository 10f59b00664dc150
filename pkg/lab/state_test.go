package lab

import (
	"os"
	"testing"
)

func TestValidateName(t *testing.T) {
	for name, ok := range map[string]bool{
		"tdrlab": true, "e2e": true, "2lab": false, "tdre2e": true, "a": true, "abcdefghijkl": true,
		"abcdefghijklm": false, "": false, "Lab": false, "my-lab": false, "lab/x": false,
	} {
		if err := ValidateName(name); (err == nil) != ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestParsePodRef(t *testing.T) {
	for _, tc := range []struct {
		ref, ns, name string
		ok            bool
	}{
		{"demo/web", "demo", "web", true},
		{"web", "default", "web", true},
		{"/web", "", "", false},
		{"demo/", "", "", false},
		{"a/b/c", "", "", false},
	} {
		ns, name, err := ParsePodRef(tc.ref)
		if (err == nil) != tc.ok || ns != tc.ns || name != tc.name {
			t.Errorf("ParsePodRef(%q) = %q, %q, %v", tc.ref, ns, name, err)
		}
	}
}

func TestPodRecords(t *testing.T) {
	st := &State{Dir: t.TempDir()}
	if err := os.MkdirAll(st.PodDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pod("demo", "web"); err == nil {
		t.Fatal("a missing pod was found")
	}
	rec := PodRecord{Namespace: "demo", Name: "web", UID: "new", Netns: "tdrlab-pod-0123456789ab"}
	if err := st.WritePod(rec); err != nil {
		t.Fatal(err)
	}
	// The old pod of the same name is torn down after the new one started:
	// its removal must not drop the new record.
	if err := st.RemovePod("demo", "web", "old"); err != nil {
		t.Fatal(err)
	}
	got, err := st.Pod("demo", "web")
	if err != nil || got.Netns != rec.Netns {
		t.Fatalf("record after removing an older pod: %+v, %v", got, err)
	}
	if err := st.RemovePod("demo", "web", "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pod("demo", "web"); err == nil {
		t.Fatal("record still there after its removal")
	}
}

func TestProcessStartNamesThisProcess(t *testing.T) {
	start, err := processStart(os.Getpid())
	if err != nil || start == 0 {
		t.Fatalf("processStart(self) = %d, %v", start, err)
	}
	if !(Process{PID: os.Getpid(), Start: start}).Alive() {
		t.Error("this process is not alive")
	}
	if (Process{PID: os.Getpid(), Start: start + 1}).Alive() {
		t.Error("a different start time matched: a recycled PID would be killed")
	}
}

func TestCmdlineNamesDir(t *testing.T) {
	dir := "/var/run/tendril-lab/tdre2e"
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"kubelet\x00--root-dir=/var/run/tendril-lab/tdre2e/nodes/node1\x00", true},
		{"agent\x00/var/run/tendril-lab/tdre2e\x00", true},
		{"agent\x00/var/run/tendril-lab/tdre2e", true},
		// Another lab whose name starts with this one's.
		{"containerd-shim\x00-address\x00/var/run/tendril-lab/tdre2ecd/nodes/node2/containerd.sock\x00", false},
		// Both in one argument: the second names it.
		{"x\x00/var/run/tendril-lab/tdre2ecd:/var/run/tendril-lab/tdre2e/y\x00", true},
		{"sleep\x00100\x00", false},
	} {
		if got := CmdlineNamesDir([]byte(tc.cmdline), dir); got != tc.want {
			t.Errorf("CmdlineNamesDir(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}
