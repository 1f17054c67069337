// Package idemtoken owns the idempotency_tokens table: server-issued
// tokens for clients that cannot keep a request_id of their own (a browser
// form rendered again, an agent that rebuilds its tool call after a
// timeout, a service that passes an order through others).
//
// A client asks for a token once (Issue) and sends it on every attempt of
// one order, in place of the request_id. The token becomes the order's
// request_id, so the order's unique (client_id, request_id) stays the one
// guard against a second order; the token's state only gates concurrent
// use and tells the client what to do:
//
//	unused ──Claim──▶ processing ──MarkUsed──▶ used
//	                     │  ▲
//	          holder died│  │Claim again once claimed_until passed
//	                     ▼  │
//	               (lease lapsed)
//
// A request that finds the token processing gets an *InFlightError (retry
// later, same token); used lets the request through to the order's
// dedupe, which answers the first order (or a mismatch); an unknown
// token, or one of another client, is ErrUnknown; one that expired unused
// is ErrExpired (fetch a new one). Expired unused tokens are swept after a
// retention (Sweep); a used one lives as long as its order.
package idemtoken

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"orderpipe/shared/config"
	"orderpipe/shared/metrics"
	"orderpipe/shared/postgres"
)

// EnvTTL is the time to live of an issued token, from MinTTL to MaxTTL.
var EnvTTL = config.DurationSettingBetween("ORDERPIPE_TOKEN_TTL", "time to live of a server-issued idempotency token (POST /v1/idempotency-tokens, MCP new_order_token), 1s to 24h", DefaultTTL, MinTTL, MaxTTL)

// DefaultTTL is a token's time to live: long enough for a slow user's or
// agent's retries, short enough that dead tokens do not pile up.
const DefaultTTL = 15 * time.Minute

// MinTTL and MaxTTL bound ORDERPIPE_TOKEN_TTL.
const (
	MinTTL = time.Second
	MaxTTL = 24 * time.Hour
)

// DefaultRetention is how long an expired unused token is kept (answering
// ErrExpired rather than ErrUnknown, and counted as expired) before the
// compensator's sweep deletes it.
const DefaultRetention = 24 * time.Hour

// Prefix starts every token. Request ids that start with it are taken for
// tokens.
const Prefix = "opt1."

var format = regexp.MustCompile(`^opt1\.[0-9a-f]{48}$`)

// State is a token's state as operators see it.
type State string

// Token states. Expired is an unused token past its expiry.
const (
	Unused     State = "unused"
	Processing State = "processing"
	Used       State = "used"
	Expired    State = "expired"
)

// States lists every state, in their order of life.
func States() []State { return []State{Unused, Processing, Used, Expired} }

// Errors of Claim.
var (
	// ErrUnknown: no such token for this client (never issued, another
	// client's, or swept). Fetch a new token.
	ErrUnknown = errors.New("unknown idempotency token")
	// ErrExpired: the token expired unused. Fetch a new token.
	ErrExpired = errors.New("idempotency token expired unused")
)

// InFlightError: another request holds the token; retry after RetryAfter
// with the same token.
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("another request with this idempotency token is in flight; retry in %s", e.RetryAfter.Round(time.Second))
}

// IsToken reports whether s is shaped like an issued token (and so is
// handled as one wherever a request_id is expected).
func IsToken(s string) bool { return strings.HasPrefix(s, Prefix) }

// Valid reports whether s is exactly a token's shape.
func Valid(s string) bool { return format.MatchString(s) }

// Token is an issued token.
type Token struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Issue stores a new unused token of clientID that expires after ttl.
func Issue(ctx context.Context, db postgres.DB, clientID uuid.UUID, ttl time.Duration) (Token, error) {
	if ttl <= 0 {
		return Token{}, fmt.Errorf("issue token: time to live must be positive, got %s", ttl)
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Token{}, fmt.Errorf("issue token: %w", err)
	}
	t := Token{Token: Prefix + hex.EncodeToString(b[:])}
	err := db.QueryRow(ctx, `
		INSERT INTO idempotency_tokens (token, client_id, expires_at)
		VALUES ($1, $2, now() + make_interval(secs => $3::float8)) RETURNING expires_at`,
		t.Token, clientID, ttl.Seconds()).Scan(&t.ExpiresAt)
	if err != nil {
		return Token{}, fmt.Errorf("issue token: %w", err)
	}
	return t, nil
}

