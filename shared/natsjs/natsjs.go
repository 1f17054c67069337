// Package natsjs connects to NATS JetStream, provisions the ORDERS stream as
// code, and runs the embedded server that `orderpipe dev` and the tests use
// (the real nats-server, as a Go library, with its file store on disk).
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/orderevent"
)

// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id. A
// republish with the same id inside it is dropped by the broker; outside it,
// the consumers' processed_messages rows drop it.
const DuplicateWindow = 2 * time.Hour

// PublishAckTimeout bounds the wait for an asynchronous publish's ack: one
// not acknowledged by then fails and frees its slot. nats.go holds at most
// 4,000 unacknowledged publishes, and without a bound a publish that is
// never answered (a partition the connection has not noticed yet) holds
// its slot until a reconnect; once all are held every publish stalls. It
// is above the outbox relay's and the intake's own bounds on a batch.
const PublishAckTimeout = 10 * time.Second

// Connect dials the NATS server(s) in url (comma-separated) with endless
// reconnects, and returns the connection and its JetStream context. A
// broker that is down does not stop the process: the connection keeps
// trying in the background (a broker outage costs time, never orders: the
// intake keeps accepting into the outbox meanwhile).
func Connect(url, name string, logger *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.Timeout(5*time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", slog.Any("error", err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			logger.Info("nats reconnected", slog.String("url", c.ConnectedUrlRedacted()))
		}),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(PublishAckTimeout))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("open JetStream: %w", err)
	}
	return nc, js, nil
}

// StreamConfig returns the ORDERS stream's configuration: file storage,
// the duplicate window, limits retention, and the given replicas.
func StreamConfig(t orderevent.Topology, replicas int) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        t.Stream,
		Description: "orderpipe order events",
		Subjects:    []string{t.AllSubjects()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    replicas,
		Duplicates:  DuplicateWindow,
		MaxAge:      7 * 24 * time.Hour,
		Discard:     jetstream.DiscardOld,
	}
}

// EnsureStream creates the stream, or updates it when its configuration
// differs from StreamConfig. It is called at every start, so a broker that
// lost its streams gets them back. A stream that already matches is left
// alone: a create with the same configuration is answered with the stream,
// where an update would rewrite its store's configuration (which
// nats-server 2.15 does without a lock that a consumer's creation on the
// same stream reads, and several subscribers of one process provision at
// once).
func EnsureStream(ctx context.Context, js jetstream.JetStream, t orderevent.Topology, replicas int) (jetstream.Stream, error) {
	cfg := StreamConfig(t, replicas)
	s, err := js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.UpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", t.Stream, err)
	}
	return s, nil
}

// KeepStream provisions the stream now and then every interval until ctx
// ends, whenever it is missing: at a start while the broker was down,
// after the stream was deleted, or after a broker lost its store. It
// returns when ctx ends.
func KeepStream(ctx context.Context, js jetstream.JetStream, t orderevent.Topology, replicas int, interval time.Duration, logger *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	missing := false
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.Stream(sctx, t.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err := EnsureStream(sctx, js, t, replicas); err == nil {
				logger.Warn("the stream was missing; provisioned it again", slog.String("stream", t.Stream))
				missing = false
			} else if !missing {
				logger.Warn("the stream is missing and could not be provisioned yet", slog.String("stream", t.Stream), slog.Any("error", err))
				missing = true
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Ping reports whether the connection is up and JetStream answers.
func Ping(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	if !nc.IsConnected() {
		return errors.New("nats: not connected")
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// EmbeddedOptions configure an embedded server.
type EmbeddedOptions struct {
	// StoreDir holds JetStream's file store.
	StoreDir string
	// Port to listen on (127.0.0.1); -1 picks a free one.
	Port int
	// SyncAlways makes JetStream fsync every write before acknowledging
	// it (see deploy/nats.conf for the trade-off). Off in tests.
	SyncAlways bool
	// Name is the server's name (default "orderpipe-embedded"); each node
	// of a cluster needs its own.
	Name string
	// Cluster, when its Port is set, makes the server a node of a
	// JetStream cluster (the chaos checker runs three).
	Cluster ClusterOptions
	// ReadyTimeout bounds the wait for the server's listeners (default
	// 15s).
	ReadyTimeout time.Duration
}

// ClusterOptions make an embedded server one node of a cluster.
type ClusterOptions struct {
	// Name of the cluster; every node gives the same.
	Name string
	// Port the node listens on for its peers (127.0.0.1).
	Port int
	// Routes are the peers' cluster URLs (nats://127.0.0.1:PORT).
	Routes []string
}

// ErrPortInUse is wrapped by StartEmbedded's error when a port it was
// given is held by another listener.
var ErrPortInUse = errors.New("a port is in use")

// StartEmbedded runs a NATS server with JetStream in this process and waits
// until it accepts connections.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	if o.Port == 0 {
		o.Port = -1
	}
	opts := &server.Options{
		ServerName: "orderpipe-embedded",
		Host:       "127.0.0.1",
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: 1 << 20,
	}
	if o.SyncAlways {
		opts.SyncAlways = true
	}
	if o.Name != "" {
		opts.ServerName = o.Name
	}
	if o.Cluster.Port != 0 {
		opts.Cluster.Name = o.Cluster.Name
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port = o.Cluster.Port
		for _, r := range o.Cluster.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("cluster route %q: %w", r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure embedded NATS: %w", err)
	}
	go ns.Start()
	wait := o.ReadyTimeout
	if wait <= 0 {
		wait = 15 * time.Second
	}
	if !ns.ReadyForConnections(wait) {
		ns.Shutdown()
		ns.WaitForShutdown()
		// The server logs nothing here (NoLog): a listener that could not
		// bind is the likely cause, so say which port is taken.
		var taken []string
		for _, p := range []struct {
			name string
			port int
		}{{"client port", opts.Port}, {"cluster port", opts.Cluster.Port}} {
			if p.port <= 0 {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
			if err != nil {
				taken = append(taken, fmt.Sprintf("%s %d: %v", p.name, p.port, err))
				continue
			}
			_ = l.Close()
		}
		if len(taken) > 0 {
			return nil, fmt.Errorf("embedded NATS did not become ready within %s: %w: %s", wait, ErrPortInUse, strings.Join(taken, "; "))
		}
		return nil, fmt.Errorf("embedded NATS did not become ready within %s", wait)
	}
	return ns, nil
}
