package compensator

import (
	"errors"
	"fmt"
	"testing"
)

// A pass counts as completed only when every one of its failures has a
// metric of its own: one database error among reported failures, however
// deep in the joins and wraps, makes it a failed pass. The broker found
// gone, by any phase, is reported (orderpipe_compensator_broker_up).
func TestOnlyReported(t *testing.T) {
	broker := fmt.Errorf("%w: stream ORDERS: %w", ErrBrokerUnavailable, errors.New("timeout"))
	refund := reportedError{errors.New("refund cancelled order x: provider 500")}
	db := errors.New("count stuck orders: connection refused")
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, true},
		{"the broker", broker, true},
		{"the broker, and the outage not recorded", errors.Join(broker, db), false},
		{"refunds in batches", fmt.Errorf("batch: %w", errors.Join(refund, errors.Join(refund, refund))), true},
		{"a refund and a database error", errors.Join(refund, fmt.Errorf("record refund: %w", db)), false},
		{"a database error", db, false},
		{"the broker, found gone by a publish", fmt.Errorf("publish healed events: %w", fmt.Errorf("%w; 2 event(s) left to the relay", fmt.Errorf("%w: not connected (CLOSED)", ErrBrokerUnavailable))), true},
		{"publishes not acknowledged", errors.Join(fmt.Errorf("%w: publish a (x): %w", ErrBrokerUnavailable, errors.New("timeout")), fmt.Errorf("%w: 3 publish(es) not acknowledged within 5s", ErrBrokerUnavailable)), true},
		{"a publish lost, and its stamp failed", errors.Join(fmt.Errorf("%w: not connected (CLOSED)", ErrBrokerUnavailable), fmt.Errorf("stamp: %w", db)), false},
		{"a database error that mentions the broker deeper", fmt.Errorf("record outage: %w", fmt.Errorf("query: %w", db)), false},
	} {
		if got := onlyReported(c.err); got != c.want {
			t.Errorf("%s: onlyReported = %v, want %v", c.name, got, c.want)
		}
	}
}
