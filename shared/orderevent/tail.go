package orderevent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// TailOptions select what Tail follows and how it prints it. The zero value
// follows every new event of the stream, as text, until the context ends.
type TailOptions struct {
	// OrderID keeps only the events of one order (uuid.Nil: every order).
	OrderID uuid.UUID
	// Subject keeps only one subject, "<prefix>.<event>" ("": all).
	Subject string
	// FromSeq starts at this stream sequence (0: not set).
	FromSeq uint64
	// Since starts this long ago (0: not set). At most one of FromSeq
	// and Since; with neither, Tail prints new events only.
	Since time.Duration
	// JSON prints one TailRecord per line instead of text.
	JSON bool
	// Count stops after this many printed events (0: follow until the
	// context ends).
	Count int
}

// ErrBadTailOptions marks options that Validate refuses.
var ErrBadTailOptions = errors.New("bad tail options")

// ParseSubject returns the event name of subject s of topology t, e.g.
// "orders.paid" → Paid.
func (t Topology) ParseSubject(s string) (Name, error) {
	rest, ok := strings.CutPrefix(s, t.Prefix+".")
	if n := Name(rest); ok && n.Valid() {
		return n, nil
	}
	var want []string
	for _, n := range Names() {
		want = append(want, t.Subject(n))
	}
	return "", fmt.Errorf("unknown subject %q: want one of %s", s, strings.Join(want, ", "))
}

// Validate checks o against topology t.
func (o TailOptions) Validate(t Topology) error {
	if o.Subject != "" {
		if _, err := t.ParseSubject(o.Subject); err != nil {
			return fmt.Errorf("%w: %w", ErrBadTailOptions, err)
		}
	}
	switch {
	case o.FromSeq > 0 && o.Since != 0:
		return fmt.Errorf("%w: give a start sequence or a start time, not both", ErrBadTailOptions)
	case o.Since < 0:
		return fmt.Errorf("%w: since must be positive, got %s", ErrBadTailOptions, o.Since)
	case o.Count < 0:
		return fmt.Errorf("%w: count must be positive or 0, got %d", ErrBadTailOptions, o.Count)
	}
	return nil
}

// TailRecord is one printed message (the JSON form of Tail).
type TailRecord struct {
	// Seq is the message's stream sequence.
	Seq uint64 `json:"seq"`
	// Subject is the message's subject.
	Subject string `json:"subject"`
	// Time is when the stream stored the message.
	Time time.Time `json:"time"`
	// Headers are the message's headers (first value of each).
	Headers map[string]string `json:"headers"`
	// Event is the decoded payload; nil when it is malformed.
	Event *Event `json:"event,omitempty"`
	// Error says why the payload is malformed, and Raw is the payload then.
	Error string `json:"error,omitempty"`
	// Raw is the payload as received when it does not decode.
	Raw string `json:"raw,omitempty"`
}

// Tail follows stream t.Stream with an ordered (ephemeral, unacknowledged)
// consumer and prints each message that o selects to out, headers and
// decoded payload, until ctx ends or o.Count messages were printed. Once
// the consumer exists it writes one line saying what it follows to status
// (which may be nil). A malformed payload is printed with its error, not
// skipped.
func Tail(ctx context.Context, js jetstream.JetStream, t Topology, o TailOptions, out, status io.Writer) error {
	if err := o.Validate(t); err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}
	from := "new messages"
	switch {
	case o.FromSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, o.FromSeq
		from = fmt.Sprintf("stream sequence %d", o.FromSeq)
	case o.Since > 0:
		start := time.Now().Add(-o.Since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		from = "messages since " + start.UTC().Format(time.RFC3339)
	}
	filter := t.AllSubjects()
	if o.Subject != "" {
		filter = o.Subject
		cfg.FilterSubjects = []string{o.Subject}
	}
	cons, err := js.OrderedConsumer(ctx, t.Stream, cfg)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s not found: is NATS_URL the deployment's broker, and has a part started?", t.Stream)
	}
	if err != nil && !js.Conn().IsConnected() {
		return fmt.Errorf("follow stream %s: the broker is unreachable: %w", t.Stream, err)
	}
	if err != nil {
		return fmt.Errorf("follow stream %s: %w", t.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow stream %s: %w", t.Stream, err)
	}
	defer it.Stop()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Stop()
		case <-stopped:
		}
	}()
	if status != nil {
		which := "every order"
		if o.OrderID != uuid.Nil {
			which = "order " + o.OrderID.String()
		}
		fmt.Fprintf(status, "following %s (%s) from %s, %s\n", t.Stream, filter, from, which)
	}
	printed := 0
	for o.Count == 0 || printed < o.Count {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow stream %s: %w", t.Stream, err)
		}
		r := record(m)
		if o.OrderID != uuid.Nil && r.orderID() != o.OrderID {
			continue
		}
		if err := r.print(out, o.JSON); err != nil {
			return err
		}
		printed++
	}
	return nil
}

func record(m jetstream.Msg) TailRecord {
	r := TailRecord{Subject: m.Subject(), Headers: map[string]string{}}
	if md, err := m.Metadata(); err == nil {
		r.Seq, r.Time = md.Sequence.Stream, md.Timestamp.UTC()
	}
	for k, v := range m.Headers() {
		if len(v) > 0 {
			r.Headers[k] = v[0]
		}
	}
	e, err := Decode(m.Data())
	if err != nil {
		r.Error, r.Raw = err.Error(), string(m.Data())
	} else {
		r.Event = &e
	}
	return r
}

func (r TailRecord) orderID() uuid.UUID {
	if r.Event != nil {
		return r.Event.OrderID
	}
	id, _ := uuid.Parse(r.Headers[HeaderOrderID])
	return id
}

func (r TailRecord) print(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s", r.Seq, r.Time.Format(time.RFC3339Nano), r.Subject)
	if e := r.Event; e != nil {
		fmt.Fprintf(&b, " order=%s status=%s request_id=%s client=%s occurred_at=%s", e.OrderID, e.Status, e.RequestID,
			e.ClientID, e.OccurredAt.UTC().Format(time.RFC3339Nano))
		if e.Reason != "" {
			fmt.Fprintf(&b, " reason=%q", e.Reason)
		}
		if e.Redrive > 0 {
			fmt.Fprintf(&b, " redrive=%d", e.Redrive)
		}
	} else {
		raw := r.Raw
		if len(raw) > 512 {
			raw = raw[:512] + "…"
		}
		fmt.Fprintf(&b, " MALFORMED (%s) payload=%q", r.Error, raw)
	}
	keys := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\n    %s: %s", k, r.Headers[k])
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
