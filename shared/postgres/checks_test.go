package postgres_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"orderpipe/shared/idemtoken"
	"orderpipe/shared/order"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// checkedStrings returns the boundary cases of a rule's strings plus n
// random strings of prefix and a tail over alphabet (which mixes allowed
// and refused characters) of 0 to maxLen+3 characters, each string once.
func checkedStrings(seed uint64, prefix, alphabet string, maxLen, n int, cases ...string) []string {
	r := rand.New(rand.NewPCG(seed, 1))
	runes := []rune(alphabet)
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, c := range cases {
		add(c)
	}
	for range n {
		var b strings.Builder
		b.WriteString(prefix)
		for range r.IntN(maxLen + 4) {
			b.WriteRune(runes[r.IntN(len(runes))])
		}
		add(b.String())
	}
	return out
}

// agree inserts each of values with insert and fails unless PostgreSQL
// refuses exactly the values that valid refuses, through the CHECK named
// constraint.
func agree(t *testing.T, constraint string, values []string, valid func(string) bool, insert func(string) error) {
	t.Helper()
	for _, v := range values {
		err := insert(v)
		var pgErr *pgconn.PgError
		refused := errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == constraint
		if err != nil && !refused {
			t.Fatalf("%q: %v", v, err)
		}
		if refused == valid(v) {
			t.Errorf("%q: the validator says valid=%t, PostgreSQL's %s refused=%t", v, valid(v), constraint, refused)
		}
	}
}

// The schema's CHECKs on request_id and on idempotency tokens are the
// validators' rules (shared/order, shared/idemtoken), written for
// PostgreSQL's regular expression engine without bounded repetitions
// (migration 00014): the same strings pass and fail in both.
func TestChecksAreTheValidatorsRules(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := testenv.DB(t)
	c, err := tenant.Create(ctx, db.Pool, "shop")
	if err != nil {
		t.Fatal(err)
	}

	long := strings.Repeat("a", order.MaxRequestIDLen)
	requestIDs := checkedStrings(1, "", "aZ09._:-/ é\n", order.MaxRequestIDLen, 400,
		"", "a", long, long+"a", long[1:]+"é", "ORD20261202143022a3f9c1", "x:y.z_w-1", "a b", "a\n", "\na", "ä", "a/b")
	agree(t, "orders_request_id_check", requestIDs,
		func(s string) bool { return order.ValidateRequestID(s) == nil },
		func(rid string) error {
			_, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
				VALUES (gen_random_uuid(), gen_random_uuid()::text, $1, $2, '\x00', 'processing', 1, '[]', 1, 'CNY')`, c.ClientID, rid)
			return err
		})

	hex48 := strings.Repeat("0123456789abcdef", 3)
	tokens := checkedStrings(2, idemtoken.Prefix, "0af9gA.", 48, 200,
		idemtoken.Prefix+hex48, idemtoken.Prefix+hex48[1:], idemtoken.Prefix+hex48+"0", idemtoken.Prefix+strings.ToUpper(hex48),
		"opt2."+hex48, "opt1x"+hex48, idemtoken.Prefix+hex48[1:]+"\n", "", idemtoken.Prefix)
	agree(t, "idempotency_tokens_token_check", tokens, idemtoken.Valid, func(tok string) error {
		_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_tokens (token, client_id, expires_at) VALUES ($1, $2, now() + interval '1 hour')`, tok, c.ClientID)
		return err
	})
}
