package compensator

import (
	"errors"
	"fmt"
	"testing"
)

// A pass counts as completed only when every one of its failures has a
// metric of its own: one database error among reported failures, however
// deep in the joins and wraps, makes it a failed pass.
func TestOnlyReported(t *testing.T) {
	broker := reportedError{fmt.Errorf("%w: stream ORDERS: %w", ErrBrokerUnavailable, errors.New("timeout"))}
	db := errors.New("count stuck orders: connection refused")
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, true},
		{"the broker", broker, true},
		{"the broker, and the outage not recorded", errors.Join(broker, db), false},
		{"the broker in batches", fmt.Errorf("batch: %w", errors.Join(broker, errors.Join(broker, broker))), true},
		{"the broker and a database error", errors.Join(broker, fmt.Errorf("record re-drive: %w", db)), false},
		{"a database error", db, false},
		{"a bare broker error, not marked", ErrBrokerUnavailable, false},
	} {
		if got := onlyReported(c.err); got != c.want {
			t.Errorf("%s: onlyReported = %v, want %v", c.name, got, c.want)
		}
	}
}
