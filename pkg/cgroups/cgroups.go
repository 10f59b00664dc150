// Package cgroups finds the pods' cgroups under a cgroup v2 hierarchy as
// the kubelet lays them out, and their cgroup IDs (what
// bpf_get_current_cgroup_id returns in a process of the cgroup: the
// directory's inode number), so that a socket event's cgroup names its
// pod.
package cgroups

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Cgroup is one cgroup of a pod: the pod's own (Container false) or one
// of its containers'.
type Cgroup struct {
	PodUID    string
	ID        uint64
	Path      string
	Container bool
}

// podUID is the pod UID a kubelet cgroup directory is named after:
// pod<uid> (cgroupfs driver) or kubepods-<qos>-pod<uid with _ for ->.slice
// (systemd driver); "" for any other directory.
func podUID(name string) string {
	if uid, ok := strings.CutPrefix(name, "pod"); ok && len(uid) >= 32 {
		return uid
	}
	if strings.HasSuffix(name, ".slice") {
		if i := strings.LastIndex(name, "-pod"); i >= 0 {
			uid := strings.TrimSuffix(name[i+len("-pod"):], ".slice")
			if len(uid) >= 32 {
				return strings.ReplaceAll(uid, "_", "-")
			}
		}
	}
	return ""
}

// Scan walks root for the pods' cgroups and their containers'. A
// directory that goes while it is walked is skipped.
func Scan(root string) ([]Cgroup, error) {
	var out []Cgroup
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		uid := podUID(d.Name())
		if uid == "" {
			return nil
		}
		if id, ok := inode(path); ok {
			out = append(out, Cgroup{PodUID: uid, ID: id, Path: path})
		}
		children, err := os.ReadDir(path)
		if err == nil {
			for _, c := range children {
				if !c.IsDir() {
					continue
				}
				p := filepath.Join(path, c.Name())
				if id, ok := inode(p); ok {
					out = append(out, Cgroup{PodUID: uid, ID: id, Path: p, Container: true})
				}
			}
		}
		return filepath.SkipDir
	})
	if err != nil {
		return nil, fmt.Errorf("scan cgroups under %s: %w", root, err)
	}
	return out, nil
}

// ID is the cgroup ID of the cgroup at path.
func ID(path string) (uint64, error) {
	id, ok := inode(path)
	if !ok {
		return 0, fmt.Errorf("cgroup %s: no inode", path)
	}
	return id, nil
}

func inode(path string) (uint64, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}
