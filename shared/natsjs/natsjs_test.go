package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/natsjs"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestStreamConfig(t *testing.T) {
	top := orderevent.Topology{Stream: "S", Prefix: "p"}
	for _, tc := range []struct{ in, want int }{{1, 1}, {3, 3}, {5, 5}, {0, 1}, {-2, 1}} {
		c := natsjs.StreamConfig(top, tc.in)
		if c.Replicas != tc.want {
			t.Errorf("StreamConfig(replicas %d).Replicas = %d, want %d", tc.in, c.Replicas, tc.want)
		}
	}
	c := natsjs.StreamConfig(top, 1)
	if c.Name != "S" || !slices.Equal(c.Subjects, []string{"p.>"}) {
		t.Errorf("name %q, subjects %v; want S, [p.>]", c.Name, c.Subjects)
	}
	if c.Duplicates != natsjs.DuplicateWindow || natsjs.DuplicateWindow != 2*time.Hour {
		t.Errorf("duplicate window %s (DuplicateWindow %s), want 2h", c.Duplicates, natsjs.DuplicateWindow)
	}
	if c.Storage != jetstream.FileStorage || c.Retention != jetstream.LimitsPolicy || c.Discard != jetstream.DiscardOld || c.MaxAge != 7*24*time.Hour {
		t.Errorf("storage %v, retention %v, discard %v, max age %s; want file, limits, old, 168h", c.Storage, c.Retention, c.Discard, c.MaxAge)
	}
}

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	_, info := testenv.StreamInfo(t, js, name)
	return info.Config
}

