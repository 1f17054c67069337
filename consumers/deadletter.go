package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"orderpipe/shared/orderevent"
)

// DeadLetter is a message a step gave up on.
type DeadLetter struct {
	ID         int64             `json:"id"`
	Consumer   string            `json:"consumer"`
	MessageID  string            `json:"message_id"`
	Subject    string            `json:"subject"`
	Payload    []byte            `json:"payload"`
	Headers    map[string]string `json:"headers"`
	Error      string            `json:"error"`
	Attempts   int               `json:"attempts"`
	OrderID    *uuid.UUID        `json:"order_id,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	ReplayedAt *time.Time        `json:"replayed_at,omitempty"`
	Replays    int               `json:"replays"`
}

// ErrNoDeadLetter is returned for an unknown dead letter id.
var ErrNoDeadLetter = errors.New("no such dead letter")

// storable returns s as PostgreSQL's text and jsonb take it: invalid UTF-8
// and NUL bytes (which both refuse) replaced with U+FFFD. A message that
// carries them must still be kept.
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// putDeadLetter stores msg, retrying a few times: it runs when the message
// is about to be acked for good. Its payload is kept exactly; its id,
// subject and headers as storable makes them. The same copy of a message
// (consumer, message id, stream sequence) is stored once: a redelivery after
// a lost ack gets the id of its first dead letter, and fresh false.
func putDeadLetter(ctx context.Context, pool *pgxpool.Pool, consumer string, msg *message.Message, reason string, attempts int) (id int64, fresh bool, err error) {
	headers := map[string]string{}
	for k, v := range msg.Metadata {
		if k != "" && k[0] != '_' {
			headers[storable(k)] = storable(v)
		}
	}
	hb, _ := json.Marshal(headers)
	var orderID *uuid.UUID
	if id, err := uuid.Parse(headers[orderevent.HeaderOrderID]); err == nil {
		orderID = &id
	}
	var seq *int64
	if n, err := strconv.ParseInt(msg.Metadata.Get(metaStreamSeq), 10, 64); err == nil && n > 0 {
		seq = &n
	}
	for i, pause := 0, 100*time.Millisecond; i < 4; i, pause = i+1, pause*3 {
		err = pool.QueryRow(ctx, `
			INSERT INTO dead_letters (consumer, message_id, subject, payload, headers, error, attempts, order_id, stream_seq)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (consumer, message_id, stream_seq) DO UPDATE SET attempts = dead_letters.attempts
			RETURNING id, xmax = 0`,
			consumer, storable(msg.UUID), storable(msg.Metadata.Get(metaSubject)), []byte(msg.Payload), hb, storable(reason), attempts, orderID, seq).Scan(&id, &fresh)
		if err == nil {
			return id, fresh, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, err
		case <-time.After(pause):
		}
	}
	return 0, false, fmt.Errorf("store dead letter of %s: %w", msg.UUID, err)
}

const dlColumns = `id, consumer, message_id, subject, payload, headers, error, attempts, order_id, created_at, replayed_at, replays`

func scanDeadLetter(row pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	err := row.Scan(&d.ID, &d.Consumer, &d.MessageID, &d.Subject, &d.Payload, &d.Headers, &d.Error, &d.Attempts, &d.OrderID, &d.CreatedAt, &d.ReplayedAt, &d.Replays)
	return d, err
}

// ListDeadLetters returns dead letters, newest first; all of them, or only
// those not replayed yet.
func ListDeadLetters(ctx context.Context, pool *pgxpool.Pool, includeReplayed bool, limit int) ([]DeadLetter, error) {
	rows, err := pool.Query(ctx, `SELECT `+dlColumns+` FROM dead_letters WHERE $1 OR replayed_at IS NULL ORDER BY id DESC LIMIT $2`, includeReplayed, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("read dead letter: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// GetDeadLetter returns one dead letter.
func GetDeadLetter(ctx context.Context, pool *pgxpool.Pool, id int64) (DeadLetter, error) {
	return readDeadLetter(pool.QueryRow(ctx, `SELECT `+dlColumns+` FROM dead_letters WHERE id = $1`, id), id)
}

// readDeadLetter scans dead letter id from row, the result of a query for
// it; no row is ErrNoDeadLetter.
func readDeadLetter(row pgx.Row, id int64) (DeadLetter, error) {
	d, err := scanDeadLetter(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("read dead letter %d: %w", id, err)
	}
	return d, nil
}

// ReplayDeadLetter publishes a dead letter's payload again on its subject
// and stamps it replayed; it returns the new Nats-Msg-Id.
//
// The new message gets a Nats-Msg-Id of its own ("<id>:dlq<dead letter
// id>.<n>"), so the broker's duplicate window, which still remembers the
// original id, does not swallow it. It passes the step's dedupe: that is
// keyed on the event's own id, and the step that dead-lettered the message
// never committed a dedupe row for it (its transaction rolled back). Other
// steps on the same subject that did process the event find their row and
// ignore the replay; a step whose order has moved on meanwhile (the
// compensator cancelled it) finds the order in another state and changes
// nothing.
func ReplayDeadLetter(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, id int64) (string, error) {
	var newID string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		d, err := readDeadLetter(tx.QueryRow(ctx, `SELECT `+dlColumns+` FROM dead_letters WHERE id = $1 FOR UPDATE`, id), id)
		if err != nil {
			return err
		}
		if d.Subject == "" {
			return fmt.Errorf("dead letter %d has no subject to replay to", id)
		}
		newID = fmt.Sprintf("%s:dlq%d.%d", d.MessageID, d.ID, d.Replays+1)
		msg := &nats.Msg{Subject: d.Subject, Data: d.Payload, Header: nats.Header{}}
		for k, v := range d.Headers {
			if k == middleware.CorrelationIDMetadataKey {
				continue // the router's metadata, not a header of the event (see orderevent.AsyncAPI)
			}
			msg.Header.Set(k, v)
		}
		msg.Header.Set(orderevent.HeaderMsgID, newID)
		msg.Header.Set(orderevent.HeaderReplayOf, fmt.Sprint(d.ID))
		if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(newID)); err != nil {
			return fmt.Errorf("publish replay of dead letter %d: %w", id, err)
		}
		_, err = tx.Exec(ctx, `UPDATE dead_letters SET replayed_at = now(), replays = replays + 1 WHERE id = $1`, id)
		return err
	})
	return newID, err
}
