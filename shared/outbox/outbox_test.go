package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// enqueue writes a new accepted event in a committed transaction of its
// own, and returns it and its outbox row id.
func enqueue(t *testing.T, pool *pgxpool.Pool) (orderevent.Event, int64) {
	t.Helper()
	e := testenv.Event(orderevent.Accepted)
	var id int64
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(t.Context(), tx, e)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return e, id
}

type outboxRow struct {
	published bool
	streamSeq *int64
	claimed   bool
}

func rowOf(t *testing.T, pool *pgxpool.Pool, id int64) outboxRow {
	t.Helper()
	var r outboxRow
	err := pool.QueryRow(t.Context(),
		`SELECT published_at IS NOT NULL, stream_seq, claimed_until IS NOT NULL FROM outbox WHERE id = $1`, id).
		Scan(&r.published, &r.streamSeq, &r.claimed)
	if err != nil {
		t.Fatalf("read outbox row %d: %v", id, err)
	}
	return r
}

// wantPending fails the test unless the outbox holds want pending rows.
func wantPending(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	n, err := outbox.Pending(t.Context(), pool)
	if err != nil {
		t.Fatalf("pending: %v", err)
	}
	if n != want {
		t.Fatalf("pending = %d, want %d", n, want)
	}
}

// msgIDs counts the stream's messages per Nats-Msg-Id.
func msgIDs(t *testing.T, js jetstream.JetStream, stream string) map[string]int {
	t.Helper()
	s, info := testenv.StreamInfo(t, js, stream)
	ids := map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		ids[m.Header.Get(orderevent.HeaderMsgID)]++
	}
	return ids
}

func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	_, info := testenv.StreamInfo(t, js, stream)
	return info.State.Msgs
}

// newRelay is a database and a stream of the test's own, and a relay on
// them.
func newRelay(t *testing.T) (*testenv.Database, *testenv.NATSEnv, *outbox.Relay) {
	db, env := testenv.DB(t), testenv.NATS(t)
	return db, env, &outbox.Relay{Pool: db.Pool, JS: env.JS, Topology: env.Topology, Logger: testenv.Logger(t)}
}

func TestEnqueueWritesInTheCallersTransaction(t *testing.T) {
	db := testenv.DB(t)
	ctx := t.Context()

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, testenv.Event(orderevent.Accepted)); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantPending(t, db.Pool, 0)

	e, id := enqueue(t, db.Pool)
	var msgID, name, hdrOrder string
	var orderID uuid.UUID
	var published bool
	err = db.Pool.QueryRow(ctx,
		`SELECT msg_id, event, order_id, headers->>$2, published_at IS NOT NULL FROM outbox WHERE id = $1`,
		id, orderevent.HeaderOrderID).Scan(&msgID, &name, &orderID, &hdrOrder, &published)
	if err != nil {
		t.Fatal(err)
	}
	if msgID != e.MsgID() || name != string(e.Name) || orderID != e.OrderID || hdrOrder != e.OrderID.String() || published {
		t.Fatalf("row = (%s, %s, %s, %s, published %v), want (%s, %s, %s, %s, pending)",
			msgID, name, orderID, hdrOrder, published, e.MsgID(), e.Name, e.OrderID, e.OrderID)
	}
	wantPending(t, db.Pool, 1)
}

func TestEnqueueRefusesAMalformedEvent(t *testing.T) {
	db := testenv.DB(t)
	e := testenv.Event(orderevent.Accepted)
	e.ClientID = uuid.Nil
	err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(t.Context(), tx, e)
		return err
	})
	if !errors.Is(err, orderevent.ErrMalformed) {
		t.Fatalf("enqueue of an event without client id: %v, want ErrMalformed", err)
	}
	wantPending(t, db.Pool, 0)
}

