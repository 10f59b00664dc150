package realnode

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	// Mount is where it is mounted.
	Mount string
	// V2 says it is the cgroup2 (unified) hierarchy.
	V2 bool
	// Cpuset says it has the cpuset controller (a v1 cpuset cgroup takes
	// no task before cpuset.cpus and cpuset.mems are set).
	Cpuset bool
}

// Hierarchies lists the mounted cgroup hierarchies, from /proc/mounts.
func Hierarchies() ([]Hierarchy, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return nil, fmt.Errorf("list cgroup hierarchies: %w", err)
	}
	defer f.Close()
	return parseHierarchies(f)
}

// parseHierarchies reads the cgroup and cgroup2 mounts of a mounts table
// (/proc/mounts format); a hierarchy mounted twice is listed once.
func parseHierarchies(r io.Reader) ([]Hierarchy, error) {
	var hs []Hierarchy
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || (fields[2] != "cgroup" && fields[2] != "cgroup2") {
			continue
		}
		// The options name a v1 hierarchy's controllers; cgroup2 has one.
		key := fields[2] + " " + fields[3]
		if fields[2] == "cgroup" {
			var ctrls []string
			for _, o := range strings.Split(fields[3], ",") {
				if o != "rw" && o != "ro" && !strings.HasPrefix(o, "relatime") && o != "nosuid" && o != "nodev" && o != "noexec" {
					ctrls = append(ctrls, o)
				}
			}
			key = "cgroup " + strings.Join(ctrls, ",")
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		h := Hierarchy{Mount: fields[1], V2: fields[2] == "cgroup2"}
		if !h.V2 {
			for _, o := range strings.Split(fields[3], ",") {
				if o == "cpuset" {
					h.Cpuset = true
				}
			}
		}
		hs = append(hs, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/mounts: %w", err)
	}
	if len(hs) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return hs, nil
}

// PrepareCgroupRoot creates the kubelet's cgroupRoot (relative to each
// hierarchy's root) in every hierarchy: on a v1 or hybrid machine the
// kubelet checks it exists in each before it starts, and a v1 cpuset
// cgroup needs the parent's cpuset.cpus and cpuset.mems copied in before
// any task may join it.
func PrepareCgroupRoot(hs []Hierarchy, root string) error {
	for _, h := range hs {
		dir := filepath.Join(h.Mount, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		if !h.Cpuset {
			continue
		}
		// Every level from the top: MkdirAll made the parents with empty
		// cpusets too.
		cur := h.Mount
		for _, part := range strings.Split(strings.Trim(filepath.Clean(root), "/"), "/") {
			parent := cur
			cur = filepath.Join(cur, part)
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if have, err := os.ReadFile(filepath.Join(cur, f)); err == nil && strings.TrimSpace(string(have)) != "" {
					continue
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return fmt.Errorf("cgroup %s: read the parent's %s: %w", cur, f, err)
				}
				if err := os.WriteFile(filepath.Join(cur, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: write %s: %w", cur, f, err)
				}
			}
		}
	}
	return nil
}

// RemoveCgroupRoot removes the cgroupRoot and every cgroup the kubelet and
// runc made under it (kubepods, QoS classes, pods, containers), in every
// hierarchy, deepest first. Cgroups still holding tasks are retried for a
// few seconds (a process killed a moment ago leaves its cgroup a little
// later); it returns how many directories it removed.
func RemoveCgroupRoot(hs []Hierarchy, root string) (int, error) {
	if root == "" || root == "/" || strings.Contains(root, "..") {
		return 0, fmt.Errorf("cgroup root %q: refusing to remove", root)
	}
	removed := 0
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h.Mount, root)
		var dirs []string
		err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("walk cgroup %s: %w", top, err))
			continue
		}
		// Deepest first: a cgroup goes only after its children.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := rmdirRetry(d, 5*time.Second); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// KillCgroupRoot sends SIGKILL to every process in the cgroupRoot's tree,
// in every hierarchy, until none is left or wait passes: the containers
// runc started (in pod network namespaces the lab does not name) are found
// only there. It returns how many it killed.
func KillCgroupRoot(hs []Hierarchy, root string, wait time.Duration) (int, error) {
	if root == "" || root == "/" || strings.Contains(root, "..") {
		return 0, fmt.Errorf("cgroup root %q: refusing to kill its tree", root)
	}
	killed := map[int]bool{}
	deadline := time.Now().Add(wait)
	for {
		left := 0
		for _, h := range hs {
			_ = filepath.WalkDir(filepath.Join(h.Mount, root), func(path string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
				if err != nil {
					return nil
				}
				for _, f := range strings.Fields(string(data)) {
					pid, err := strconv.Atoi(f)
					if err != nil || pid <= 0 {
						continue
					}
					left++
					if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
						killed[pid] = true
					}
				}
				return nil
			})
		}
		if left == 0 {
			return len(killed), nil
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("cgroup %s: %d processes still there after %s", root, left, wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rmdirRetry(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
