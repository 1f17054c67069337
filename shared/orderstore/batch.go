package orderstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
)

// acceptedEvent is the event that announces a new order.
func acceptedEvent(id, clientID uuid.UUID, requestID string, at time.Time) orderevent.Event {
	return Change{OrderID: id, ClientID: clientID, RequestID: requestID, Status: order.StatusProcessing}.event(at)
}

// NewOrder is one create request of a batch.
type NewOrder struct {
	// Ctx carries the request's trace, which its accepted event continues.
	Ctx      context.Context
	ClientID uuid.UUID
	Req      order.CreateRequest
}

// BatchResult is what InsertBatch did for one request: Inserted as Insert
// returns it, or Err (order.ErrRequestIDReused for a payload that differs
// from the stored one). Retry marks a request that lost its order number
// to a collision and must go into a later batch. Event is the committed
// accepted event of a new order (Event.ID is Inserted.OutboxID), for the
// caller to publish from memory (outbox.Relay.PublishRows).
type BatchResult struct {
	Inserted
	Err   error
	Retry bool
	Event outbox.Row
}

// insertBatchSQL writes a batch in ONE statement, which PostgreSQL runs
// in one implicit transaction: the orders (a request whose (client,
// request_id) or order number is taken writes nothing), then for each
// order written its history row (seq 1) and its accepted event in the
// outbox. One round trip and one commit for the whole batch.
const insertBatchSQL = `
	WITH ins AS (
		INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency, callback_url)
		SELECT t.order_id, t.order_no, t.client_id, t.request_id, t.fingerprint, 'processing', t.user_id, t.items, t.amount::numeric, t.currency, NULLIF(t.callback_url, '')
		FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bytea[], $6::bigint[], $7::jsonb[], $8::text[], $9::text[], $10::text[])
		     AS t(order_id, order_no, client_id, request_id, fingerprint, user_id, items, amount, currency, callback_url)
		ON CONFLICT DO NOTHING
		RETURNING order_id, created_at, updated_at
	), history AS (
		INSERT INTO order_events (order_id, seq, status, occurred_at)
		SELECT order_id, 1, 'processing', $11 FROM ins
	), events AS (
		INSERT INTO outbox (` + outbox.ColumnList + `)
		SELECT e.* FROM unnest($12::text[], $13::text[], $14::bytea[], $15::jsonb[], $16::uuid[]) AS e(msg_id, event, payload, headers, order_id)
		JOIN ins USING (order_id)
		RETURNING id, order_id
	)
	SELECT ins.order_id, ins.created_at, ins.updated_at, events.id FROM ins JOIN events USING (order_id)`

// Key is an order's idempotency key: its client and request_id.
type Key struct {
	ClientID  uuid.UUID
	RequestID string
}

// GetByRequestIDs reads in one query the orders of clients[i] and
// rids[i], for every i; a key without an order is absent from the map.
// Each key is looked up through the (client_id, request_id) index, also
// by a plan PostgreSQL cached while orders was nearly empty (see
// postgres.DB). The query runs on its generic plan
// (postgres.QueryGeneric): the intake's batches of repeated requests are
// not planned again at every read, so db is a pool or a connection, not a
// transaction.
func GetByRequestIDs(ctx context.Context, db postgres.Batcher, clients []uuid.UUID, rids []string) (map[Key]order.Order, error) {
	stored := make(map[Key]order.Order, len(rids))
	err := postgres.QueryGeneric(ctx, db, func(rows pgx.Rows) error {
		for rows.Next() {
			o, err := scanOrder(rows)
			if err != nil {
				return err
			}
			stored[Key{o.ClientID, o.RequestID}] = o
		}
		return rows.Err()
	}, `SELECT o.* FROM unnest($1::uuid[], $2::text[]) AS k(client_id, request_id)
		CROSS JOIN LATERAL (SELECT `+orderColumns+` FROM orders WHERE client_id = k.client_id AND request_id = k.request_id LIMIT 1) o`, clients, rids)
	if err != nil {
		return nil, fmt.Errorf("read orders by request_id: %w", err)
	}
	return stored, nil
}

// permuted returns a's elements in the order perm names them.
func permuted[T any](perm []int, a []T) []T {
	out := make([]T, len(perm))
	for p, i := range perm {
		out[p] = a[i]
	}
	return out
}