func TestPublishStampsTheRowWithTheStreamSequence(t *testing.T) {
	db, env, r := newRelay(t)
	e, id := enqueue(t, db.Pool)

	if err := r.Publish(t.Context(), id); err != nil {
		t.Fatalf("publish: %v", err)
	}
	got := rowOf(t, db.Pool, id)
	if !got.published || got.streamSeq == nil || got.claimed {
		t.Fatalf("row after publish: %+v, want published, with a stream sequence, unclaimed", got)
	}
	s, err := env.JS.Stream(t.Context(), env.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(t.Context(), uint64(*got.streamSeq))
	if err != nil {
		t.Fatalf("the stream has no message at the recorded sequence %d: %v", *got.streamSeq, err)
	}
	if m.Subject != env.Topology.Subject(e.Name) {
		t.Errorf("subject = %q, want %q", m.Subject, env.Topology.Subject(e.Name))
	}
	for k, v := range e.Headers() {
		if m.Header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, m.Header.Get(k), v)
		}
	}
	if m.Header.Get("Nats-Msg-Id") != e.MsgID() {
		t.Errorf("Nats-Msg-Id = %q, want %q", m.Header.Get("Nats-Msg-Id"), e.MsgID())
	}
	back, err := orderevent.Decode(m.Data)
	if err != nil || back != e {
		t.Errorf("payload = %+v (%v), want %+v", back, err, e)
	}

	// A published row is not published again.
	if err := r.Publish(t.Context(), id); err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 0 {
		t.Fatalf("relay pass after publish: %d, %v; want 0, nil", n, err)
	}
	if n := streamMsgs(t, env.JS, env.Topology.Stream); n != 1 {
		t.Fatalf("stream holds %d messages, want 1", n)
	}
	wantPending(t, db.Pool, 0)
}

