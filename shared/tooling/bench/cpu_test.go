package bench

import (
	"strings"
	"testing"
)

// TestMachineBusy sums the busy ticks of /proc/stat's first line and
// refuses malformed ones.
func TestMachineBusy(t *testing.T) {
	t.Parallel()
	if busy, ok := machineBusy([]byte("cpu  100 5 50 9000 40 2 3 1 0 0\ncpu0 1 2 3\n")); !ok || busy != 161 {
		t.Errorf("machineBusy: %d %v, want 161 (user+nice+system+irq+softirq+steal)", busy, ok)
	}
	for _, bad := range []string{"", "cpu 1 2", "intr 1 2 3 4 5 6 7 8 9", "cpu a b c d e f g h"} {
		if _, ok := machineBusy([]byte(bad)); ok {
			t.Errorf("machineBusy(%q): accepted", bad)
		}
	}
}

// TestCPUSince: a process in both readings counts its difference, one
// that started in between all of its time, one that ended in between
// nothing; a pid reused by another group counts from zero; what no group
// used is other.
func TestCPUSince(t *testing.T) {
	t.Parallel()
	r0 := cpuReading{busy: 1000, procs: map[int]procTicks{
		1: {CPUPostgres, 500}, 2: {CPUStack, 300}, 3: {CPULoadGenerator, 10}, 4: {CPUPostgres, 999}, 5: {CPUStack, 50},
	}}
	r1 := cpuReading{busy: 1600, procs: map[int]procTicks{
		1: {CPUPostgres, 700}, 2: {CPUStack, 450}, 3: {CPULoadGenerator, 60}, 6: {CPUPostgres, 40}, 5: {CPUPostgres, 20},
	}}
	c := since(r0, r1, 2, 100)
	want := map[string]float64{CPUPostgres: 2.6, CPUStack: 1.5, CPULoadGenerator: 0.5, CPUOther: 1.4}
	for g, s := range want {
		if d := c.ByGroup[g] - s; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: %.2f s, want %.2f", g, c.ByGroup[g], s)
		}
	}
	if c.Busy != 6 || c.BusyCores != 3 || c.PerOK["machine"] != 60000 || c.PerOK[CPUStack] != 15000 {
		t.Errorf("busy %.1f s, %.1f cores, per ok %v", c.Busy, c.BusyCores, c.PerOK)
	}
	if s := c.String(); !strings.HasPrefix(s, "cpu: machine 3.00 of ") || !strings.Contains(s, "postgres 1.30 (26000 µs)") {
		t.Errorf("summary %q", s)
	}
	if c := since(r0, r1, 2, 0); len(c.PerOK) != 0 {
		t.Errorf("no answers: per ok %v, want none", c.PerOK)
	}
}

// TestDBActivity: the counters' differences, per ok answer, and none per
// answer without answers.
func TestDBActivity(t *testing.T) {
	t.Parallel()
	a := activity(dbReading{commits: 10, inserted: 5, updated: 7}, dbReading{commits: 310, rollbacks: 2, inserted: 905, updated: 307, deleted: 1}, 100)
	if a.Commits != 300 || a.Rollbacks != 2 || a.Inserted != 900 || a.Updated != 300 || a.Deleted != 1 ||
		a.PerOK["commits"] != 3 || a.PerOK["rows_inserted"] != 9 || a.PerOK["rows_updated"] != 3 || a.PerOK["rows_deleted"] != 0.01 {
		t.Fatalf("activity: %+v", a)
	}
	if s := a.String(); !strings.Contains(s, "300 commits") || !strings.Contains(s, "per ok: 3.00 commits, rows 9.00 inserted") {
		t.Errorf("summary %q", s)
	}
	if a := activity(dbReading{}, dbReading{commits: 1}, 0); a.PerOK != nil || strings.Contains(a.String(), "per ok") {
		t.Errorf("no answers: %+v", a)
	}
	if _, ok := readDB(nil); ok {
		t.Error("readDB without a pool: ok")
	}
}
