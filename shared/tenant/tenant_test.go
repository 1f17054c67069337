package tenant_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"orderpipe/shared/tenant"
	"orderpipe/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestCreateAndAuthenticate(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
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