// PublishIDs publishes without claiming or stamping: the row stays pending
// and unclaimed until the caller stamps what was acknowledged. A step that
// dies between the two (its messages already settled) leaves the row to the
// relay, whose publish has the same Nats-Msg-Id and is dropped by the broker.
func TestPublishIDsThenStamp(t *testing.T) {
	db, env, r := newRelay(t)
	e, id := enqueue(t, db.Pool)
	_, claimed := enqueue(t, db.Pool)
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET claimed_until = now() + interval '1 hour' WHERE id = $1`, claimed); err != nil {
		t.Fatal(err)
	}

	a, err := r.PublishIDs(t.Context(), id, claimed)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if got := rowOf(t, db.Pool, id); got.published || got.claimed {
		t.Fatalf("row after PublishIDs, before Stamp: %+v, want pending and unclaimed", got)
	}
	if ids := msgIDs(t, env.JS, env.Topology.Stream); len(ids) != 1 || ids[e.MsgID()] != 1 {
		t.Fatalf("stream messages per msg id: %v, want one of %s (the row another relay holds is left to it)", ids, e.MsgID())
	}

	// The process died before the stamp: a relay pass publishes the row
	// again; the broker keeps one copy, and the row is stamped with its
	// sequence.
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 1 {
		t.Fatalf("relay pass after an unstamped publish: %d, %v; want 1, nil", n, err)
	}
	if ids := msgIDs(t, env.JS, env.Topology.Stream); len(ids) != 1 || ids[e.MsgID()] != 1 {
		t.Fatalf("stream messages per msg id after the relay: %v, want one of %s", ids, e.MsgID())
	}
	first := rowOf(t, db.Pool, id)
	if !first.published || first.streamSeq == nil {
		t.Fatalf("row after the relay: %+v, want published with a sequence", first)
	}

	// Stamping late what was acknowledged records the same sequence.
	if err := r.Stamp(t.Context(), a); err != nil {
		t.Fatalf("stamp: %v", err)
	}
	if got := rowOf(t, db.Pool, id); !got.published || got.streamSeq == nil || *got.streamSeq != *first.streamSeq {
		t.Fatalf("row after the late stamp: %+v, want published at sequence %d", got, *first.streamSeq)
	}
	if got := rowOf(t, db.Pool, claimed); got.published {
		t.Fatal("a row another relay holds was published")
	}
}

func TestPublishPendingRespectsMinAgeAndBatch(t *testing.T) {
	db, env, r := newRelay(t)
	r.Batch = 2
	var ids []int64
	for range 3 {
		_, id := enqueue(t, db.Pool)
		ids = append(ids, id)
	}
	if n, err := r.PublishPending(t.Context(), time.Hour); err != nil || n != 0 {
		t.Fatalf("pass with minAge 1h: %d, %v; want 0, nil", n, err)
	}
	wantPending(t, db.Pool, 3)
	// Rows are young: make the first two an hour old.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET created_at = now() - interval '1 hour' WHERE id = ANY($1)`, ids[:2]); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(t.Context(), time.Minute); err != nil || n != 2 {
		t.Fatalf("pass with minAge 1m: %d, %v; want 2, nil", n, err)
	}
	if got := rowOf(t, db.Pool, ids[2]); got.published {
		t.Fatal("the young row was published by a pass with minAge 1m")
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 1 {
		t.Fatalf("pass with minAge 0: %d, %v; want 1, nil", n, err)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 0 {
		t.Fatalf("pass over published rows: %d, %v; want 0, nil", n, err)
	}
	if n := streamMsgs(t, env.JS, env.Topology.Stream); n != 3 {
		t.Fatalf("stream holds %d messages, want 3", n)
	}
}

// TestAPassReadsOnlyRowsOldEnough: a relay's pass (every second, in every
// process) claims pending rows older than its minimum age, which the
// inline publish left behind. Under load the pending index also holds
// every row of the last seconds, which the inline publish is about to
// stamp: the pass walked them all in id order looking for old ones.
func TestAPassReadsOnlyRowsOldEnough(t *testing.T) {
	db, env := testenv.DB(t), testenv.NATS(t)
	one := testenv.OneConnection(t, db)
	r := &outbox.Relay{Pool: one, JS: env.JS, Topology: env.Topology, Logger: testenv.Logger(t)}
	_, old := enqueue(t, db.Pool)
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET created_at = now() - interval '1 hour' WHERE id = $1`, old); err != nil {
		t.Fatal(err)
	}
	const young = 20000
	if _, err := db.Pool.Exec(t.Context(), `
		INSERT INTO outbox (msg_id, event, payload)
		SELECT 'young-' || g, 'order.accepted', '\x7b7d' FROM generate_series(1, $1) g`, young); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(t.Context(), time.Minute); err != nil || n != 1 {
		t.Fatalf("pass with minAge 1m: %d, %v; want the old row only", n, err)
	}
	if r := testenv.TableReads(t, db, one, "outbox", 1); r.FullScan+r.ByIndex >= young {
		t.Errorf("a pass read %d outbox rows (%d in full scans) to claim 1 of %d; want the young rows left unread", r.FullScan+r.ByIndex, r.FullScan, young+1)
	}
}

func TestPublishPendingBatchLimit(t *testing.T) {
	db, _, r := newRelay(t)
	r.Batch = 2
	for range 5 {
		enqueue(t, db.Pool)
	}
	for i, want := range []int{2, 2, 1, 0} {
		if n, err := r.PublishPending(t.Context(), 0); err != nil || n != want {
			t.Fatalf("pass %d: %d, %v; want %d, nil", i, n, err, want)
		}
	}
}

func TestAClaimedRowIsLeftToItsRelay(t *testing.T) {
	db, _, r := newRelay(t)
	_, id := enqueue(t, db.Pool)
	// Another relay holds the row's lease.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET claimed_until = now() + interval '1 hour' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 0 {
		t.Fatalf("pass over a claimed row: %d, %v; want 0, nil", n, err)
	}
	if err := r.Publish(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if rowOf(t, db.Pool, id).published {
		t.Fatal("a row claimed by another relay was published")
	}
	// That relay died: its lease expires and the row is published.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET claimed_until = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 1 {
		t.Fatalf("pass after the lease expired: %d, %v; want 1, nil", n, err)
	}
}

// A relay that died after the publish and before the stamp leaves the row
// pending; the next publish has the same Nats-Msg-Id, inside the duplicate
// window, and the broker drops it.
func TestARepublishInsideTheDuplicateWindowIsDropped(t *testing.T) {
	db, env, r := newRelay(t)
	e, id := enqueue(t, db.Pool)
	if err := r.Publish(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	first := rowOf(t, db.Pool, id)
	if _, err := db.Pool.Exec(t.Context(), `UPDATE outbox SET published_at = NULL, stream_seq = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 1 {
		t.Fatalf("republish: %d, %v; want 1, nil", n, err)
	}
	again := rowOf(t, db.Pool, id)
	if !again.published || again.streamSeq == nil || *again.streamSeq != *first.streamSeq {
		t.Fatalf("row after the republish: %+v, want published at the first sequence %d", again, *first.streamSeq)
	}
	if ids := msgIDs(t, env.JS, env.Topology.Stream); len(ids) != 1 || ids[e.MsgID()] != 1 {
		t.Fatalf("stream messages per msg id: %v, want one of %s", ids, e.MsgID())
	}
}

func TestRowsStayPendingWhileTheBrokerIsDown(t *testing.T) {
	db, srv := testenv.DB(t), testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, srv.URL())
	top := orderevent.Topology{Stream: "OUTAGE", Prefix: "outage"}
	if _, err := natsjs.EnsureStream(t.Context(), js, top, 1); err != nil {
		t.Fatal(err)
	}
	r := &outbox.Relay{Pool: db.Pool, JS: js, Topology: top, Logger: testenv.Logger(t), PublishTimeout: 300 * time.Millisecond}
	e, id := enqueue(t, db.Pool)

	srv.Stop()
	testenv.WaitFor(t, 10*time.Second, "the client to notice the outage", func() bool { return !nc.IsConnected() })
	if err := r.Publish(t.Context(), id); !errors.Is(err, outbox.ErrBrokerUnavailable) {
		t.Fatalf("inline publish while the broker is down: %v, want ErrBrokerUnavailable", err)
	}
	// A pass returns at once, claims nothing and buffers nothing for the
	// reconnection; before, it claimed its batch and put it into the
	// client's reconnect buffer, pass after pass (up to the client's 4000
	// pending publishes), to be sent again on the return.
	n, err := r.PublishPending(t.Context(), 0)
	if !errors.Is(err, outbox.ErrBrokerUnavailable) || n != 0 {
		t.Fatalf("relay pass while the broker is down: %d, %v; want 0 and ErrBrokerUnavailable", n, err)
	}
	if p := js.PublishAsyncPending(); p != 0 {
		t.Fatalf("%d publishes buffered for the reconnection, want none", p)
	}
	if got := rowOf(t, db.Pool, id); got.published || got.claimed {
		t.Fatalf("row after a failed pass: %+v, want pending and unclaimed", got)
	}
	wantPending(t, db.Pool, 1)

	srv.Start()
	testenv.WaitFor(t, 15*time.Second, "the client to reconnect", nc.IsConnected)
	testenv.WaitFor(t, 15*time.Second, "the relay to publish the row", func() bool {
		n, err := r.PublishPending(t.Context(), 0)
		if err != nil {
			t.Logf("relay pass: %v", err)
		}
		return n == 1
	})
	if got := rowOf(t, db.Pool, id); !got.published || got.streamSeq == nil {
		t.Fatalf("row after the broker came back: %+v, want published with a sequence", got)
	}
	if ids := msgIDs(t, js, top.Stream); len(ids) != 1 || ids[e.MsgID()] != 1 {
		t.Fatalf("stream messages per msg id: %v, want one of %s", ids, e.MsgID())
	}
}