// InsertBatch stores many new orders in ONE statement (insertBatchSQL):
// the orders, their history rows and their accepted events, so that
// concurrent requests share one round trip and one commit (group commit).
// A request whose (client, request_id) exists, committed by an earlier
// request or by another in the same batch, is answered from the stored
// order: replayed when its fingerprint matches, ErrRequestIDReused
// otherwise. It returns one result per request, in order; an error means
// the batch did not commit (and no request of it was stored). Once the
// batch committed, a failure to read the stored orders is the error of
// the requests that needed them only.
func InsertBatch(ctx context.Context, pool *pgxpool.Pool, reqs []NewOrder, newOrderNo func(time.Time) string) ([]BatchResult, error) {
	if newOrderNo == nil {
		newOrderNo = order.NewOrderNo
	}
	n := len(reqs)
	res := make([]BatchResult, n)
	var (
		ids, clients             = make([][16]byte, n), make([][16]byte, n)
		nos, rids, amounts, curs = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		cbs                      = make([]string, n)
		fps, items               = make([][]byte, n), make([][]byte, n)
		users                    = make([]int64, n)
		entries                  = make([]outbox.Entry, n)
		byID                     = make(map[uuid.UUID]int, n)
		now                      = time.Now()
		// The accepted event's time, as PostgreSQL stores it.
		occurred = now.UTC().Truncate(time.Microsecond)
	)
	for i, r := range reqs {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("new order id: %w", err)
		}
		raw, err := json.Marshal(r.Req.Items)
		if err != nil {
			return nil, fmt.Errorf("encode items: %w", err)
		}
		ids[i], clients[i], nos[i], rids[i] = id, r.ClientID, newOrderNo(now), r.Req.RequestID
		fps[i], users[i], items[i] = r.Req.Fingerprint(), r.Req.UserID, raw
		amounts[i], curs[i], cbs[i] = r.Req.Amount.String(), r.Req.Currency, r.Req.CallbackURL
		byID[id] = i
		entries[i] = outbox.Entry{Ctx: r.Ctx, Event: acceptedEvent(id, r.ClientID, r.Req.RequestID, occurred)}
	}
	events, err := outbox.Rows(ctx, entries)
	if err != nil {
		return nil, err
	}
	cols, err := outbox.Columns(events)
	if err != nil {
		return nil, err
	}
	// The rows go in in (client, request_id) order, so that two batches
	// that hold the same requests (a client's retries spread over the
	// flushers) take their keys in one order: one waits for the other's
	// commit instead of both waiting on each other (a deadlock that
	// PostgreSQL breaks only after deadlock_timeout, failing a batch).
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	slices.SortStableFunc(perm, func(a, b int) int {
		if c := bytes.Compare(clients[a][:], clients[b][:]); c != 0 {
			return c
		}
		return strings.Compare(rids[a], rids[b])
	})
	args := []any{permuted(perm, ids), permuted(perm, nos), permuted(perm, clients), permuted(perm, rids), permuted(perm, fps),
		permuted(perm, users), permuted(perm, items), permuted(perm, amounts), permuted(perm, curs), permuted(perm, cbs), occurred}
	args = append(args, cols...)
	inserted := make([]bool, n)
	rows, err := pool.Query(ctx, insertBatchSQL, args...)
	if err != nil {
		return nil, fmt.Errorf("insert orders: %w", err)
	}
	for rows.Next() {
		var id uuid.UUID
		var created, updated time.Time
		var outboxID int64
		if err := rows.Scan(&id, &created, &updated, &outboxID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("insert orders: %w", err)
		}
		i := byID[id]
		inserted[i] = true
		r := reqs[i]
		res[i].Order = order.Order{ID: id, No: nos[i], RequestID: rids[i], Status: order.StatusProcessing, UserID: users[i], Items: r.Req.Items,
			Amount: r.Req.Amount, Currency: curs[i], ClientID: r.ClientID, CallbackURL: cbs[i], Fingerprint: fps[i], CreatedAt: created, UpdatedAt: updated}
		res[i].OutboxID = outboxID
		res[i].Event = events[i]
		res[i].Event.ID = outboxID
	}
	// Close reads up to the end of the statement, its commit included:
	// no request is answered before its row committed.
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("insert orders: %w", err)
	}
	// The others lost to a stored (client, request_id), or collided on
	// their order number: read the stored orders in one query.
	var missClients []uuid.UUID
	var missRIDs []string
	for i := range reqs {
		if !inserted[i] {
			missClients, missRIDs = append(missClients, reqs[i].ClientID), append(missRIDs, rids[i])
		}
	}
	if len(missRIDs) == 0 {
		return res, nil
	}
	stored, err := GetByRequestIDs(ctx, pool, missClients, missRIDs)
	if err != nil {
		// The batch committed: its new orders are answered, and only the
		// requests that needed the read get its error (their retries are
		// read again).
		err = fmt.Errorf("read the stored orders of repeated requests: %w", err)
		for i := range reqs {
			if !inserted[i] {
				res[i].Err = err
			}
		}
		return res, nil
	}
	for i := range reqs {
		if inserted[i] {
			continue
		}
		o, ok := stored[Key{reqs[i].ClientID, rids[i]}]
		if !ok {
			res[i].Retry = true // its order number collided
			res[i].OrderNoCollisions = 1
			continue
		}
		r, err := Replay(o, fps[i])
		_, sameBatch := byID[o.ID] // a concurrent request of this batch won
		r.RequestIDConflict = sameBatch
		res[i].Inserted, res[i].Err = r, err
	}
	return res, nil
}
