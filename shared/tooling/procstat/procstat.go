// Package procstat reads Linux processes' /proc/PID/stat lines: what the
// benchmark's processor accounting and the local PostgreSQL's tests need
// of them.
package procstat

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stat is what the tooling reads of one /proc/PID/stat line.
type Stat struct {
	// Comm is the command name.
	Comm string
	// State is the process state: R, S, D, Z, …
	State string
	// PPid is the parent's pid.
	PPid int
	// Ticks is the processor time used, utime + stime, in clock ticks.
	Ticks uint64
}

// Parse parses one /proc/PID/stat line. The command name may hold spaces
// and parentheses, so it ends at the last ')'.
func Parse(line []byte) (Stat, bool) {
	open, end := bytes.IndexByte(line, '('), bytes.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return Stat{}, false
	}
	f := strings.Fields(string(line[end+1:]))
	// After the name: state (field 3 of the man page), ppid (4) … utime
	// (14), stime (15).
	if len(f) < 13 {
		return Stat{}, false
	}
	ppid, err0 := strconv.Atoi(f[1])
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil {
		return Stat{}, false
	}
	return Stat{Comm: string(line[open+1 : end]), State: f[0], PPid: ppid, Ticks: u + s}, true
}

// Read reads the stat line of pid ("self" is not a pid: use os.Getpid);
// ok is false when the process is gone or there is no /proc.
func Read(pid int) (Stat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, false
	}
	return Parse(b)
}

// All reads every process's stat line, by pid; a process that ends while
// it reads is left out. It is empty where there is no /proc.
func All() map[int]Stat {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	all := make(map[int]Stat, len(dirs))
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, ok := Read(pid); ok {
			all[pid] = st
		}
	}
	return all
}