func TestAMissingStreamIsProvisionedAgain(t *testing.T) {
	db, env := testenv.DB(t), testenv.NATS(t)
	ensured := 0
	r := &outbox.Relay{Pool: db.Pool, JS: env.JS, Topology: env.Topology, Logger: testenv.Logger(t), PublishTimeout: 2 * time.Second,
		Ensure: func(ctx context.Context) error {
			ensured++
			_, err := natsjs.EnsureStream(ctx, env.JS, env.Topology, 1)
			return err
		}}
	if err := env.JS.DeleteStream(t.Context(), env.Topology.Stream); err != nil {
		t.Fatal(err)
	}
	_, id := enqueue(t, db.Pool)
	if n, err := r.PublishPending(t.Context(), 0); err == nil || n != 0 {
		t.Fatalf("pass with the stream missing: %d, %v; want 0 and an error", n, err)
	}
	if ensured != 1 {
		t.Fatalf("Ensure called %d times, want 1", ensured)
	}
	if got := rowOf(t, db.Pool, id); got.published || got.claimed {
		t.Fatalf("row after the failed pass: %+v, want pending and unclaimed", got)
	}
	if n, err := r.PublishPending(t.Context(), 0); err != nil || n != 1 {
		t.Fatalf("pass after the stream was provisioned: %d, %v; want 1, nil", n, err)
	}
}