// Claim takes clientID's token for one request until lease passes:
// claimed true when the token was unused (and unexpired) or processing
// under a lapsed lease; claimed false, nil when it is used (the request
// goes on to the order's dedupe, which answers the first order). Otherwise
// an *InFlightError, ErrExpired or ErrUnknown.
func Claim(ctx context.Context, db postgres.DB, clientID uuid.UUID, token string, lease time.Duration) (claimed bool, err error) {
	if !Valid(token) {
		return false, ErrUnknown
	}
	tag, err := db.Exec(ctx, `
		UPDATE idempotency_tokens SET state = 'processing', claimed_until = now() + make_interval(secs => $3::float8)
		WHERE token = $1 AND client_id = $2
		  AND ((state = 'unused' AND expires_at > now()) OR (state = 'processing' AND claimed_until <= now()))`,
		token, clientID, lease.Seconds())
	if err != nil {
		return false, fmt.Errorf("claim token: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	var state State
	var expired bool
	var waitSecs float64
	err = db.QueryRow(ctx, `
		SELECT state, expires_at <= now(), coalesce(greatest(extract(epoch FROM claimed_until - now()), 0), 0)::float8
		FROM idempotency_tokens WHERE token = $1 AND client_id = $2`, token, clientID).Scan(&state, &expired, &waitSecs)
	wait := time.Duration(waitSecs * float64(time.Second))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, ErrUnknown
	case err != nil:
		return false, fmt.Errorf("read token: %w", err)
	case state == Used:
		return false, nil
	case state == Processing:
		return false, &InFlightError{RetryAfter: max(wait, time.Second)}
	case expired:
		return false, ErrExpired
	}
	// Unused and unexpired, yet not claimed: it expired between the two
	// statements, or was claimed and released meanwhile.
	return false, &InFlightError{RetryAfter: time.Second}
}

// MarkUsed records that the token's order exists: the token moves to used
// with the order of (its client, request_id = token). Nothing changes when
// no such order committed.
func MarkUsed(ctx context.Context, db postgres.DB, token string) error {
	tag, err := db.Exec(ctx, `
		UPDATE idempotency_tokens t SET state = 'used', order_id = o.order_id, used_at = now(), claimed_until = NULL
		FROM orders o
		WHERE t.token = $1 AND t.state <> 'used' AND o.client_id = t.client_id AND o.request_id = t.token`, token)
	if err != nil {
		return fmt.Errorf("mark token used: %w", err)
	}
	metrics.TokensUsed.Add(float64(tag.RowsAffected()))
	return nil
}

// Lapse ends a request's hold on a token whose order may not have
// committed: the token stays processing with its lease over, so the next
// request claims it at once.
func Lapse(ctx context.Context, db postgres.DB, token string) error {
	_, err := db.Exec(ctx, `UPDATE idempotency_tokens SET claimed_until = now() WHERE token = $1 AND state = 'processing'`, token)
	if err != nil {
		return fmt.Errorf("release token: %w", err)
	}
	return nil
}

// SettleGrace is how long past its lease a token held by a request that
// wrote no order stays processing before Settle gives it back (unused).
const SettleGrace = time.Minute

// Settle repairs the tokens whose holder died (their lease passed): one
// whose order committed becomes used with it; one without an order, past
// its lease by SettleGrace, becomes unused again (and is then claimed,
// refused as expired, or swept like any unused token). It returns how many
// it repaired.
func Settle(ctx context.Context, db postgres.DB) (int64, error) {
	used, err := db.Exec(ctx, `
		UPDATE idempotency_tokens t SET state = 'used', order_id = o.order_id, used_at = now(), claimed_until = NULL
		FROM orders o
		WHERE t.state = 'processing' AND t.claimed_until <= now() AND o.client_id = t.client_id AND o.request_id = t.token`)
	if err != nil {
		return 0, fmt.Errorf("settle tokens whose order committed: %w", err)
	}
	metrics.TokensUsed.Add(float64(used.RowsAffected()))
	freed, err := db.Exec(ctx, `
		UPDATE idempotency_tokens t SET state = 'unused', claimed_until = NULL
		WHERE t.state = 'processing' AND t.claimed_until <= now() - make_interval(secs => $1::float8)
		  AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.client_id = t.client_id AND o.request_id = t.token)`, SettleGrace.Seconds())
	if err != nil {
		return 0, fmt.Errorf("give back tokens whose holder died: %w", err)
	}
	return used.RowsAffected() + freed.RowsAffected(), nil
}

// Sweep deletes up to batch unused tokens that expired more than retention
// ago (none that an order carries), and returns how many it deleted.
func Sweep(ctx context.Context, db postgres.DB, retention time.Duration, batch int) (int64, error) {
	tag, err := db.Exec(ctx, `
		DELETE FROM idempotency_tokens WHERE token = ANY (ARRAY(
			SELECT t.token FROM idempotency_tokens t
			WHERE t.state = 'unused' AND t.expires_at < now() - make_interval(secs => $1::float8)
			  AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.client_id = t.client_id AND o.request_id = t.token)
			LIMIT $2 FOR UPDATE SKIP LOCKED))`, retention.Seconds(), batch)
	if err != nil {
		return 0, fmt.Errorf("sweep expired tokens: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountOutstanding returns how many tokens are in each state but used
// (unused, processing, expired; every one of them present), read through
// the indexes of unused and processing tokens. Used tokens live as long as
// their orders and are not counted: metrics.TokensUsed counts them as
// they become used.
func CountOutstanding(ctx context.Context, db postgres.DB) (map[State]int64, error) {
	out := map[State]int64{Unused: 0, Processing: 0, Expired: 0}
	rows, err := db.Query(ctx, `
		SELECT CASE WHEN expires_at <= now() THEN 'expired' ELSE 'unused' END, count(*)
		FROM idempotency_tokens WHERE state = 'unused' GROUP BY 1
		UNION ALL
		SELECT 'processing', count(*) FROM idempotency_tokens WHERE state = 'processing'`)
	if err != nil {
		return nil, fmt.Errorf("count tokens: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s State
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}
