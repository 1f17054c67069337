// Package tenant manages API clients: each gets a client id, an API key
// (shown once, stored as its SHA-256) and a webhook signing secret
// (whsec_…), and optionally its own rate limit at the intake (Limits).
// Request ids and orders are scoped per client.
package tenant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"
)

// Credentials are what `orderpipe clients create` prints, once.
type Credentials struct {
	ClientID      uuid.UUID `json:"client_id"`
	APIKey        string    `json:"api_key"`
	WebhookSecret string    `json:"webhook_secret"`
}

// Client is an authenticated API client.
type Client struct {
	ID            uuid.UUID
	Name          string
	WebhookSecret string
	CreatedAt     time.Time
	// Limits is the client's own rate limit at the intake; zero fields
	// mean the intake's defaults.
	Limits Limits
}

// Limits is a client's rate limit at the intake: Rate requests per second
// with a bucket of Burst. A zero field means the intake's default for it.
type Limits struct {
	Rate  float64 `json:"rate_limit,omitempty"`
	Burst int     `json:"rate_burst,omitempty"`
}

// MaxRate and MaxBurst bound a client's stored limits.
const (
	MaxRate  = 1e6
	MaxBurst = 1e7
)

// Validate checks limits: each zero (the default) or positive and within
// MaxRate and MaxBurst.
func (l Limits) Validate() error {
	if l.Rate < 0 || l.Rate > MaxRate || math.IsNaN(l.Rate) {
		return fmt.Errorf("rate limit must be between 0 (the default) and %g requests per second, got %v", float64(MaxRate), l.Rate)
	}
	if l.Burst < 0 || l.Burst > MaxBurst {
		return fmt.Errorf("burst must be between 0 (the default) and %d, got %d", int(MaxBurst), l.Burst)
	}
	return nil
}

// nullable is how a limit is stored: NULL for the default.
func nullable[T float64 | int](v T) *T {
	if v == 0 {
		return nil
	}
	return &v
}

// APIKeyPrefix starts every API key, so a leaked key is recognisable.
const APIKeyPrefix = "opk_"

// WebhookSecretPrefix starts every webhook secret (Standard Webhooks form).
const WebhookSecretPrefix = "whsec_"

// ErrUnauthenticated is returned for a missing, malformed or unknown key.
var ErrUnauthenticated = errors.New("unknown or malformed API key")

// ValidateName checks a client name: 1-200 characters, no control
// characters.
func ValidateName(name string) error {
	if strings.TrimSpace(name) == "" || len(name) > 200 {
		return errors.New("client name must be 1-200 characters")
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return errors.New("client name must not contain control characters")
		}
	}
	return nil
}

// Create registers a client with the intake's default rate limit and
// returns its credentials; the API key is not kept and cannot be shown
// again.
func Create(ctx context.Context, pool *pgxpool.Pool, name string) (Credentials, error) {
	return CreateLimited(ctx, pool, name, Limits{})
}

// CreateLimited is Create with the client's own rate limit.
func CreateLimited(ctx context.Context, pool *pgxpool.Pool, name string, limits Limits) (Credentials, error) {
	if err := ValidateName(name); err != nil {
		return Credentials{}, err
	}
	if err := limits.Validate(); err != nil {
		return Credentials{}, err
	}
	c := Credentials{
		ClientID:      uuid.Must(uuid.NewV7()),
		APIKey:        APIKeyPrefix + randomB64(32),
		WebhookSecret: WebhookSecretPrefix + base64.StdEncoding.EncodeToString(randomBytes(32)),
	}
	h := HashKey(c.APIKey)
	_, err := pool.Exec(ctx, `INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret, rate_limit, rate_burst)
		VALUES ($1, $2, $3, $4, $5, $6)`, c.ClientID, name, h[:], c.WebhookSecret, nullable(limits.Rate), nullable(limits.Burst))
	if err != nil {
		return Credentials{}, fmt.Errorf("create client %q: %w", name, err)
	}
	return c, nil
}

// ErrNoClient: no client has that id.
var ErrNoClient = errors.New("no such client")

// SetLimits changes a client's rate limit (zero fields: back to the
// default). Intake processes apply it within their key cache's TTL.
func SetLimits(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, limits Limits) error {
	if err := limits.Validate(); err != nil {
		return err
	}
	tag, err := pool.Exec(ctx, `UPDATE api_clients SET rate_limit = $2, rate_burst = $3 WHERE client_id = $1`,
		id, nullable(limits.Rate), nullable(limits.Burst))
	if err != nil {
		return fmt.Errorf("set rate limit of client %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set rate limit of client %s: %w", id, ErrNoClient)
	}
	return nil
}