// Two relays racing over the same rows publish each row once: the claim
// (UPDATE ... FOR UPDATE SKIP LOCKED with a lease) gives every row to one.
func TestRacingRelaysPublishEachRowOnce(t *testing.T) {
	db, env := testenv.DB(t), testenv.NATS(t)
	const rows = 300
	want := map[string]bool{}
	for range rows {
		e, _ := enqueue(t, db.Pool)
		want[e.MsgID()] = true
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		errs  []error
	)
	for i := range 2 {
		_, js := testenv.Connect(t, env.URL)
		r := &outbox.Relay{Pool: db.Pool, JS: js, Topology: env.Topology, Logger: testenv.Logger(t), Batch: 25}
		wg.Go(func() {
			for {
				n, err := r.PublishPending(t.Context(), 0)
				mu.Lock()
				total += n
				if err != nil {
					errs = append(errs, fmt.Errorf("relay %d: %w", i, err))
				}
				mu.Unlock()
				if err != nil || n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	wantPending(t, db.Pool, 0)
	// Each row was stamped by one relay: a row both had claimed would
	// count twice (the broker acknowledges a duplicate too).
	if total != rows {
		t.Fatalf("the relays published %d rows together, want %d", total, rows)
	}
	ids := msgIDs(t, env.JS, env.Topology.Stream)
	if len(ids) != rows {
		t.Fatalf("stream holds %d msg ids, want %d", len(ids), rows)
	}
	for id, n := range ids {
		if !want[id] || n != 1 {
			t.Fatalf("msg id %s: %d message(s) (enqueued: %v), want 1", id, n, want[id])
		}
	}
}

// TestStampsFindTheirRowsThroughTheKeyAsTheOutboxGrows: a stamp finds its
// rows through the primary key however much the outbox grew since the
// stamp first ran. pgx prepares statements, and PostgreSQL may cache one
// plan for a prepared statement after five runs; the stamp's join of
// unnest with the outbox, cached while the outbox was nearly empty, was a
// hash join over a full scan, which every later stamp repeated as the
// outbox grew (millions of rows read in a benchmark's first seconds).
func TestStampsFindTheirRowsThroughTheKeyAsTheOutboxGrows(t *testing.T) {
	db, env := testenv.DB(t), testenv.NATS(t)
	one := testenv.OneConnection(t, db)
	r := &outbox.Relay{Pool: one, JS: env.JS, Topology: env.Topology, Logger: testenv.Logger(t)}
	const before, after = 10, 5
	ids := make([]int64, before+after)
	for i := range ids {
		_, ids[i] = enqueue(t, db.Pool)
	}
	publish := func(id int64) {
		t.Helper()
		a, err := r.PublishIDs(t.Context(), id)
		if err != nil {
			t.Fatalf("publish row %d: %v", id, err)
		}
		if err := r.Stamp(t.Context(), a); err != nil {
			t.Fatalf("stamp row %d: %v", id, err)
		}
		if got := rowOf(t, db.Pool, id); !got.published || got.streamSeq == nil {
			t.Fatalf("row %d after its stamp: %+v, want published with a sequence", id, got)
		}
	}
	for _, id := range ids[:before] {
		publish(id) // past the runs after which a plan may be cached
	}
	const grown = 20000
	if _, err := db.Pool.Exec(t.Context(), `
		INSERT INTO outbox (msg_id, event, payload, published_at)
		SELECT 'grown-' || g, 'order.accepted', '\x7b7d', now() FROM generate_series(1, $1) g`, grown); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[before:] {
		publish(id)
	}
	if n := testenv.TableReads(t, db, one, "outbox", before+after).FullScan; n >= grown {
		t.Errorf("publishing and stamping %d rows read %d outbox rows in full scans, of %d; want each found through its key", before+after, n, grown+len(ids))
	}
}

// enqueueMany writes n new accepted events in one committed transaction
// and returns their message ids.
func enqueueMany(t *testing.T, pool *pgxpool.Pool, n int) map[string]bool {
	t.Helper()
	entries := make([]outbox.Entry, n)
	for i := range entries {
		entries[i] = outbox.Entry{Event: testenv.Event(orderevent.Accepted)}
	}
	var rows []outbox.Row
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		var err error
		rows, err = outbox.EnqueueMany(t.Context(), tx, entries)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue %d events: %v", n, err)
	}
	ids := make(map[string]bool, n)
	for _, x := range rows {
		ids[x.MsgID] = true
	}
	return ids
}

// TestARowTheClientRefusesDoesNotHoldBackTheRest: a row whose publish the
// client refuses (a subject it cannot carry, a payload over the server's
// limit) fails alone and stays pending, given back; the rows behind it are
// published in the same pass. Only an error that says the broker is
// unreachable ends a pass early, and no row causes one on its own.
func TestARowTheClientRefusesDoesNotHoldBackTheRest(t *testing.T) {
	db, env, r := newRelay(t)
	var refused []int64
	for _, q := range []string{
		`INSERT INTO outbox (msg_id, event, payload) VALUES ('bad-subject', 'order accepted', '\x7b7d') RETURNING id`,
		`INSERT INTO outbox (msg_id, event, payload) VALUES ('too-large', 'order.accepted', convert_to(repeat('x', 2 << 20), 'UTF8')) RETURNING id`,
	} {
		var id int64
		if err := db.Pool.QueryRow(t.Context(), q).Scan(&id); err != nil {
			t.Fatal(err)
		}
		refused = append(refused, id)
	}
	want := enqueueMany(t, db.Pool, 3)

	n, err := r.PublishPending(t.Context(), 0)
	if n != len(want) || !errors.Is(err, nats.ErrBadSubject) || !errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, outbox.ErrBrokerUnavailable) {
		t.Fatalf("pass over 2 refused rows and %d good ones: %d, %v; want %d and the two refusals alone", len(want), n, err, len(want))
	}
	for _, id := range refused {
		if got := rowOf(t, db.Pool, id); got.published || got.claimed {
			t.Errorf("refused row %d after the pass: %+v, want pending and unclaimed", id, got)
		}
	}
	ids := msgIDs(t, env.JS, env.Topology.Stream)
	if len(ids) != len(want) {
		t.Errorf("stream holds msg ids %v, want the %d good rows'", ids, len(want))
	}
	for id := range want {
		if ids[id] != 1 {
			t.Errorf("msg id %s: %d message(s), want 1", id, ids[id])
		}
	}
}

// TestARelayStallingOnTheBrokerStopsAtItsCancel: against a broker that
// is connected and does not answer (a partition the client has not seen
// yet), every pass sends its batch and waits for acks that do not come,
// so after 8 passes of 500 rows the client held 4000 pending acks, its
// limit, until the acks' timeout. From then on every asynchronous publish
// waited 200 ms before it failed, and the pass's loop checked neither its
// context nor its PublishTimeout: one pass took 500 × 200 ms, and a
// SIGTERM found the relay deaf for up to 100 s. (A relay reached the same
// stall through the reconnect buffer while NATS was down, before its pass
// checked the connection.) A relay stops at its cancel, a pass within its
// PublishTimeout, and the outage costs time, never events. The broker is
// made silent by deleting the stream and swallowing its subjects.
func TestARelayStallingOnTheBrokerStopsAtItsCancel(t *testing.T) {
	db, srv := testenv.DB(t), testenv.OwnNATS(t)
	nc, js := testenv.Connect(t, srv.URL())
	top := orderevent.Topology{Stream: "STALL", Prefix: "stall"}
	if _, err := natsjs.EnsureStream(t.Context(), js, top, 1); err != nil {
		t.Fatal(err)
	}
	const rows, limit = 600, 4000 // limit: nats.go's default of pending async publishes
	want := enqueueMany(t, db.Pool, rows)
	const lease = time.Minute
	r := &outbox.Relay{Pool: db.Pool, JS: js, Topology: top, Logger: testenv.Logger(t),
		MinAge: -1, Interval: 50 * time.Millisecond, PublishTimeout: 100 * time.Millisecond, Lease: lease}

	if err := js.DeleteStream(t.Context(), top.Stream); err != nil {
		t.Fatal(err)
	}
	swallow, err := nc.SubscribeSync(top.AllSubjects())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = swallow.Unsubscribe() })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	t.Cleanup(func() { // the relay is stopped whatever the test's outcome
		cancel()
		if !stopped {
			if err := <-done; err != nil {
				t.Errorf("relay run: %v", err)
			}
		}
	})

	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d pending async publishes", limit), func() bool { return js.PublishAsyncPending() >= limit })
	// The pass that reached the limit claimed its rows before; wait for a
	// pass that claimed them after, whose publishes meet the limit.
	var reached time.Time
	if err := db.Pool.QueryRow(t.Context(), `SELECT now()`).Scan(&reached); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a relay pass after the limit was reached", func() bool {
		var n int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE claimed_until - make_interval(secs => $2) > $1`, reached, lease.Seconds()).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	cancel()
	cancelled := time.Now()
	if err := testenv.Receive(t, done, 2*time.Second, "the relay to return after its cancel"); err != nil {
		t.Fatalf("relay run: %v", err)
	}
	stopped = true
	t.Logf("the relay returned %s after its cancel", time.Since(cancelled))

	// A pass against the limit ends within its PublishTimeout (and the
	// moments of one stalled publish), leaving every row pending.
	start := time.Now()
	n, err := r.PublishPending(t.Context(), 0)
	if took := time.Since(start); took > time.Second {
		t.Errorf("a relay pass at the limit took %s, want about its PublishTimeout %s", took, r.PublishTimeout)
	} else {
		t.Logf("a relay pass at the limit took %s: %v", took, err)
	}
	if n != 0 || !errors.Is(err, outbox.ErrBrokerUnavailable) {
		t.Errorf("relay pass at the limit: %d, %v; want 0 and ErrBrokerUnavailable", n, err)
	}
	if claimed := testenv.Column[int64](t, db.Pool, `SELECT id FROM outbox WHERE claimed_until IS NOT NULL`); len(claimed) > 0 {
		t.Errorf("%d row(s) still claimed after the relay stopped, want all given back", len(claimed))
	}
	wantPending(t, db.Pool, rows)

	// The broker answers again: the stream is back, nothing swallows.
	if err := swallow.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(t.Context(), js, top, 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the relay to publish every row", func() bool {
		if _, err := r.PublishPending(t.Context(), 0); err != nil {
			t.Logf("relay pass: %v", err)
		}
		n, err := outbox.Pending(t.Context(), db.Pool)
		return err == nil && n == 0
	})
	if unsequenced := testenv.Column[int64](t, db.Pool, `SELECT id FROM outbox WHERE stream_seq IS NULL`); len(unsequenced) > 0 {
		t.Errorf("%d row(s) stamped without a stream sequence", len(unsequenced))
	}
	ids := msgIDs(t, js, top.Stream)
	if len(ids) != rows {
		t.Errorf("stream holds %d msg ids, want %d", len(ids), rows)
	}
	for id, n := range ids {
		if !want[id] || n != 1 {
			t.Errorf("msg id %s: %d message(s) (enqueued: %v), want 1", id, n, want[id])
		}
	}
}
