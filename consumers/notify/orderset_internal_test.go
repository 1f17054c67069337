package notify

import (
	"testing"

	"github.com/google/uuid"
)

// TestOrderSetIsBounded: the set holds at most its size, and forgets the
// oldest entries first.
func TestOrderSetIsBounded(t *testing.T) {
	s := newOrderSet(3)
	keys := make([][2]uuid.UUID, 5)
	for i := range keys {
		keys[i] = [2]uuid.UUID{uuid.New(), uuid.New()}
		s.add(keys[i])
		s.add(keys[i]) // twice: still one entry
	}
	if len(s.in) != 3 || len(s.ring) != 3 {
		t.Fatalf("%d entries, ring %d; want 3", len(s.in), len(s.ring))
	}
	for i, k := range keys {
		if want := i >= 2; s.has(k) != want {
			t.Errorf("key %d: has %v, want %v", i, s.has(k), want)
		}
	}
	if s.has([2]uuid.UUID{keys[4][0], keys[3][1]}) {
		t.Error("a pair never added is in the set")
	}
}