func TestEnsureStreamIsIdempotentAndUndoesDrift(t *testing.T) {
	env := testenv.NATS(t) // the stream is provisioned already
	s, err := env.JS.Stream(t.Context(), env.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(t.Context(), env.Topology.Subject(orderevent.Accepted), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := natsjs.EnsureStream(t.Context(), env.JS, env.Topology, 1); err != nil {
			t.Fatalf("ensure an existing stream: %v", err)
		}
	}
	c := streamConfig(t, env.JS, env.Topology.Stream)
	if c.Duplicates != natsjs.DuplicateWindow || !slices.Equal(c.Subjects, []string{env.Topology.AllSubjects()}) {
		t.Fatalf("config after ensure: duplicates %s, subjects %v", c.Duplicates, c.Subjects)
	}

	// Someone edits the stream by hand.
	drift := c
	drift.Duplicates = time.Minute
	drift.MaxAge = time.Hour
	drift.Subjects = append(drift.Subjects, "drift.>")
	if _, err := env.JS.UpdateStream(t.Context(), drift); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(t.Context(), env.JS, env.Topology, 1); err != nil {
		t.Fatalf("ensure a drifted stream: %v", err)
	}
	c = streamConfig(t, env.JS, env.Topology.Stream)
	if c.Duplicates != natsjs.DuplicateWindow || c.MaxAge != 7*24*time.Hour || !slices.Equal(c.Subjects, []string{env.Topology.AllSubjects()}) {
		t.Fatalf("config after ensuring a drifted stream: duplicates %s, max age %s, subjects %v", c.Duplicates, c.MaxAge, c.Subjects)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		t.Fatal("ensuring the stream lost its messages")
	}
}

// EnsureStream runs at every start and whenever a part finds the stream
// missing, often in several goroutines of one process at once (each step's
// subscriber). On a stream that already matches it must not send an
// update: nats-server 2.15.3 updates a stream's file store without a lock
// that a consumer's creation on the same stream reads (a data race in
// `go test -race ./consumers/`, the stream re-provisioned by three
// subscribers while the first created its consumer). It creates the stream,
// and updates it only when its configuration differs.
func TestEnsureStreamSendsNoUpdateToAMatchingStream(t *testing.T) {
	env := testenv.NATS(t) // the stream is provisioned already
	updates, err := env.Conn.SubscribeSync("$JS.API.STREAM.UPDATE." + env.Topology.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := natsjs.EnsureStream(t.Context(), env.JS, env.Topology, 1); err != nil {
			t.Fatalf("ensure an existing stream: %v", err)
		}
	}
	// A request sent on this connection reaches the subscription before
	// the answer to a later ping.
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := updates.Pending(); err != nil || n != 0 {
		t.Fatalf("ensuring a matching stream 3 times sent %d update requests (%v), want 0", n, err)
	}

	// A stream that differs is updated (the drift test checks how).
	drift := streamConfig(t, env.JS, env.Topology.Stream)
	drift.Description = "edited by hand"
	if _, err := env.JS.UpdateStream(t.Context(), drift); err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(t.Context(), env.JS, env.Topology, 1); err != nil {
		t.Fatal(err)
	}
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := updates.Pending(); err != nil || n != 2 {
		t.Fatalf("%d update requests (%v), want 2: the drift and its undoing", n, err)
	}
}

func TestEnsureStreamRefusesReplicasOnOneServer(t *testing.T) {
	env := testenv.NATS(t)
	top := orderevent.Topology{Stream: env.Topology.Stream + "_R3", Prefix: env.Topology.Prefix + "_r3"}
	_, err := natsjs.EnsureStream(t.Context(), env.JS, top, 3)
	t.Cleanup(func() { _ = env.JS.DeleteStream(context.WithoutCancel(t.Context()), top.Stream) })
	if err == nil {
		t.Fatalf("3 replicas on a single server: no error; config %+v", streamConfig(t, env.JS, top.Stream))
	}
	t.Logf("3 replicas on one server: %v", err)
}

func TestKeepStreamRecreatesADeletedStream(t *testing.T) {
	env := testenv.NATS(t)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { natsjs.KeepStream(ctx, env.JS, env.Topology, 1, 50*time.Millisecond, testenv.Logger(t)) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	for i := range 2 {
		if err := env.JS.DeleteStream(t.Context(), env.Topology.Stream); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
		testenv.WaitFor(t, 5*time.Second, "KeepStream to provision the stream again", func() bool {
			_, err := env.JS.Stream(t.Context(), env.Topology.Stream)
			return err == nil
		})
	}
	if c := streamConfig(t, env.JS, env.Topology.Stream); c.Duplicates != natsjs.DuplicateWindow {
		t.Fatalf("re-created stream has duplicate window %s", c.Duplicates)
	}
	cancel()
	wg.Wait() // KeepStream returns when its context ends
}

func TestKeepStreamProvisionsOnceTheBrokerIsUp(t *testing.T) {
	srv := testenv.OwnNATS(t)
	srv.Stop()
	nc, js, err := natsjs.Connect(srv.URL(), t.Name(), testenv.Logger(t))
	if err != nil {
		t.Fatalf("connect while the broker is down: %v (want a connection that keeps trying)", err)
	}
	t.Cleanup(nc.Close)
	top := orderevent.Topology{Stream: "KEEP", Prefix: "keep"}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { natsjs.KeepStream(ctx, js, top, 1, 50*time.Millisecond, testenv.Logger(t)) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	srv.Start()
	testenv.WaitFor(t, 20*time.Second, "the stream once the broker is up", func() bool {
		sctx, scancel := context.WithTimeout(t.Context(), time.Second)
		defer scancel()
		_, err := js.Stream(sctx, top.Stream)
		return err == nil
	})
}

func TestConnectReconnectsAndPingTellsTheBrokerIsDown(t *testing.T) {
	srv := testenv.OwnNATS(t)
	nc, js, err := natsjs.Connect(srv.URL(), t.Name(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := natsjs.Ping(t.Context(), nc, js); err != nil {
		t.Fatalf("ping a live broker: %v", err)
	}

	srv.Stop()
	testenv.WaitFor(t, 10*time.Second, "the client to notice the outage", func() bool { return !nc.IsConnected() })
	if err := natsjs.Ping(t.Context(), nc, js); err == nil {
		t.Fatal("ping of a stopped broker: no error")
	}

	srv.Start()
	testenv.WaitFor(t, 15*time.Second, "ping to succeed after the broker came back", func() bool {
		pctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return natsjs.Ping(pctx, nc, js) == nil
	})
	if nc.Reconnects == 0 {
		t.Error("the connection is up again but counts no reconnect")
	}
}

// TestAnUnansweredPublishGivesBackItsSlot: an asynchronous publish whose
// ack never comes (a partition the client has not noticed: the request
// reaches something that does not answer) fails after PublishAckTimeout
// and frees its slot. nats.go holds at most 4,000 unacknowledged
// publishes; without a timeout a slot is held until a reconnect, and once
// they are all held every publish waits and fails.
func TestAnUnansweredPublishGivesBackItsSlot(t *testing.T) {
	srv := testenv.OwnNATS(t)
	nc, js, err := natsjs.Connect(srv.URL(), t.Name(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A responder that never answers: the publish is not refused at once
	// (no responders), it waits for an ack.
	sub, err := nc.SubscribeSync("swallow.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	f, err := js.PublishAsync("swallow.me", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Ok():
		t.Fatal("acknowledged by nobody")
	case err := <-f.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("publish failed with %v, want a timeout", err)
		}
	case <-time.After(natsjs.PublishAckTimeout + 10*time.Second):
		t.Fatalf("no answer after %s: the publish holds its slot", natsjs.PublishAckTimeout+10*time.Second)
	}
	if n := js.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d publishes still pending after the timeout", n)
	}
}

func TestConnectRefusesAMalformedURL(t *testing.T) {
	for _, u := range []string{"nats://127.0.0.1:notaport", "://nohost"} {
		nc, _, err := natsjs.Connect(u, t.Name(), testenv.Logger(t))
		if err == nil {
			nc.Close()
			t.Errorf("Connect(%q): no error", u)
		}
	}
}

func TestStartEmbedded(t *testing.T) {
	ns, err := natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: t.TempDir(), Name: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.JetStreamEnabled() || ns.Name() != "solo" {
		t.Fatalf("JetStream enabled %v, name %q; want true, solo", ns.JetStreamEnabled(), ns.Name())
	}
	nc, js := testenv.Connect(t, ns.ClientURL())
	if err := natsjs.Ping(t.Context(), nc, js); err != nil {
		t.Fatal(err)
	}
	top := orderevent.Topology{Stream: "EMB", Prefix: "emb"}
	if _, err := natsjs.EnsureStream(t.Context(), js, top, 1); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(t.Context(), top.Subject(orderevent.Accepted), []byte("{}"))
	if err != nil || ack.Stream != "EMB" {
		t.Fatalf("publish: %+v, %v", ack, err)
	}
}

func TestStartEmbeddedRefusesAMalformedRoute(t *testing.T) {
	_, err := natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: t.TempDir(), Name: "bad",
		Cluster: natsjs.ClusterOptions{Name: "c", Port: freePort(t), Routes: []string{"://127.0.0.1:1"}}})
	if err == nil {
		t.Fatal("a malformed cluster route: no error")
	}
}

// A port another listener holds is named in the error, instead of a
// server that never becomes ready for no given reason.
func TestStartEmbeddedNamesAPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	_, err = natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: t.TempDir(), Name: "busy", ReadyTimeout: 2 * time.Second,
		Cluster: natsjs.ClusterOptions{Name: "c", Port: taken}})
	if !errors.Is(err, natsjs.ErrPortInUse) || !strings.Contains(err.Error(), fmt.Sprintf("cluster port %d", taken)) {
		t.Fatalf("a cluster port in use: %v", err)
	}
}

