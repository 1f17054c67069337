package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { Main(m) }

func TestDatabasesAreSeparateAndMigrated(t *testing.T) {
	t.Parallel()
	a, b := DB(t), DB(t)
	ctx := t.Context()
	if _, err := a.Pool.Exec(ctx, `INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES (gen_random_uuid(), 'a', '\x01', 's')`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM api_clients`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database b sees a's row")
	}
}

func TestNATSTopologiesAreSeparate(t *testing.T) {
	t.Parallel()
	a, b := NATS(t), NATS(t)
	if a.Topology == b.Topology {
		t.Fatal("two tests share a topology")
	}
	ctx := t.Context()
	if _, err := a.JS.Publish(ctx, a.Topology.Prefix+".accepted", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, info := StreamInfo(t, b.JS, b.Topology.Stream); info.State.Msgs != 0 {
		t.Fatal("stream b got a's message")
	}
}

func TestOwnNATSRestartKeepsStream(t *testing.T) {
	t.Parallel()
	s := OwnNATS(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js := connect(t, s.URL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "r.x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Start()
	js = connect(t, s.URL())
	var msgs uint64
	WaitFor(t, 20*time.Second, "stream back after restart", func() bool {
		st, err := js.Stream(ctx, "R")
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false
		}
		msgs = info.State.Msgs
		return true
	})
	if msgs != 1 {
		t.Fatalf("after restart: %d messages, want 1", msgs)
	}
}

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, js, err := natsConnect(url, Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return js
}

func TestOwnPostgresRestart(t *testing.T) {
	t.Parallel()
	s := Postgres(t)
	ctx := t.Context()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	pool := openPool(t, s.URL("postgres"))
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatalf("schema gone after restart: %v", err)
	}
}
