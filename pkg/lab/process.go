package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a detached process of the lab, as its pid file records it.
type Process struct {
	Role string
	PID  int
	// Start is the process' start time in clock ticks since boot
	// (/proc/PID/stat field 22): with the PID it names the process, so a
	// recycled PID is never mistaken for the lab's.
	Start uint64
}

// processStart reads a process' start time; an error means it is gone
// (a zombie is gone: it has exited).
func processStart(pid int) (uint64, error) {
	state, start, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	if state == "Z" {
		return 0, fmt.Errorf("process %d is a zombie", pid)
	}
	return start, nil
}

// childStart reads the start time of a child not yet waited for. A child
// that has already exited is a zombie, and its PID stays its own until the
// Wait, so its start time is read all the same: the caller's Wait then
// says how it ended, with its exit status.
func childStart(pid int) (uint64, error) {
	_, start, err := readStat(pid)
	return start, err
}

// readStat reads a process' state (field 3) and start time (field 22) from
// /proc/PID/stat.
func readStat(pid int) (string, uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	// Field 3 (state) is fields[0], so field 22 is fields[19].
	if len(fields) < 20 {
		return "", 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return fields[0], start, nil
}

// Alive reports whether the recorded process still runs.
func (p Process) Alive() bool {
	start, err := processStart(p.PID)
	return err == nil && start == p.Start
}

// StartDetached runs argv in a session of its own with its output appended
// to logPath, records it in pidDir under role and returns without waiting:
// the process outlives the caller. Command-line tools that start a lab
// process use it; the lab kubelet starts pod workloads the same way so
// they survive a kubelet restart. A process that exits at once is
// returned like any other: the returned command's Wait says how it ended
// (watchExit), whether it exited before its start time was read or after.
func StartDetached(pidDir, role, logPath string, argv []string) (*exec.Cmd, Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, Process{}, fmt.Errorf("open log of %s: %w", role, err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, Process{}, fmt.Errorf("start %s: %w", role, err)
	}
	p := Process{Role: role, PID: cmd.Process.Pid}
	// Even when it has exited already: the caller's Wait reports how.
	if p.Start, err = childStart(p.PID); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, Process{}, fmt.Errorf("start %s: %w", role, err)
	}
	if err := writeFileAtomic(filepath.Join(pidDir, role+".pid"), fmt.Appendf(nil, "%d %d\n", p.PID, p.Start)); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, Process{}, err
	}
	return cmd, p, nil
}

// ReadProcesses lists the processes recorded in pidDir.
func ReadProcesses(pidDir string) ([]Process, error) {
	entries, err := os.ReadDir(pidDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Process
	for _, e := range entries {
		role, ok := strings.CutSuffix(e.Name(), ".pid")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(pidDir, e.Name()))
		if err != nil {
			continue
		}
		p := Process{Role: role}
		if _, err := fmt.Sscanf(string(data), "%d %d", &p.PID, &p.Start); err != nil {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// RemovePidFile forgets a process.
func RemovePidFile(pidDir, role string) {
	_ = os.Remove(filepath.Join(pidDir, role+".pid"))
}

// killAndWait sends SIGKILL to each live process and waits until they are
// gone (reaped by whoever their parent is), for at most timeout.
func killAndWait(procs []Process, timeout time.Duration) []Process {
	for _, p := range procs {
		if p.Alive() {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var left []Process
		for _, p := range procs {
			if p.Alive() {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processesInNetns lists the processes whose network namespace is one of
// the given namespaces (by the inode of their mount under /run/netns).
func processesInNetns(netnsNames []string) map[string][]Process {
	inodes := map[uint64]string{}
	for _, n := range netnsNames {
		var st syscall.Stat_t
		if err := syscall.Stat(NetnsPath(n), &st); err == nil {
			inodes[st.Ino] = n
		}
	}
	out := map[string][]Process{}
	if len(inodes) == 0 {
		return out
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
			continue
		}
		n, ok := inodes[st.Ino]
		if !ok {
			continue
		}
		start, err := processStart(pid)
		if err != nil {
			continue
		}
		out[n] = append(out[n], Process{Role: "in " + n, PID: pid, Start: start})
	}
	return out
}