func TestStartEmbeddedCluster(t *testing.T) {
	// The stores' folder is made before the cleanup that stops the nodes is
	// registered, so that it is removed after they stopped (cleanups run
	// last first): a t.TempDir made per node afterwards was removed while
	// its node still wrote to it ("directory not empty").
	stores := t.TempDir()
	var nodes []*server.Server
	stop := func() {
		for _, ns := range nodes {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		nodes = nil
	}
	t.Cleanup(stop)
	start := time.Now()
	// The ports are picked before the nodes listen on them (each node
	// routes to the others), so another test may take one meanwhile:
	// then StartEmbedded names it, and the cluster starts over on others.
	for attempt := 1; ; attempt++ {
		ports := []int{freePort(t), freePort(t), freePort(t)}
		routes := make([]string, len(ports))
		for i, p := range ports {
			routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
		}
		var err error
		for i, p := range ports {
			var ns *server.Server
			var dir string
			if dir, err = os.MkdirTemp(stores, "node"); err != nil {
				t.Fatal(err)
			}
			ns, err = natsjs.StartEmbedded(natsjs.EmbeddedOptions{StoreDir: dir, Name: fmt.Sprintf("n%d", i),
				Cluster: natsjs.ClusterOptions{Name: "orderpipe-test", Port: p, Routes: slices.Delete(slices.Clone(routes), i, i+1)}})
			if err != nil {
				err = fmt.Errorf("node %d: %w", i, err)
				break
			}
			nodes = append(nodes, ns)
		}
		if err == nil {
			break
		}
		stop()
		if !errors.Is(err, natsjs.ErrPortInUse) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v", attempt, err)
	}
	_, js := testenv.Connect(t, nodes[0].ClientURL())
	top := orderevent.Topology{Stream: "CLU", Prefix: "clu"}
	var info *jetstream.StreamInfo
	testenv.WaitFor(t, 30*time.Second, "a replicated stream on the cluster", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		s, err := natsjs.EnsureStream(ctx, js, top, 3)
		if err != nil {
			return false
		}
		info, err = s.Info(ctx)
		return err == nil && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == 2
	})
	if info.Config.Replicas != 3 {
		t.Fatalf("replicas = %d, want 3", info.Config.Replicas)
	}
	if _, err := js.Publish(t.Context(), top.Subject(orderevent.Accepted), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	t.Logf("3-node cluster with an R3 stream in %s", time.Since(start).Round(time.Millisecond))
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
