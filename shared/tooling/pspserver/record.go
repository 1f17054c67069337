package pspserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The charges' group commit. Every charge is recorded by one INSERT of
// its key, which with no latency is the whole of its writes; concurrent
// charges (the payment step's workers call at once) share one statement
// and one commit, as the intake's creates and the steps' messages do.
// The stand-in is the measuring rig, not the product: one commit per
// charge was the only write of the pipeline's dev stack not batched, the
// third costliest statement per order at 800 orders/s
// (docs/benchmarks.md, twentieth step).

// maxChargeBatch bounds the charges of one statement.
const maxChargeBatch = 64

// newCharge is a charge to record: its key, the request's fingerprint and
// what was decided (state in_flight: not yet).
type newCharge struct {
	key, chargeID, amount, currency, reference, state, reason string
	fp                                                        []byte
	// done gets whether the row was new (false: the key existed) or the
	// error of the statement that carried it.
	done chan recorded
}

type recorded struct {
	inserted bool
	err      error
}

// recordTimeout bounds one batch's statement: the batch outlives a caller
// that gives up, whose charge may be recorded (a provider that charged
// and whose answer was lost; a repeat of the key gets it).
const recordTimeout = 30 * time.Second

// record inserts c's row in the next batch and reports whether it was
// new.
func (s *Server) record(c *newCharge) (bool, error) {
	c.done = make(chan recorded, 1)
	s.charges.Add(c)
	r := <-c.done
	return r.inserted, r.err
}

// recordBatch is the charges' flush: one statement for the batch, keys in
// order (two stand-ins' batches holding a key each of the other's wait
// for each other rather than deadlock), each key once (a second charge of
// the same key in the batch finds it existing, as it would one statement
// later). When the statement fails, each charge is recorded alone, so
// that its error is its own.
func (s *Server) recordBatch(batch []*newCharge) {
	if err := s.insertCharges(batch); err != nil && len(batch) > 1 {
		for _, c := range batch {
			s.recordBatch([]*newCharge{c})
		}
	} else if err != nil {
		batch[0].done <- recorded{err: err}
	}
}

// insertCharges runs the statement and answers each charge; it answers
// none when it fails.
func (s *Server) insertCharges(batch []*newCharge) error {
	first := map[string]*newCharge{}
	var rows []*newCharge
	for _, c := range batch {
		if _, seen := first[c.key]; !seen {
			first[c.key] = c
			rows = append(rows, c)
		}
	}
	slices.SortFunc(rows, func(a, b *newCharge) int { return strings.Compare(a.key, b.key) })
	cols := make([][]string, 7)
	fps := make([][]byte, len(rows))
	for i, c := range rows {
		for j, v := range []string{c.key, c.chargeID, c.amount, c.currency, c.reference, c.state, c.reason} {
			cols[j] = append(cols[j], v)
		}
		fps[i] = c.fp
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	res, err := s.pool.Query(ctx, `
		INSERT INTO psp_charges (idempotency_key, fingerprint, state, charge_id, amount, currency, reference, reason, completed_at)
		SELECT t.k, t.fp, t.st, t.id, t.amount::numeric, t.cur, t.ref, NULLIF(t.reason, ''), CASE WHEN t.st <> 'in_flight' THEN now() END
		FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
		  AS t(k, fp, id, amount, cur, ref, st, reason)
		ON CONFLICT (idempotency_key) DO NOTHING
		RETURNING idempotency_key`, cols[0], fps, cols[1], cols[2], cols[3], cols[4], cols[5], cols[6])
	if err != nil {
		return fmt.Errorf("record %d charge(s): %w", len(rows), err)
	}
	keys, err := pgx.CollectRows(res, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("record %d charge(s): %w", len(rows), err)
	}
	isNew := make(map[string]bool, len(keys))
	for _, k := range keys {
		isNew[k] = true
	}
	for _, c := range batch {
		c.done <- recorded{inserted: isNew[c.key] && first[c.key] == c}
	}
	return nil
}
