package orderstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
)

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
// to a collision and must go into a later batch.
type BatchResult struct {
	Inserted
	Err   error
	Retry bool
}

// InsertBatch stores many new orders in ONE transaction — one multi-row
// INSERT … ON CONFLICT DO NOTHING into orders, one into order_events and
// one into the outbox — so that concurrent requests share a commit (group
// commit). A request whose (client, request_id) exists, committed by an
// earlier request or by another in the same batch, is answered from the
// stored order: replayed when its fingerprint matches, ErrRequestIDReused
// otherwise. It returns one result per request, in order; an error means
// the batch did not commit (and no request of it was stored).
func InsertBatch(ctx context.Context, pool *pgxpool.Pool, reqs []NewOrder, newOrderNo func(time.Time) string) ([]BatchResult, error) {
	if newOrderNo == nil {
		newOrderNo = order.NewOrderNo
	}
	n := len(reqs)
	res := make([]BatchResult, n)
	var (
		ids, clients             = make([]uuid.UUID, n), make([]uuid.UUID, n)
		nos, rids, amounts, curs = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		cbs                      = make([]string, n)
		fps, items               = make([][]byte, n), make([][]byte, n)
		users                    = make([]int64, n)
		byID                     = make(map[uuid.UUID]int, n)
		now                      = time.Now()
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
	}
	inserted := make([]bool, n)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency, callback_url)
			SELECT t.order_id, t.order_no, t.client_id, t.request_id, t.fingerprint, 'processing', t.user_id, t.items, t.amount::numeric, t.currency, NULLIF(t.callback_url, '')
			FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bytea[], $6::bigint[], $7::jsonb[], $8::text[], $9::text[], $10::text[])
			     AS t(order_id, order_no, client_id, request_id, fingerprint, user_id, items, amount, currency, callback_url)
			ON CONFLICT DO NOTHING
			RETURNING order_id, created_at, updated_at`,
			ids, nos, clients, rids, fps, users, items, amounts, curs, cbs)
		if err != nil {
			return fmt.Errorf("insert orders: %w", err)
		}
		var got []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			var created, updated time.Time
			if err := rows.Scan(&id, &created, &updated); err != nil {
				rows.Close()
				return err
			}
			i := byID[id]
			inserted[i] = true
			r := reqs[i]
			res[i].Order = order.Order{ID: id, No: nos[i], RequestID: rids[i], Status: order.StatusProcessing, UserID: users[i], Items: r.Req.Items,
				Amount: r.Req.Amount, Currency: curs[i], ClientID: r.ClientID, CallbackURL: cbs[i], Fingerprint: fps[i], CreatedAt: created, UpdatedAt: updated}
			got = append(got, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("insert orders: %w", err)
		}
		if len(got) == 0 {
			return nil
		}
		changes := make([]Change, len(got))
		for k, id := range got {
			i := byID[id]
			changes[k] = Change{Ctx: reqs[i].Ctx, OrderID: id, ClientID: reqs[i].ClientID, RequestID: rids[i], Status: order.StatusProcessing}
		}
		oids, err := RecordMany(ctx, tx, changes)
		if err != nil {
			return fmt.Errorf("record accepted orders: %w", err)
		}
		for k, id := range got {
			res[byID[id]].OutboxID = oids[k]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The others lost to a stored (client, request_id), or collided on
	// their order number: read the stored orders in one query.
	var missClients []uuid.UUID
	var missRIDs []string
	for i := range reqs {
		if !inserted[i] {
			missClients, missRIDs = append(missClients, clients[i]), append(missRIDs, rids[i])
		}
	}
	if len(missRIDs) == 0 {
		return res, nil
	}
	rows, err := pool.Query(ctx, `SELECT `+orderColumns+` FROM orders WHERE (client_id, request_id) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))`, missClients, missRIDs)
	if err != nil {
		return nil, fmt.Errorf("read the stored orders of repeated requests: %w", err)
	}
	stored := map[[2]string]order.Order{}
	for rows.Next() {
		o, err := scanOrder(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		stored[[2]string{o.ClientID.String(), o.RequestID}] = o
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range reqs {
		if inserted[i] {
			continue
		}
		o, ok := stored[[2]string{clients[i].String(), rids[i]}]
		if !ok {
			res[i].Retry = true // its order number collided
			res[i].OrderNoCollisions = 1
			continue
		}
		r, err := replay(o, fps[i])
		_, sameBatch := byID[o.ID] // a concurrent request of this batch won
		r.RequestIDConflict = sameBatch
		res[i].Inserted, res[i].Err = r, err
	}
	return res, nil
}
