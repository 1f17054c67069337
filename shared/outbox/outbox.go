// Package outbox is orderpipe's transactional outbox. A status change and
// the event that announces it are written in one PostgreSQL transaction
// (Enqueue); the relay then publishes pending events to JetStream with their
// deterministic Nats-Msg-Id and stamps them published, with the stream
// sequence of the broker's ack. The relay claims rows with a short lease in
// one statement and publishes them asynchronously with no transaction open,
// so a slow or absent broker never holds a database connection, and one row
// the broker refuses does not hold back the rows behind it. A process that
// dies between the commit and the publish leaves the row pending, and the
// next relay pass (in any replica) publishes it, so no committed change is
// ever left unannounced. A row published twice (relay died after the
// publish, before the stamp) is dropped by the broker's duplicate window or
// by the consumer's dedupe row. A publish that finds the stream missing
// provisions it again (Relay.Ensure).
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/failpoint"
	"orderpipe/shared/metrics"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tracing"
)

// Failpoint names in this package.
const (
	// FailAfterPublish fires after an event was published and before its
	// row was stamped.
	FailAfterPublish = "outbox.after-publish"
)

// Enqueue writes e to the outbox in the caller's transaction (tx is a
// pgx.Tx; a pool would commit the event apart from the change it
// announces, which defeats the point) and returns its row id. The event's
// headers carry ctx's trace.
func Enqueue(ctx context.Context, tx postgres.DB, e orderevent.Event) (int64, error) {
	rows, err := EnqueueMany(ctx, tx, []Entry{{Ctx: ctx, Event: e}})
	if err != nil {
		return 0, err
	}
	return rows[0].ID, nil
}

// Entry is one event for EnqueueMany, with the context whose trace its
// headers carry (nil: EnqueueMany's ctx).
type Entry struct {
	Ctx   context.Context
	Event orderevent.Event
}

