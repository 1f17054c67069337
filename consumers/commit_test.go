package consumers_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/consumers"
	"orderpipe/consumers/step"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

// commitCase is one handler's Commit in a group-commit test.
type commitCase struct {
	msgID string
	fail  error // what its apply returns
	// answers:
	fresh, committed bool
	err              error
}

// groupCommit holds the step's flusher in a first commit until every case
// is queued behind it, so that the cases form one batch, then releases it
// and collects each case's answer. Each apply that does not fail writes its
// message id and its transaction's id into gc_effects.
func groupCommit(t *testing.T, c *consumers.Committer, cases []*commitCase) {
	t.Helper()
	effect := func(msgID string, fail error) step.Apply {
		return func(ctx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
			if fail != nil {
				return nil, fail
			}
			_, err := tx.Exec(ctx, `INSERT INTO gc_effects (msg_id, tx) VALUES ($1, txid_current())`, msgID)
			return nil, err
		}
	}
	release, started := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _, err := c.Commit(t.Context(), "blocker-"+t.Name(), func(ctx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
			close(started)
			<-release
			return effect("blocker-"+t.Name(), nil)(ctx, tx)
		})
		if err != nil {
			t.Errorf("blocker: %v", err)
		}
	})
	<-started
	for _, k := range cases {
		wg.Go(func() { k.fresh, k.committed, k.err = c.Commit(t.Context(), k.msgID, effect(k.msgID, k.fail)) })
	}
	testenv.WaitFor(t, 10*time.Second, "every commit queued behind the blocker", func() bool { return c.Queued() == len(cases) })
	close(release)
	wg.Wait()
}

// effects returns, per message id, the transaction its effect committed in.
func effects(t *testing.T, db *testenv.Database) map[string]int64 {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT msg_id, tx FROM gc_effects`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var tx int64
		if err := rows.Scan(&id, &tx); err != nil {
			t.Fatal(err)
		}
		out[id] = tx
	}
	return out
}

func dedupeRows(t *testing.T, db *testenv.Database, consumer string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, id := range testenv.Column[string](t, db.Pool, `SELECT message_id FROM processed_messages WHERE consumer = $1`, consumer) {
		out[id] = true
	}
	return out
}

func groupCommitEnv(t *testing.T) (*testenv.Database, *consumers.Committer) {
	t.Helper()
	db, n := testenv.DB(t), testenv.NATS(t)
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE gc_effects (msg_id text PRIMARY KEY, tx bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, consumers.NewCommitter(testenv.Env(t, db, n), "gc")
}

// TestGroupCommitSharesOneTransaction: commits queued behind a running
// batch share one transaction; a message whose dedupe row exists, and the
// second copy of a message in the same batch, are answered "not fresh" and
// their apply does not run.
func TestGroupCommitSharesOneTransaction(t *testing.T) {
	t.Parallel()
	db, c := groupCommitEnv(t)
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO processed_messages (consumer, message_id) VALUES ('gc', 'm4')`); err != nil {
		t.Fatal(err)
	}
	cases := []*commitCase{{msgID: "m1"}, {msgID: "m2"}, {msgID: "m3"}, {msgID: "m3"}, {msgID: "m4"}}
	groupCommit(t, c, cases)

	fresh := map[string]int{}
	for _, k := range cases {
		if k.err != nil || !k.committed {
			t.Errorf("%s: committed %v, err %v; want committed", k.msgID, k.committed, k.err)
		}
		if k.fresh {
			fresh[k.msgID]++
		}
	}
	if fresh["m1"] != 1 || fresh["m2"] != 1 || fresh["m3"] != 1 || fresh["m4"] != 0 {
		t.Errorf("fresh answers per message %v; want m1, m2 and one of the two m3 once, m4 never", fresh)
	}
	eff := effects(t, db)
	if len(eff) != 4 {
		t.Errorf("effects %v; want the blocker, m1, m2, m3 once each", eff)
	}
	if eff["m1"] == 0 || eff["m1"] != eff["m2"] || eff["m2"] != eff["m3"] {
		t.Errorf("transactions %v: m1, m2 and m3 did not share one", eff)
	}
	if eff["m1"] == eff["blocker-"+t.Name()] {
		t.Errorf("the queued batch ran in the blocker's transaction")
	}
	if rows := dedupeRows(t, db, "gc"); !rows["m1"] || !rows["m2"] || !rows["m3"] || !rows["m4"] {
		t.Errorf("dedupe rows %v", rows)
	}
}

