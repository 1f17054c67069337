package tenant_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestCreateAndAuthenticate(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	c, err := tenant.Create(ctx, db.Pool, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.APIKey, "opk_") || !strings.HasPrefix(c.WebhookSecret, "whsec_") {
		t.Fatalf("credentials: %+v", c)
	}
	got, err := tenant.Authenticate(ctx, db.Pool, c.APIKey)
	if err != nil || got.ID != c.ClientID {
		t.Fatalf("Authenticate: %v %v", got, err)
	}
	var stored int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM api_clients WHERE api_key_hash::text LIKE '%' || $1 || '%'`, c.APIKey).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("plain key stored: %d %v", stored, err)
	}
	for _, bad := range []string{"", "opk_", "opk_nope", "Bearer x", strings.Repeat("opk_a", 100), c.APIKey + "x"} {
		if _, err := tenant.Authenticate(ctx, db.Pool, bad); !errors.Is(err, tenant.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v", bad, err)
		}
	}
	for _, bad := range []string{"", "  ", strings.Repeat("x", 201), "a\nb"} {
		if _, err := tenant.Create(ctx, db.Pool, bad); err == nil {
			t.Errorf("Create(%q) accepted", bad)
		}
	}
}

// TestKeyCache: a known key is looked up once per TTL; an unknown or
// malformed key is refused every time and never remembered.
func TestKeyCache(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	c, err := tenant.Create(t.Context(), db.Pool, "cached")
	if err != nil {
		t.Fatal(err)
	}
	k := tenant.NewKeyCache(time.Hour, 10)
	for range 3 {
		got, err := k.Authenticate(t.Context(), db.Pool, c.APIKey)
		if err != nil || got.ID != c.ClientID {
			t.Fatalf("authenticate: %+v, %v", got, err)
		}
	}
	// The row is gone, the cached key still answers within its TTL.
	if _, err := db.Pool.Exec(t.Context(), `DELETE FROM api_clients WHERE client_id = $1`, c.ClientID); err != nil {
		t.Fatal(err)
	}
	if got, err := k.Authenticate(t.Context(), db.Pool, c.APIKey); err != nil || got.ID != c.ClientID {
		t.Fatalf("cached key: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "nope", tenant.APIKeyPrefix + "unknown", strings.Repeat("k", 300)} {
		if _, err := k.Authenticate(t.Context(), db.Pool, bad); !errors.Is(err, tenant.ErrUnauthenticated) {
			t.Errorf("key %q: %v, want unauthenticated", bad, err)
		}
	}
	fresh := tenant.NewKeyCache(time.Hour, 10)
	if _, err := fresh.Authenticate(t.Context(), db.Pool, c.APIKey); !errors.Is(err, tenant.ErrUnauthenticated) {
		t.Fatalf("a deleted key through a fresh cache: %v", err)
	}
}