// EnqueueMany writes events to the outbox in the caller's transaction in
// one statement (a group commit's events) and returns their rows as
// written, ids included, in the order given: the caller publishes them
// from memory after its commit (PublishRows). No two of them may have the
// same order and message id.
func EnqueueMany(ctx context.Context, tx postgres.DB, ps []Entry) ([]Row, error) {
	rows, err := Rows(ctx, ps)
	if err != nil {
		return nil, err
	}
	args, err := Columns(rows)
	if err != nil {
		return nil, err
	}
	q, err := tx.Query(ctx, `
		INSERT INTO outbox (`+ColumnList+`)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::uuid[])
		RETURNING id, order_id, msg_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("enqueue %d event(s): %w", len(rows), err)
	}
	at := make(map[string]int, len(rows))
	for i, x := range rows {
		at[x.OrderID.String()+" "+x.MsgID] = i
	}
	for q.Next() {
		var id int64
		var oid uuid.UUID
		var msgID string
		if err := q.Scan(&id, &oid, &msgID); err != nil {
			q.Close()
			return nil, fmt.Errorf("enqueue %d event(s): %w", len(rows), err)
		}
		rows[at[oid.String()+" "+msgID]].ID = id
	}
	q.Close()
	if err := q.Err(); err != nil {
		return nil, fmt.Errorf("enqueue %d event(s): %w", len(rows), err)
	}
	return rows, nil
}

// Row is one outbox row as it is written and published: the event's
// message id, name, encoded payload and headers (with the trace of the
// change). ID is the row's id once written.
type Row struct {
	ID      int64
	OrderID uuid.UUID
	MsgID   string
	Event   string
	Payload []byte
	Headers map[string]string
}

// Rows encodes entries as the outbox rows that announce them (ID still 0).
// No two of them may have the same order and message id.
func Rows(ctx context.Context, ps []Entry) ([]Row, error) {
	rows := make([]Row, len(ps))
	seen := make(map[string]bool, len(ps))
	for i, p := range ps {
		e := p.Event
		payload, err := orderevent.Encode(e)
		if err != nil {
			return nil, fmt.Errorf("encode %s event of order %s: %w", e.Name, e.OrderID, err)
		}
		tctx := p.Ctx
		if tctx == nil {
			tctx = ctx
		}
		h := e.Headers()
		tracing.Inject(tctx, h) // the change's trace continues in every handler
		rows[i] = Row{OrderID: e.OrderID, MsgID: e.MsgID(), Event: string(e.Name), Payload: payload, Headers: h}
		// The message id names the order and the event (orderevent.MsgID).
		if seen[rows[i].MsgID] {
			return nil, fmt.Errorf("enqueue %s event of order %s twice in one statement", e.Name, e.OrderID)
		}
		seen[rows[i].MsgID] = true
	}
	return rows, nil
}

// ColumnList names the outbox columns that Columns gives values for, in
// their order: a statement that writes rows itself (the intake's one
// statement for orders, history and events) inserts them with
// "INSERT INTO outbox (ColumnList) SELECT … unnest($a::text[],
// $b::text[], $c::bytea[], $d::jsonb[], $e::uuid[])".
const ColumnList = "msg_id, event, payload, headers, order_id"

// Columns returns rows as one array per column of ColumnList, as
// statement arguments.
func Columns(rows []Row) ([]any, error) {
	n := len(rows)
	msgIDs, events, payloads, headers, orders := make([]string, n), make([]string, n), make([][]byte, n), make([][]byte, n), make([][16]byte, n)
	for i, x := range rows {
		hb, err := headersJSON(x.Headers)
		if err != nil {
			return nil, fmt.Errorf("encode the headers of %s: %w", x.MsgID, err)
		}
		msgIDs[i], events[i], payloads[i], headers[i], orders[i] = x.MsgID, x.Event, x.Payload, hb, x.OrderID
	}
	return []any{msgIDs, events, payloads, headers, orders}, nil
}

// headersJSON encodes headers as a JSON object, as json.Marshal does. Its
// keys and values are ids, names and trace context: printable ASCII with
// nothing to escape, which it writes as they are; anything else goes
// through json.Marshal.
func headersJSON(h map[string]string) ([]byte, error) {
	n := 2
	for k, v := range h {
		if !plainJSON(k) || !plainJSON(v) {
			return json.Marshal(h)
		}
		n += len(k) + len(v) + 6
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for k, v := range h {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":"`...)
		b = append(b, v...)
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

// plainJSON reports whether s needs no escaping inside a JSON string (and
// none that json.Marshal would add for HTML: <, >, &).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// Relay publishes pending outbox rows.
type Relay struct {
	Pool     *pgxpool.Pool
	JS       jetstream.JetStream
	Topology orderevent.Topology
	Logger   *slog.Logger
	// Interval between passes over pending rows; default 1s.
	Interval time.Duration
	// MinAge leaves rows younger than this to the inline publish of the
	// process that wrote them; default 2s.
	MinAge time.Duration
	// Batch is the most rows one pass publishes; default 500.
	Batch int
	// PublishTimeout bounds one batch's publishing, its publishes and the
	// wait for their acks; default 5s.
	PublishTimeout time.Duration
	// Lease is how long a claimed row is left to this relay; default 30s.
	Lease time.Duration
	// Ensure, if set, provisions the stream again when a publish finds it
	// missing (deleted, or a broker that lost its store).
	Ensure func(ctx context.Context) error

	once sync.Once
}

// defaults fills in the zero fields once: a relay is shared by concurrent
// publishers (the intake's flushers), so this must not write on every call.
func (r *Relay) defaults() { r.once.Do(r.fill) }

func (r *Relay) fill() {
	if r.Interval <= 0 {
		r.Interval = time.Second
	}
	if r.MinAge < 0 {
		r.MinAge = 0
	} else if r.MinAge == 0 {
		r.MinAge = 2 * time.Second
	}
	if r.Batch <= 0 {
		r.Batch = 500
	}
	if r.PublishTimeout <= 0 {
		r.PublishTimeout = 5 * time.Second
	}
	if r.Lease <= 0 {
		r.Lease = 30 * time.Second
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
}

// Run publishes pending rows every Interval until ctx ends, and returns
// within moments of its end: a pass stops publishing then and gives its
// rows back.
func (r *Relay) Run(ctx context.Context) error {
	r.defaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if n, err := r.PublishPending(ctx, r.MinAge); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.Logger.Warn("outbox relay pass", slog.Any("error", err), slog.Int("published", n))
		} else if n > 0 {
			r.Logger.Info("outbox relay published pending events", slog.Int("published", n))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// PublishPending publishes up to Batch pending rows older than minAge, in
// id order, and returns how many it published. Rows claimed by another
// relay are skipped. The pending rows are walked in id order up to the
// first one younger than minAge: every pending row below it is older, and
// the ones above it are the last moments' rows, which the inline publish
// is about to stamp (without that bound a pass under load read all of
// them, every second).
func (r *Relay) PublishPending(ctx context.Context, minAge time.Duration) (int, error) {
	r.defaults()
	return r.publishWhere(ctx, "relay", `created_at <= now() - make_interval(secs => $1)
		AND id < coalesce((SELECT y.id FROM outbox y WHERE y.published_at IS NULL AND y.created_at > now() - make_interval(secs => $1) ORDER BY y.id LIMIT 1), 9223372036854775807)
		ORDER BY id LIMIT $2`, minAge.Seconds(), r.Batch)
}

// Publish publishes the given rows now if they are still pending (the
// inline path right after the commit that wrote them) and stamps them:
// PublishIDs, then Stamp. When the connection to NATS is down it returns
// at once: the rows stay for the relay, and the caller (an intake request)
// does not wait on the broker.
func (r *Relay) Publish(ctx context.Context, ids ...int64) error {
	a, err := r.PublishIDs(ctx, ids...)
	if serr := r.Stamp(ctx, a); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// PublishIDs publishes the given rows if they are still pending: it
// reads them, then PublishRows. It returns what the broker acknowledged,
// for Stamp (Publish does both). When the connection to NATS is down it
// returns at once, without reading the rows. A caller that wrote the rows
// itself (the intake, a pipeline step's batch) has them from EnqueueMany
// and calls PublishRows.
func (r *Relay) PublishIDs(ctx context.Context, ids ...int64) (Acked, error) {
	if len(ids) == 0 {
		return Acked{}, nil
	}
	r.defaults()
	if err := r.disconnected(); err != nil {
		return Acked{}, fmt.Errorf("%w; %d event(s) left to the relay", err, len(ids))
	}
	batch, err := r.readPending(ctx, ids...)
	if err != nil {
		return Acked{}, err
	}
	return r.PublishRows(ctx, batch)
}

// readPending reads the given rows that are still pending, in id order,
// for PublishRows. They are read, not claimed (the inline path runs right
// after their commit, long before a relay takes them at MinAge; should one
// do so, the broker's duplicate window drops the second copy), and a row a
// relay holds the lease of is left out: it is the relay's to publish.
func (r *Relay) readPending(ctx context.Context, ids ...int64) ([]Row, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var batch []Row
	err := postgres.QueryGeneric(ctx, r.Pool, func(rows pgx.Rows) (err error) {
		batch, err = pgx.CollectRows(rows, scanRow)
		return err
	}, readPendingSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("read pending outbox rows: %w", err)
	}
	return batch, nil
}

// disconnected is ErrBrokerUnavailable when the connection to NATS is
// down (nothing would reach the broker before a reconnect: a publish would
// only fill the client's reconnect buffer), else nil.
func (r *Relay) disconnected() error {
	if nc := r.JS.Conn(); nc != nil && !nc.IsConnected() {
		return fmt.Errorf("%w: not connected (%s)", ErrBrokerUnavailable, nc.Status())
	}
	return nil
}

// ErrBrokerUnavailable marks a publish that could not reach the broker.
var ErrBrokerUnavailable = errors.New("broker unavailable")

// claimSQL claims pending rows (the caller's condition and order follow
// "AND") for Lease, in one statement: no transaction stays open while they
// are published.
const claimSQL = `
	UPDATE outbox o SET claimed_until = now() + make_interval(secs => %f)
	FROM (SELECT id FROM outbox
	      WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now()) AND %s
	      FOR UPDATE SKIP LOCKED) c
	WHERE o.id = c.id
	RETURNING o.id, o.order_id, o.msg_id, o.event, o.payload, o.headers`

// claimGrace is how long a pass may still take to read its claim once
// its context ended.
const claimGrace = time.Second

func (r *Relay) publishWhere(ctx context.Context, path, where string, args ...any) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// Disconnected, a pass would claim its rows only to put them into the
	// client's reconnect buffer, to be sent again on the return.
	if err := r.disconnected(); err != nil {
		return 0, fmt.Errorf("%w; the pending rows wait for the next pass", err)
	}
	// A claim is read even if ctx ends meanwhile (for claimGrace): the
	// database may have made it when the cancel came, and its rows, claimed
	// but never read, would stay out of every relay's reach until the lease
	// ran out (a process stopping at that moment held up to Batch events
	// for Lease). A pass whose ctx ended gives back the rows it did not
	// publish, as every pass does.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(claimGrace, cancel) })
	defer stop()
	rows, err := r.Pool.Query(cctx, fmt.Sprintf(claimSQL, r.Lease.Seconds(), where), args...)
	if err != nil {
		return 0, fmt.Errorf("claim pending outbox rows: %w", err)
	}
	batch, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return 0, fmt.Errorf("claim pending outbox rows: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}
	sort.Slice(batch, func(i, j int) bool { return batch[i].ID < batch[j].ID })
	done, seqs, failed, pubErr := r.publishBatch(ctx, batch)
	if err := r.Stamp(ctx, Acked{path: path, ids: done, seqs: seqs}); err != nil {
		return 0, err
	}
	if len(failed) > 0 {
		// Give the rows back at once rather than at the lease's end.
		_, _ = r.Pool.Exec(context.WithoutCancel(ctx), `UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1) AND published_at IS NULL`, failed)
	}
	return len(done), pubErr
}

// scanRow reads a row of "id, order_id, msg_id, event, payload, headers"
// (order_id is NULL in rows written before it existed: the zero UUID).
func scanRow(cr pgx.CollectableRow) (Row, error) {
	var x Row
	var orderID *uuid.UUID
	err := cr.Scan(&x.ID, &orderID, &x.MsgID, &x.Event, &x.Payload, &x.Headers)
	if orderID != nil {
		x.OrderID = *orderID
	}
	return x, err
}

// PublishRows publishes rows that the caller has just committed (the
// intake's inline path) from memory: no claim and no read of the rows,
// which no relay takes before they are MinAge old. It waits for the acks
// and returns what the broker acknowledged, for Stamp; the caller may
// answer its clients before stamping. A row that was not acknowledged
// stays pending for the relay. When the connection to NATS is down it
// returns at once, as Publish does. Should a relay publish a row as well
// (the inline path took longer than MinAge), the broker's duplicate
// window drops the second copy.
func (r *Relay) PublishRows(ctx context.Context, rows []Row) (Acked, error) {
	if len(rows) == 0 {
		return Acked{}, nil
	}
	r.defaults()
	if err := r.disconnected(); err != nil {
		return Acked{}, fmt.Errorf("%w; %d event(s) left to the relay", err, len(rows))
	}
	done, seqs, _, err := r.publishBatch(ctx, rows)
	return Acked{path: "inline", ids: done, seqs: seqs}, err
}

// Acked is what a publish got acknowledged by the broker: the rows to
// Stamp, with their stream sequences.
type Acked struct {
	path      string
	ids, seqs []int64
}

// Stamp marks the acknowledged rows published. A row left unstamped (the
// process died first) is published again by a relay, and the broker's
// duplicate window or the consumers' dedupe rows drop the copy.
func (r *Relay) Stamp(ctx context.Context, a Acked) error {
	if len(a.ids) == 0 {
		return nil
	}
	if err := failpoint.Inject(FailAfterPublish); err != nil {
		return err // a simulated crash: the claims expire, another pass publishes again
	}
	if _, err := postgres.ExecGeneric(context.WithoutCancel(ctx), r.Pool, stampSQL, a.ids, a.seqs); err != nil {
		return fmt.Errorf("stamp published outbox rows: %w", err)
	}
	metrics.OutboxPublished.WithLabelValues(a.path).Add(float64(len(a.ids)))
	return nil
}

// stallWait is the longest one asynchronous publish waits for a free slot
// while the client holds as many unacknowledged publishes as it allows
// (nats.go's own default wait); then the publish fails with
// jetstream.ErrTooManyStalledMsgs.
const stallWait = 200 * time.Millisecond

// publishBatch publishes rows asynchronously and waits for their acks, all
// within PublishTimeout, and stops publishing as soon as ctx ends. A row
// the broker or the client refuses does not hold back the rows behind it;
// a publish that finds the broker unreachable (the client's pending
// publishes at their limit, its reconnect buffer full, the connection
// closed) stops the publishing, and the rows not yet sent wait for the
// next pass. When the stream is missing, Ensure provisions it and the rest
// waits for the next pass.
func (r *Relay) publishBatch(ctx context.Context, batch []Row) (done, seqs, failed []int64, err error) {
	type inflight struct {
		x   Row
		ack jetstream.PubAckFuture
	}
	var errs []error
	var fl []inflight
	deadline := time.Now().Add(r.PublishTimeout)
	timer := time.NewTimer(r.PublishTimeout)
	defer timer.Stop()
	sent := 0
	var stop error // why the rows after the sent ones wait for the next pass
	for _, x := range batch {
		wait := min(stallWait, time.Until(deadline))
		if err := ctx.Err(); err != nil {
			stop = err
			break
		}
		if wait <= 0 {
			stop = fmt.Errorf("%w: not sent within %s", ErrBrokerUnavailable, r.PublishTimeout)
			break
		}
		sent++
		msg := r.message(x)
		f, perr := r.JS.PublishMsgAsync(msg, jetstream.WithMsgID(x.MsgID), jetstream.WithStallWait(wait))
		if perr == nil {
			fl = append(fl, inflight{x, f})
			continue
		}
		failed = append(failed, x.ID)
		if unreachable(perr) {
			errs = append(errs, fmt.Errorf("%w: publish %s (%s): %w", ErrBrokerUnavailable, x.MsgID, msg.Subject, perr))
			stop = ErrBrokerUnavailable
			break
		}
		errs = append(errs, fmt.Errorf("publish %s (%s): %w", x.MsgID, msg.Subject, perr))
	}
	if rest := batch[sent:]; len(rest) > 0 {
		for _, x := range rest {
			failed = append(failed, x.ID)
		}
		errs = append(errs, fmt.Errorf("%d row(s) not published, left pending: %w", len(rest), stop))
	}
	missing := false
	for i, f := range fl {
		select {
		case ack := <-f.ack.Ok():
			done, seqs = append(done, f.x.ID), append(seqs, int64(ack.Sequence))
			continue
		case e := <-f.ack.Err():
			errs = append(errs, fmt.Errorf("publish %s: %w", f.x.MsgID, e))
			if errors.Is(e, jetstream.ErrNoStreamResponse) || errors.Is(e, nats.ErrNoResponders) || errors.Is(e, jetstream.ErrStreamNotFound) {
				missing = true
			}
		case <-timer.C:
			for _, rest := range fl[i:] {
				failed = append(failed, rest.x.ID)
			}
			errs = append(errs, fmt.Errorf("%w: %d publish(es) not acknowledged within %s", ErrBrokerUnavailable, len(fl)-i, r.PublishTimeout))
			return done, seqs, failed, errors.Join(errs...)
		case <-ctx.Done():
			for _, rest := range fl[i:] {
				failed = append(failed, rest.x.ID)
			}
			return done, seqs, failed, errors.Join(append(errs, ctx.Err())...)
		}
		failed = append(failed, f.x.ID)
	}
	if missing && r.Ensure != nil {
		if err := r.Ensure(ctx); err != nil {
			errs = append(errs, fmt.Errorf("provision the stream again: %w", err))
		} else {
			r.Logger.Warn("outbox relay: the stream was missing; provisioned it again", slog.String("stream", r.Topology.Stream))
		}
	}
	return done, seqs, failed, errors.Join(errs...)
}

// unreachable reports whether a publish's error says that the broker
// cannot be reached now, for any row: the client holds as many
// unacknowledged publishes as it allows (the broker is down or does not
// answer), its reconnect buffer is full, or the connection is closed or
// draining. Other errors (a subject or a payload the client refuses) are
// the row's own.
func unreachable(err error) bool {
	return errors.Is(err, jetstream.ErrTooManyStalledMsgs) || errors.Is(err, nats.ErrReconnectBufExceeded) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) ||
		errors.Is(err, nats.ErrInvalidConnection) || errors.Is(err, nats.ErrDisconnected)
}

func (r *Relay) message(x Row) *nats.Msg {
	// nats.Header.Set stores a one-value slice per key; the values share
	// one backing array here.
	h := make(nats.Header, len(x.Headers)+1)
	vals := make([]string, 0, len(x.Headers)+1)
	for k, v := range x.Headers {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	vals = append(vals, x.MsgID)
	h[orderevent.HeaderMsgID] = vals[len(vals)-1 : len(vals) : len(vals)]
	return &nats.Msg{Subject: r.Topology.Subject(orderevent.Name(x.Event)), Data: x.Payload, Header: h}
}

// readPendingSQL reads the rows ($1) still pending and not leased by a
// relay. It runs on its generic plan (postgres.QueryGeneric), which the
// pending rows' partial index keeps small whatever the outbox's size.
const readPendingSQL = `
	SELECT id, order_id, msg_id, event, payload, headers FROM outbox
	WHERE id = ANY($1) AND published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
	ORDER BY id`

// stampSQL marks rows ($1) published with the stream sequence ($2) of
// their publish ack, which lets the compensator tell later whether the
// broker still holds the event. It runs on its generic plan
// (postgres.ExecGeneric): planned once per connection, not at every
// stamp. The join on "o.id = ANY(ARRAY[v.id])" keeps that plan on the
// primary key whatever the table's size when it was made (see
// postgres.DB).
const stampSQL = `
	UPDATE outbox o SET published_at = now(), stream_seq = v.seq, claimed_until = NULL
	FROM unnest($1::bigint[], $2::bigint[]) AS v(id, seq) WHERE o.id = ANY(ARRAY[v.id])`

// Pending returns how many rows wait to be published.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n)
	return n, err
}
