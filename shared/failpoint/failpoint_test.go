package failpoint

import (
	"errors"
	"testing"
)

func TestEnableFiresOnNthHit(t *testing.T) {
	disable := Enable("t.point", 2)
	defer disable()
	if err := Inject("t.point"); err != nil {
		t.Fatalf("first hit: %v", err)
	}
	if err := Inject("t.point"); !errors.Is(err, ErrInjected) {
		t.Fatalf("second hit: %v", err)
	}
	if err := Inject("t.point"); err != nil {
		t.Fatalf("third hit: %v", err)
	}
	if err := Inject("other"); err != nil {
		t.Fatal(err)
	}
}

func TestParseMalformed(t *testing.T) {
	for _, s := range []string{"x", "=exit", "x=boom", "x=exit@0", "x=exit@z"} {
		if err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = nil, want error", s)
		}
	}
	if err := Parse("a.b=error@3, c=exit"); err != nil {
		t.Fatal(err)
	}
}
