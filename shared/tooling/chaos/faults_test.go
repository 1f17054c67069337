package chaos

import (
	"fmt"
	"testing"
)

// TestTheSameSeedDrawsTheSameSchedule: the schedule depends on the seed
// only, not on what the stack was doing. One scheduler only draws; a
// second of the same seed also injects each drawn fault into a stack in a
// state that refuses it (every part down, a NATS node down already, the
// stream deleted twice), as a run meets such states. Both draw the same
// schedule, and each refused fault is logged as not injected, not counted.
func TestTheSameSeedDrawsTheSameSchedule(t *testing.T) {
	down := func() *stack {
		s := &stack{log: &faultLog{}, comp: &proc{name: "compensator"}, psp: &proc{name: "psp"}}
		for i := range 2 {
			s.producers = append(s.producers, &proc{name: fmt.Sprintf("producer-%d", i+1)})
			s.consumers = append(s.consumers, &proc{name: fmt.Sprintf("consumers-%d", i+1)})
		}
		for i := range 3 {
			s.nodes = append(s.nodes, &proc{name: fmt.Sprintf("n%d", i+1)})
		}
		return s
	}
	const seed = 42
	only := newScheduler(down(), seed)
	s := down()
	injecting := newScheduler(s, seed)
	injecting.natsDown, injecting.deletions = true, 2
	refusable := map[string]bool{"kill -9 part": true, "nats node stop": true, "stream deleted": true}
	kinds, refused := map[string]int{}, 0
	for i := range 2000 {
		want, got := only.next(), injecting.next()
		if got != want {
			t.Fatalf("draw %d: %+v, want %+v (the same seed)", i, got, want)
		}
		kinds[got.kind]++
		if refusable[got.kind] {
			injecting.inject(t.Context(), got)
			refused++
		}
	}
	if len(kinds) != len(faultKinds) {
		t.Fatalf("2000 draws drew the kinds %v, want all %d", kinds, len(faultKinds))
	}
	if n := s.log.injected(); n != 0 || s.log.counts()[notInjected] != refused {
		t.Fatalf("%d faults counted as injected, %d logged as not injected; want 0 and %d", n, s.log.counts()[notInjected], refused)
	}
	other, ref, same := newScheduler(down(), seed+1), newScheduler(down(), seed), 0
	for range 10 {
		if other.next() == ref.next() {
			same++
		}
	}
	if same == 10 {
		t.Fatal("another seed drew the same schedule")
	}
}