// clientColumns and scan read a Client.
const clientColumns = `client_id, name, webhook_secret, created_at, coalesce(rate_limit, 0), coalesce(rate_burst, 0)`

func scan(row pgx.Row) (Client, error) {
	var c Client
	err := row.Scan(&c.ID, &c.Name, &c.WebhookSecret, &c.CreatedAt, &c.Limits.Rate, &c.Limits.Burst)
	return c, err
}

// HashKey returns the stored form of an API key. Keys carry 256 random
// bits, so a plain SHA-256 is enough (no password stretching needed) and
// allows lookup by hash.
func HashKey(key string) [32]byte { return sha256.Sum256([]byte(key)) }

// Authenticate finds the client of an API key.
func Authenticate(ctx context.Context, pool *pgxpool.Pool, apiKey string) (Client, error) {
	if !strings.HasPrefix(apiKey, APIKeyPrefix) || len(apiKey) > 200 {
		return Client{}, ErrUnauthenticated
	}
	h := HashKey(apiKey)
	c, err := scan(pool.QueryRow(ctx, `SELECT `+clientColumns+` FROM api_clients WHERE api_key_hash = $1`, h[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		return Client{}, ErrUnauthenticated
	}
	if err != nil {
		return Client{}, fmt.Errorf("look up API key: %w", err)
	}
	return c, nil
}

// Get returns a client by id.
func Get(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) (Client, error) {
	c, err := scan(pool.QueryRow(ctx, `SELECT `+clientColumns+` FROM api_clients WHERE client_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Client{}, fmt.Errorf("get client %s: %w", id, ErrNoClient)
	}
	if err != nil {
		return Client{}, fmt.Errorf("get client %s: %w", id, err)
	}
	return c, nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on supported platforms
	return b
}

func randomB64(n int) string { return base64.RawURLEncoding.EncodeToString(randomBytes(n)) }

// KeyCache remembers authenticated API keys for a short time, so that a
// busy client costs one database lookup per TTL instead of one per request.
// Unknown keys are not remembered. A key deleted from api_clients keeps
// working for at most TTL in a process that cached it. Safe for concurrent
// use; the zero value is not usable, use NewKeyCache.
type KeyCache struct {
	ttl time.Duration
	max int
	now func() time.Time
	// lookup is Authenticate (a test may count its calls).
	lookup func(ctx context.Context, pool *pgxpool.Pool, apiKey string) (Client, error)
	// flight makes concurrent misses of one key share one lookup: a burst
	// of a client's first requests (the article's 1,000 at once) must not
	// become as many queries on a cold cache.
	flight singleflight.Group

	mu      sync.Mutex
	entries map[[32]byte]cached
}

type cached struct {
	c       Client
	expires time.Time
}

// NewKeyCache returns a cache of at most max keys, each kept for ttl.
func NewKeyCache(ttl time.Duration, max int) *KeyCache {
	return &KeyCache{ttl: ttl, max: max, now: time.Now, lookup: Authenticate, entries: map[[32]byte]cached{}}
}

// Authenticate is the package's Authenticate through the cache. A caller
// waits for a shared lookup until ctx ends at most; the lookup goes on for
// the others (bounded by lookupTimeout) and its answer is cached.
func (k *KeyCache) Authenticate(ctx context.Context, pool *pgxpool.Pool, apiKey string) (Client, error) {
	if !strings.HasPrefix(apiKey, APIKeyPrefix) || len(apiKey) > 200 {
		return Client{}, ErrUnauthenticated
	}
	h := HashKey(apiKey)
	now := k.now()
	k.mu.Lock()
	e, ok := k.entries[h]
	k.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.c, nil
	}
	// The caller waits for the shared lookup until its own deadline only:
	// the intake's deadline bounds authentication too.
	ch := k.flight.DoChan(string(h[:]), func() (any, error) {
		// The lookup is shared: no one caller's cancellation ends it.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		c, err := k.lookup(lctx, pool, apiKey)
		if err != nil {
			return c, err
		}
		k.mu.Lock()
		if len(k.entries) >= k.max {
			clear(k.entries) // bounded: start again rather than grow
		}
		k.entries[h] = cached{c: c, expires: now.Add(k.ttl)}
		k.mu.Unlock()
		return c, nil
	})
	select {
	case r := <-ch:
		c, _ := r.Val.(Client)
		return c, r.Err
	case <-ctx.Done():
		return Client{}, fmt.Errorf("authenticate: %w", ctx.Err())
	}
}

// lookupTimeout bounds one shared key lookup.
const lookupTimeout = 10 * time.Second
