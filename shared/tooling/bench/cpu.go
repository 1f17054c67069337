package bench

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"orderpipe/shared/tooling/procstat"
)

// CPU groups: the processes whose processor time a run reports apart.
const (
	CPULoadGenerator = "load generator" // this process
	CPUPostgres      = "postgres"       // every process named postgres
	CPUStack         = "orderpipe"      // every other process of this program: the stack under test
	CPUNATS          = "nats-server"    // a stand-alone NATS server
	CPUOther         = "other"          // the rest of the machine's busy time
)

// CPU is the processor time the machine spent during a run, read from
// Linux's /proc (absent elsewhere): where a core goes per answered
// request, to tell the intake's cost from the database's and the load
// generator's when they share a machine.
type CPU struct {
	// Cores is the machine's logical CPUs.
	Cores int `json:"cores"`
	// Seconds is the wall time between the two readings.
	Seconds float64 `json:"seconds"`
	// Busy is the processor time of the whole machine (/proc/stat: all
	// but idle and iowait), in seconds; BusyCores the same per second of
	// wall time.
	Busy      float64 `json:"busy_s"`
	BusyCores float64 `json:"busy_cores"`
	// ByGroup is the processor time (user + system) of each group's
	// processes, in seconds. Other is Busy less the groups.
	ByGroup map[string]float64 `json:"by_group_s"`
	// PerOK is ByGroup (and "machine": Busy) in microseconds per 2xx
	// answer of the run.
	PerOK map[string]float64 `json:"per_ok_us"`
}

// userHZ is the unit of the times in /proc: USER_HZ, 100 on every
// architecture Linux supports, whatever the kernel's own tick rate.
const userHZ = 100

// cpuReading is one reading of /proc: each process's group and ticks, and
// the machine's busy ticks.
type cpuReading struct {
	procs map[int]procTicks
	busy  uint64
}

type procTicks struct {
	group string
	ticks uint64
}

// readCPU reads /proc; ok is false where there is none.
func readCPU() (cpuReading, bool) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuReading{}, false
	}
	busy, ok := machineBusy(stat)
	if !ok {
		return cpuReading{}, false
	}
	r := cpuReading{procs: map[int]procTicks{}, busy: busy}
	self := os.Getpid()
	me, _ := procstat.Read(self)
	for pid, st := range procstat.All() {
		r.procs[pid] = procTicks{group: cpuGroup(pid, self, st.Comm, me.Comm), ticks: st.Ticks}
	}
	return r, true
}

// machineBusy returns the busy ticks of /proc/stat's first line (user,
// nice, system, irq, softirq, steal: all but idle and iowait).
func machineBusy(stat []byte) (uint64, bool) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		busy += n
	}
	return busy, true
}

// cpuGroup places a process: this one, PostgreSQL's, the stack's (named
// orderpipe, or as this program is named), a NATS server's, or other.
func cpuGroup(pid, self int, comm, selfComm string) string {
	switch {
	case pid == self:
		return CPULoadGenerator
	case comm == "postgres":
		return CPUPostgres
	case comm == "orderpipe" || (comm == selfComm && comm != ""):
		return CPUStack
	case comm == "nats-server":
		return CPUNATS
	}
	return CPUOther
}

// since returns the processor time from r0 to r1, over wall seconds, per
// ok answers. A process present in both readings counts its difference,
// one that started in between all of its time; one that ended in between
// is counted in Busy and Other only.
func since(r0, r1 cpuReading, wall float64, ok int64) *CPU {
	c := &CPU{Cores: runtime.NumCPU(), Seconds: wall, ByGroup: map[string]float64{}, PerOK: map[string]float64{}}
	c.Busy = float64(r1.busy-min(r0.busy, r1.busy)) / userHZ
	if wall > 0 {
		c.BusyCores = c.Busy / wall
	}
	var grouped float64
	for pid, p1 := range r1.procs {
		t := p1.ticks
		if p0, seen := r0.procs[pid]; seen && p0.group == p1.group {
			t -= min(p0.ticks, t)
		}
		if p1.group == CPUOther || t == 0 {
			continue
		}
		s := float64(t) / userHZ
		c.ByGroup[p1.group] += s
		grouped += s
	}
	c.ByGroup[CPUOther] = max(c.Busy-grouped, 0)
	if ok > 0 {
		for g, s := range c.ByGroup {
			c.PerOK[g] = s * 1e6 / float64(ok)
		}
		c.PerOK["machine"] = c.Busy * 1e6 / float64(ok)
	}
	return c
}

// String is the summary line: each group's cores and µs per answer.
func (c *CPU) String() string {
	groups := make([]string, 0, len(c.ByGroup))
	for g := range c.ByGroup {
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool { return c.ByGroup[groups[i]] > c.ByGroup[groups[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "cpu: machine %.2f of %d cores", c.BusyCores, c.Cores)
	if us, ok := c.PerOK["machine"]; ok {
		fmt.Fprintf(&b, " (%.0f µs per ok)", us)
	}
	for _, g := range groups {
		cores := 0.0
		if c.Seconds > 0 {
			cores = c.ByGroup[g] / c.Seconds
		}
		fmt.Fprintf(&b, "; %s %.2f", g, cores)
		if us, ok := c.PerOK[g]; ok {
			fmt.Fprintf(&b, " (%.0f µs)", us)
		}
	}
	return b.String()
}