// TestGroupCommitIsolatesAFailingMessage: one apply that fails in a batch
// fails only its own message (with its own error, no dedupe row, no
// effect); the others run again alone and commit.
func TestGroupCommitIsolatesAFailingMessage(t *testing.T) {
	t.Parallel()
	db, c := groupCommitEnv(t)
	boom := step.Permanent(errors.New("this order cannot be served"))
	cases := []*commitCase{{msgID: "f1"}, {msgID: "f2", fail: boom}, {msgID: "f3"}}
	groupCommit(t, c, cases)

	for _, k := range cases {
		switch {
		case k.fail != nil:
			if !errors.Is(k.err, boom) || k.committed || k.fresh {
				t.Errorf("%s: err %v committed %v fresh %v; want its own error, not committed", k.msgID, k.err, k.committed, k.fresh)
			}
		case k.err != nil || !k.committed || !k.fresh:
			t.Errorf("%s: err %v committed %v fresh %v; want committed and fresh", k.msgID, k.err, k.committed, k.fresh)
		}
	}
	eff := effects(t, db)
	if _, ok := eff["f2"]; ok || eff["f1"] == 0 || eff["f3"] == 0 {
		t.Errorf("effects %v; want f1 and f3, not f2", eff)
	}
	if eff["f1"] == eff["f3"] {
		t.Errorf("f1 and f3 committed in one transaction after the batch failed; want each alone")
	}
	if rows := dedupeRows(t, db, "gc"); !rows["f1"] || rows["f2"] || !rows["f3"] {
		t.Errorf("dedupe rows %v; want f1 and f3 only", rows)
	}
}

// TestTwoReplicasOfAStepDoNotDeadlockOnDedupeRows: two processes' group
// commits of one step that hold the same messages (redeliveries to the
// other replica) in opposite orders both commit, each in one transaction.
// A trigger slows every dedupe row down, so that the two statements run at
// once. Unless both insert their rows in one order, each waits on the
// other's row of a message it also holds: PostgreSQL breaks the cycle after
// deadlock_timeout and the failed batch is run again message by message
// (which the step logs).
func TestTwoReplicasOfAStepDoNotDeadlockOnDedupeRows(t *testing.T) {
	t.Parallel()
	db, _ := groupCommitEnv(t)
	var log testenv.Buffer
	replica := func() *consumers.Committer {
		env := testenv.Env(t, db, testenv.NATS(t))
		env.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		return consumers.NewCommitter(env, "gc")
	}
	a, b := replica(), replica()
	if _, err := db.Pool.Exec(t.Context(), `
		CREATE FUNCTION slow_dedupe() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.message_id LIKE 'm%' THEN PERFORM pg_sleep(0.01); END IF; RETURN NEW; END $$;
		CREATE TRIGGER slow_dedupe BEFORE INSERT ON processed_messages FOR EACH ROW EXECUTE FUNCTION slow_dedupe()`); err != nil {
		t.Fatal(err)
	}
	const n = 20
	release := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2*n+2)
	for r, c := range []*consumers.Committer{a, b} {
		started := make(chan struct{})
		wg.Go(func() {
			_, _, err := c.Commit(t.Context(), fmt.Sprintf("blocker-%d", r), func(context.Context, pgx.Tx) ([]outbox.Row, error) {
				close(started)
				<-release
				return nil, nil
			})
			errs <- err
		})
		<-started
		for i := range n {
			id := fmt.Sprintf("m%02d", i)
			if r == 1 {
				id = fmt.Sprintf("m%02d", n-1-i)
			}
			wg.Go(func() {
				_, _, err := c.Commit(t.Context(), id, func(ctx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
					_, err := tx.Exec(ctx, `INSERT INTO gc_effects (msg_id, tx) VALUES ($1, txid_current())`, id)
					return nil, err
				})
				errs <- err
			})
		}
		testenv.WaitFor(t, 10*time.Second, "every commit queued behind the blocker", func() bool { return c.Queued() == n })
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(log.String(), "step batch failed") {
		t.Fatalf("a batch failed and was run again message by message:\n%s", log.String())
	}
	txs := map[int64]int{}
	eff := effects(t, db)
	for _, tx := range eff {
		txs[tx]++
	}
	if len(eff) != n || len(txs) != 1 {
		t.Fatalf("%d effects in transactions %v; want each of the %d messages once, all in one replica's batch", len(eff), txs, n)
	}
}

// TestACommittedBatchPublishesAfterItsContextEnded: the events a step's
// batch committed are published inline, and stamped, even when the
// context of the handler that led the batch ended meanwhile (a slow
// payment run at its bound): the commit stands, so its events go now, not
// seconds later through the relay (none runs in this test).
func TestACommittedBatchPublishesAfterItsContextEnded(t *testing.T) {
	t.Parallel()
	db, c := groupCommitEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	var id int64
	_, committed, err := c.Commit(ctx, "m1", func(actx context.Context, tx pgx.Tx) ([]outbox.Row, error) {
		ev := orderevent.Event{Version: orderevent.Version, Name: orderevent.Reserved, OrderID: uuid.New(), ClientID: uuid.New(),
			RequestID: "req-1", Status: orderevent.Reserved.Status(), OccurredAt: time.Now().UTC()}
		rows, err := outbox.EnqueueMany(actx, tx, []outbox.Entry{{Ctx: actx, Event: ev}})
		if len(rows) == 1 {
			id = rows[0].ID
		}
		cancel() // the handler's context ends before the commit is answered
		return rows, err
	})
	if err != nil || !committed {
		t.Fatalf("commit: committed %v, %v", committed, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the committed event published and stamped", func() bool {
		var published bool
		err := db.Pool.QueryRow(t.Context(), `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&published)
		return err == nil && published
	})
}
