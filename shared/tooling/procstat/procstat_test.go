package procstat_test

import (
	"os"
	"testing"

	"orderpipe/shared/tooling/procstat"
)

// TestParse reads /proc/PID/stat lines whose command names hold spaces
// and parentheses, and refuses malformed ones.
func TestParse(t *testing.T) {
	t.Parallel()
	good := map[string]procstat.Stat{
		"1234 (postgres) S 1 1234 1234 0 -1 4194560 1411 0 0 0 250 75 0 0 20 0 1 0 100 1000 10": {Comm: "postgres", State: "S", PPid: 1, Ticks: 325},
		"77 (my (odd) name) R 1 77 77 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0":                          {Comm: "my (odd) name", State: "R", PPid: 1, Ticks: 7},
	}
	for line, want := range good {
		if got, ok := procstat.Parse([]byte(line)); !ok || got != want {
			t.Errorf("%q: got %+v %v, want %+v", line, got, ok, want)
		}
	}
	for _, bad := range []string{"", "1234 postgres S 1", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s", ")1 (x", "1 (x) S p 1 1 0 -1 0 0 0 0 0 1 1"} {
		if _, ok := procstat.Parse([]byte(bad)); ok {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// TestReadAndAll: this process reads as itself, a child of its parent,
// and All finds it.
func TestReadAndAll(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	me, ok := procstat.Read(os.Getpid())
	if !ok || me.PPid != os.Getppid() || me.State == "" || me.Comm == "" {
		t.Fatalf("Read(self) = %+v, %v; want this process, child of %d", me, ok, os.Getppid())
	}
	if got, ok := procstat.All()[os.Getpid()]; !ok || got.Comm != me.Comm || got.PPid != me.PPid {
		t.Fatalf("All()[self] = %+v, %v; want %+v", got, ok, me)
	}
	if _, ok := procstat.Read(-1); ok {
		t.Fatal("Read(-1) found a process")
	}
}
