package psp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"orderpipe/shared/config"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type setup struct {
	db *testenv.Database
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	return &setup{db: testenv.DB(t)}
}

// serve starts a stand-in with opts on the test's database.
func (s *setup) serve(t *testing.T, opts pspserver.Options) string {
	t.Helper()
	return testenv.ServePSP(t, s.db.Pool, opts)
}

// client is a provider client, with a one-second timeout, of a stand-in
// with opts.
func (s *setup) client(t *testing.T, opts pspserver.Options) *psp.Client {
	t.Helper()
	return psp.NewClient(s.serve(t, opts), time.Second)
}

// newClient is newSetup and a client of a stand-in with opts on it.
func newClient(t *testing.T, opts pspserver.Options) (*setup, *psp.Client) {
	t.Helper()
	s := newSetup(t)
	return s, s.client(t, opts)
}

func (s *setup) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := s.db.Pool.QueryRow(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestChargeRepeatReturnsFirstAnswer(t *testing.T) {
	t.Parallel()
	s, c := newClient(t, pspserver.Options{})
	ctx := t.Context()
	a, err := c.Charge(ctx, "charge:o1", "39.98", "CNY", "o1")
	if err != nil || a.Status != psp.StatusSucceeded || a.ID == "" {
		t.Fatalf("charge = %+v, %v", a, err)
	}
	b, err := c.Charge(ctx, "charge:o1", "39.98", "CNY", "o1")
	if err != nil || b != a {
		t.Fatalf("repeat = %+v, %v; want %+v", b, err, a)
	}
	// "39.980" is not the same request; "39.98" written as "39.98" is.
	_, err = c.Charge(ctx, "charge:o1", "40.00", "CNY", "o1")
	var pe *psp.Error
	if !errors.As(err, &pe) || pe.Transient || pe.HTTPStatus != http.StatusUnprocessableEntity {
		t.Fatalf("reused key with another body: %v, want permanent 422", err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges WHERE state = 'succeeded'`); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestDeclineIsAnAnswer(t *testing.T) {
	t.Parallel()
	s, c := newClient(t, pspserver.Options{DeclineRate: 1})
	a, err := c.Charge(t.Context(), "k-decline", "1.00", "EUR", "o2")
	if err != nil || a.Status != psp.StatusDeclined || a.Reason == "" {
		t.Fatalf("charge = %+v, %v; want declined with a reason", a, err)
	}
	// A declined charge stays declined for its key, even on a healthy provider.
	c2 := s.client(t, pspserver.Options{})
	b, err := c2.Charge(t.Context(), "k-decline", "1.00", "EUR", "o2")
	if err != nil || b != a {
		t.Fatalf("repeat = %+v, %v; want %+v", b, err, a)
	}
}

func TestErrorIsTransientAndChargesNothing(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	bad := s.client(t, pspserver.Options{ErrorRate: 1})
	_, err := bad.Charge(t.Context(), "k-err", "5.00", "USD", "o3")
	if !psp.IsTransient(err) {
		t.Fatalf("err = %v, want transient", err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges`); n != 0 {
		t.Fatalf("%d charges after an error, want 0", n)
	}
	good := s.client(t, pspserver.Options{})
	if a, err := good.Charge(t.Context(), "k-err", "5.00", "USD", "o3"); err != nil || a.Status != psp.StatusSucceeded {
		t.Fatalf("retry = %+v, %v", a, err)
	}
	if _, err := bad.Refund(t.Context(), "r-err", "ch_x"); !psp.IsTransient(err) && !isStatus(err, http.StatusNotFound) {
		t.Fatalf("refund on a failing provider: %v", err)
	}
}

func isStatus(err error, code int) bool {
	var pe *psp.Error
	return errors.As(err, &pe) && pe.HTTPStatus == code
}

func TestChargeThenTimeout(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := psp.NewClient(s.serve(t, pspserver.Options{TimeoutRate: 1, Hang: 10 * time.Second}), 200*time.Millisecond)
	t0 := time.Now()
	_, err := c.Charge(t.Context(), "k-timeout", "7.50", "GBP", "o4")
	if !psp.IsTransient(err) {
		t.Fatalf("err = %v, want transient (timeout)", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("the client waited %s, want about its timeout", d)
	}
	// The provider charged: a retry with the same key learns it.
	a, err := c.Charge(t.Context(), "k-timeout", "7.50", "GBP", "o4")
	if err != nil || a.Status != psp.StatusSucceeded {
		t.Fatalf("retry = %+v, %v; want the first answer (succeeded)", a, err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges WHERE reference = 'o4'`); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestInFlightKeyGets409(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := psp.NewClient(s.serve(t, pspserver.Options{Latency: 400 * time.Millisecond}), 5*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	answers := make([]psp.Answer, 2)
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		close(started)
		answers[0], errs[0] = c.Charge(t.Context(), "k-flight", "2.00", "CNY", "o5")
	}()
	<-started
	testenv.WaitFor(t, 5*time.Second, "the first charge to be in flight", func() bool {
		return s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'k-flight'`) == 1
	})
	answers[1], errs[1] = c.Charge(t.Context(), "k-flight", "2.00", "CNY", "o5")
	wg.Wait()
	if errs[0] != nil || answers[0].Status != psp.StatusSucceeded {
		t.Fatalf("first = %+v, %v", answers[0], errs[0])
	}
	if !psp.IsTransient(errs[1]) || !isStatus(errs[1], http.StatusConflict) {
		t.Fatalf("concurrent repeat = %+v, %v; want transient 409", answers[1], errs[1])
	}
}

// TestVoid: a void resolves a key without ever charging. A key never seen
// is voided and dead (a later charge gets 410 and charges nothing); a key
// already decided answers its stored outcome and voids nothing; a key in
// flight answers 409.
func TestVoid(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := psp.NewClient(s.serve(t, pspserver.Options{}), 5*time.Second)
	ctx := t.Context()
	for range 2 {
		a, err := c.Void(ctx, "charge:v1", "v1")
		if err != nil || a.Status != psp.StatusVoided || a.ID != "" {
			t.Fatalf("void of an unseen key = %+v, %v; want voided", a, err)
		}
	}
	_, err := c.Charge(ctx, "charge:v1", "3.00", "CNY", "v1")
	if !psp.IsVoided(err) || psp.IsTransient(err) {
		t.Fatalf("charge with a voided key: %v, want permanent 410", err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges WHERE state IN ('succeeded', 'declined', 'in_flight')`); n != 0 {
		t.Fatalf("%d charges after a void, want 0", n)
	}

	charged, err := c.Charge(ctx, "charge:v2", "3.00", "CNY", "v2")
	if err != nil {
		t.Fatal(err)
	}
	if a, err := c.Void(ctx, "charge:v2", "v2"); err != nil || a != charged {
		t.Fatalf("void of a charged key = %+v, %v; want its charge %+v", a, err, charged)
	}
	if again, err := c.Charge(ctx, "charge:v2", "3.00", "CNY", "v2"); err != nil || again != charged {
		t.Fatalf("the charge after a void of a charged key = %+v, %v; want it unchanged", again, err)
	}

	declining := psp.NewClient(s.serve(t, pspserver.Options{DeclineRate: 1}), 5*time.Second)
	declined, err := declining.Charge(ctx, "charge:v3", "3.00", "CNY", "v3")
	if err != nil || declined.Status != psp.StatusDeclined {
		t.Fatal(declined, err)
	}
	if a, err := c.Void(ctx, "charge:v3", "v3"); err != nil || a != declined {
		t.Fatalf("void of a declined key = %+v, %v; want %+v", a, err, declined)
	}

	slow := psp.NewClient(s.serve(t, pspserver.Options{Latency: 2 * time.Second}), 5*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := slow.Charge(context.WithoutCancel(ctx), "charge:v4", "3.00", "CNY", "v4")
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the charge in flight", func() bool {
		return s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'charge:v4' AND state = 'in_flight'`) == 1
	})
	_, err = c.Void(ctx, "charge:v4", "v4")
	if !psp.IsTransient(err) || !isStatus(err, http.StatusConflict) {
		t.Fatalf("void of a key in flight: %v, want transient 409", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	failing := psp.NewClient(s.serve(t, pspserver.Options{ErrorRate: 1}), 5*time.Second)
	if _, err := failing.Void(ctx, "charge:v5", "v5"); !psp.IsTransient(err) {
		t.Fatalf("void on a failing provider: %v, want transient", err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'charge:v5'`); n != 0 {
		t.Fatal("a failed void stored the key")
	}
}

func TestRefund(t *testing.T) {
	t.Parallel()
	s, c := newClient(t, pspserver.Options{})
	ctx := t.Context()
	ch, err := c.Charge(ctx, "charge:o6", "9.99", "CNY", "o6")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := c.Refund(ctx, "refund:o6", ch.ID)
	if err != nil || r1.Status != psp.StatusSucceeded {
		t.Fatalf("refund = %+v, %v", r1, err)
	}
	r2, err := c.Refund(ctx, "refund:o6", ch.ID)
	if err != nil || r2 != r1 {
		t.Fatalf("repeat = %+v, %v; want %+v", r2, err, r1)
	}
	if _, err := c.Refund(ctx, "refund:other", ch.ID); !isStatus(err, http.StatusUnprocessableEntity) || psp.IsTransient(err) {
		t.Fatalf("second refund under another key: %v, want permanent 422", err)
	}
	if _, err := c.Refund(ctx, "refund:nope", "ch_unknown"); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("refund of an unknown charge: %v, want 404", err)
	}
	dc := s.client(t, pspserver.Options{DeclineRate: 1})
	d, err := dc.Charge(ctx, "charge:o7", "1.00", "CNY", "o7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refund(ctx, "refund:o7", d.ID); !isStatus(err, http.StatusUnprocessableEntity) {
		t.Fatalf("refund of a declined charge: %v, want 422", err)
	}
	if n := s.count(t, `SELECT count(*) FROM psp_refunds`); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	url := s.serve(t, pspserver.Options{})
	long := strings.Repeat("k", 256)
	cases := []struct {
		name, path, key, body string
		want                  int
	}{
		{"no key", "/v1/charges", "", `{"amount":"1.00","currency":"CNY","reference":"r"}`, 400},
		{"key too long", "/v1/charges", long, `{"amount":"1.00","currency":"CNY","reference":"r"}`, 400},
		{"key with space", "/v1/charges", "a b", `{"amount":"1.00","currency":"CNY","reference":"r"}`, 400},
		{"not json", "/v1/charges", "k1", `amount=1`, 400},
		{"empty body", "/v1/charges", "k2", ``, 400},
		{"unknown field", "/v1/charges", "k3", `{"amount":"1.00","currency":"CNY","reference":"r","x":1}`, 400},
		{"number amount", "/v1/charges", "k4", `{"amount":1.00,"currency":"CNY","reference":"r"}`, 400},
		{"zero amount", "/v1/charges", "k5", `{"amount":"0.00","currency":"CNY","reference":"r"}`, 400},
		{"negative amount", "/v1/charges", "k6", `{"amount":"-1","currency":"CNY","reference":"r"}`, 400},
		{"three decimals", "/v1/charges", "k7", `{"amount":"1.001","currency":"CNY","reference":"r"}`, 400},
		{"exponent", "/v1/charges", "k8", `{"amount":"1e3","currency":"CNY","reference":"r"}`, 400},
		{"bad currency", "/v1/charges", "k9", `{"amount":"1.00","currency":"cny","reference":"r"}`, 400},
		{"no reference", "/v1/charges", "k10", `{"amount":"1.00","currency":"CNY"}`, 400},
		{"trailing data", "/v1/charges", "k11", `{"amount":"1.00","currency":"CNY","reference":"r"} {}`, 400},
		{"huge body", "/v1/charges", "k12", `{"amount":"1.00","currency":"CNY","reference":"` + strings.Repeat("r", 20000) + `"}`, 400},
		{"refund no charge", "/v1/refunds", "k13", `{}`, 400},
		{"refund bad json", "/v1/refunds", "k14", `{"charge_id":`, 400},
		{"wrong method path", "/v1/charges/x", "k15", `{}`, 404},
		{"void no key", "/v1/charges/void", "", `{"reference":"r"}`, 400},
		{"void no reference", "/v1/charges/void", "k16", `{}`, 400},
		{"void bad json", "/v1/charges/void", "k17", `{"reference":`, 400},
		{"void unknown field", "/v1/charges/void", "k18", `{"reference":"r","amount":"1.00"}`, 400},
		{"void reference with newline", "/v1/charges/void", "k19", `{"reference":"a\nb"}`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, url+tc.path, bytes.NewReader([]byte(tc.body)))
			if tc.key != "" {
				req.Header.Set(psp.HeaderIdempotencyKey, tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tc.want)
			}
		})
	}
	if n := s.count(t, `SELECT count(*) FROM psp_charges`); n != 0 {
		t.Fatalf("malformed requests left %d charges", n)
	}
}

func TestParseAmount(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"39.98": 3998, "39.9": 3990, "39": 3900, "0.01": 1, "000123.40": 12340} {
		if got, err := psp.ParseAmount(in); err != nil || got != want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0.00", "-1", "+1", "1.", ".5", "1.234", "1e2", "NaN", " 1", "1 ", "1234567890123456", "１"} {
		if _, err := psp.ParseAmount(in); !errors.Is(err, psp.ErrInvalid) {
			t.Errorf("ParseAmount(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestCommandRefusesBadFlags(t *testing.T) {
	t.Parallel()
	testenv.WantUsageErrors(t, pspserver.Command(), config.Config{},
		[]string{"--decline-rate", "1.5"},
		[]string{"--error-rate", "-0.1"},
		[]string{"--timeout-rate", "NaN"},
		[]string{"--decline-rate", "0.6", "--error-rate", "0.6"},
		[]string{"--latency", "-1s"},
		[]string{"--hang", "-1s"},
		[]string{"--hang", "0"},
		[]string{"--in-flight-timeout", "0s"},
		[]string{"--in-flight-timeout", "-1s"},
		[]string{"--hang", "1s", "--hang", "2s"},
		[]string{"--addr", "nonsense"},
		[]string{"extra-argument"},
	)
	// Every flag is in the usage line.
	cmd := pspserver.Command()
	fs := flag.NewFlagSet("psp", flag.ContinueOnError)
	cmd.Setup(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(cmd.Usage, "[--"+f.Name+" ") {
			t.Errorf("the usage line %q lacks --%s", cmd.Usage, f.Name)
		}
	})
	for _, args := range [][]string{{"--latency", "soon"}, {"--seed", "-1"}, {"--nope"}} {
		cmd := pspserver.Command()
		fs := flag.NewFlagSet("psp", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cmd.Setup(fs)
		if err := fs.Parse(args); err == nil {
			t.Errorf("psp %v parsed, want a flag error", args)
		}
	}
}

func TestClientWithoutProvider(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"x","status":"declined"}`)) // status does not match the code
	}))
	defer hs.Close()
	c := psp.NewClient(hs.URL, time.Second)
	if _, err := c.Charge(t.Context(), "k", "1.00", "CNY", "r"); !psp.IsTransient(err) {
		t.Fatalf("inconsistent answer: %v, want transient", err)
	}
	hs.Close()
	if _, err := c.Charge(t.Context(), "k", "1.00", "CNY", "r"); !psp.IsTransient(err) {
		t.Fatalf("no server: %v, want transient", err)
	}
	if _, err := c.Charge(t.Context(), "bad key", "1.00", "CNY", "r"); err == nil || psp.IsTransient(err) {
		t.Fatalf("bad key: %v, want permanent", err)
	}
}

// TestARefundIsNeverDeclined: 402 with a declined status is a charge's
// answer. To a refund it is a refusal, never an outcome: taken as one, the
// payment was recorded refunded while the money stayed charged.
func TestARefundIsNeverDeclined(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusPaymentRequired)
		_, _ = w.Write([]byte(`{"id":"re_1","status":"declined"}`))
	}))
	defer hs.Close()
	c := psp.NewClient(hs.URL, time.Second)
	if a, err := c.Refund(t.Context(), "refund:x", "ch_1"); err == nil {
		t.Fatalf("a refund answered 402 declined: %+v, no error; want a refusal", a)
	}
	if a, err := c.Charge(t.Context(), "charge:x", "1.00", "CNY", "r"); err != nil || a.Status != psp.StatusDeclined {
		t.Fatalf("a charge answered 402 declined: %+v, %v; want the decline as an answer", a, err)
	}
}

func FuzzDecodeCharge(f *testing.F) {
	for _, s := range []string{
		`{"amount":"39.98","currency":"CNY","reference":"0190"}`,
		`{"amount":"1","currency":"EUR","reference":"x"}`,
		`{"amount":1,"currency":"EUR","reference":"x"}`,
		`{}`, `[]`, `null`, `{"amount":"1.001"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := psp.DecodeCharge(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, psp.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		cents, err := psp.ParseAmount(req.Amount)
		if err != nil || cents <= 0 || psp.FormatAmount(cents) != req.Amount {
			t.Fatalf("accepted amount %q does not round-trip: %d, %v", req.Amount, cents, err)
		}
		if len(req.Currency) != 3 || req.Reference == "" {
			t.Fatalf("accepted %+v", req)
		}
	})
}

// TestClientFromEnv is not parallel: it sets an environment variable.
func TestClientFromEnv(t *testing.T) {
	if _, err := psp.ClientFromEnv(config.Config{}); err == nil {
		t.Error("no PSP_URL accepted")
	}
	t.Setenv(psp.EnvTimeout.Name, "250ms")
	c, err := psp.ClientFromEnv(config.Config{PSPURL: "http://127.0.0.1:1/"})
	if err != nil || c.Timeout != 250*time.Millisecond || c.BaseURL != "http://127.0.0.1:1" {
		t.Fatalf("client = %+v, %v", c, err)
	}
	for _, bad := range []string{"soon", "-1s", "0"} {
		t.Setenv(psp.EnvTimeout.Name, bad)
		if _, err := psp.ClientFromEnv(config.Config{PSPURL: "http://x"}); err == nil {
			t.Errorf("%s=%q accepted", psp.EnvTimeout.Name, bad)
		}
	}
}

// TestConcurrentCallsReuseTheirConnections: the payment step calls the
// provider from every worker at once. Each round of concurrent calls must
// find the connections of the round before idle, not dial new ones (and,
// with a provider over TLS, shake hands again) because the client keeps
// only a couple of them.
func TestConcurrentCallsReuseTheirConnections(t *testing.T) {
	t.Parallel()
	const callers, rounds = 64, 5
	hs, opened := testenv.CountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}), false)
	c := psp.NewClient(hs.URL, 5*time.Second)
	testenv.ConcurrentRounds(t, rounds, callers, func(r, i int) error {
		_, err := c.Charge(t.Context(), fmt.Sprintf("charge:%d:%d", r, i), "1.00", "CNY", "r")
		return err
	})
	// At most one connection per concurrent caller, with room for a round
	// that starts before the last one's connections are back in the pool.
	if n := opened.Load(); n > 2*callers {
		t.Fatalf("%d rounds of %d concurrent calls opened %d connections; want at most %d", rounds, callers, n, 2*callers)
	}
	t.Logf("%d calls over %d connections", rounds*callers, opened.Load())
}

// TestAChargeWithoutLatencyIsWrittenOnce: with no latency nothing is in
// flight for a repeat to see, so the stand-in records a charge decided, in
// one statement, instead of recording it in flight and then deciding it
// (two commits per charge on the pipeline's PostgreSQL in every end-to-end
// benchmark). With latency, and for a key abandoned in flight that it
// takes over, the charge goes through in flight as before.
func TestAChargeWithoutLatencyIsWrittenOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := t.Context()
	decidedAtOnce := func(key string) bool {
		t.Helper()
		return s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = $1 AND completed_at = created_at`, key) == 1
	}
	for _, tc := range []struct {
		opts  pspserver.Options
		key   string
		state string
	}{
		{pspserver.Options{}, "k-once-ok", psp.StatusSucceeded},
		{pspserver.Options{DeclineRate: 1}, "k-once-declined", psp.StatusDeclined},
	} {
		a, err := s.client(t, tc.opts).Charge(ctx, tc.key, "3.00", "CNY", tc.key)
		if err != nil || a.Status != tc.state {
			t.Fatalf("%s: %+v, %v; want %s", tc.key, a, err, tc.state)
		}
		if !decidedAtOnce(tc.key) {
			t.Fatalf("%s: the charge was not decided in the statement that recorded it", tc.key)
		}
	}
	timedOut := psp.NewClient(s.serve(t, pspserver.Options{TimeoutRate: 1, Hang: time.Second}), 100*time.Millisecond)
	if _, err := timedOut.Charge(ctx, "k-once-timeout", "3.00", "CNY", "r"); !psp.IsTransient(err) {
		t.Fatalf("charge then time out: %v, want transient", err)
	}
	if s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'k-once-timeout' AND state = 'succeeded'`) != 1 || !decidedAtOnce("k-once-timeout") {
		t.Fatal("a charge that then timed out was not recorded charged at once")
	}

	// With latency the key is in flight meanwhile (a repeat gets 409).
	slow := s.client(t, pspserver.Options{Latency: 50 * time.Millisecond})
	if a, err := slow.Charge(ctx, "k-once-slow", "3.00", "CNY", "r"); err != nil || a.Status != psp.StatusSucceeded {
		t.Fatalf("slow charge: %+v, %v", a, err)
	}
	if s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'k-once-slow' AND completed_at >= created_at + interval '50 milliseconds'`) != 1 {
		t.Fatal("a charge with latency was decided before its latency passed")
	}

	// A key left in flight by a stand-in that died is taken over and decided.
	fp := sha256.Sum256([]byte("charge\x003.00\x00CNY\x00r\x00"))
	if _, err := s.db.Pool.Exec(ctx, `
		INSERT INTO psp_charges (idempotency_key, fingerprint, state, charge_id, amount, currency, reference, created_at)
		VALUES ('k-once-stale', $1, 'in_flight', 'ch_stale', 3.00, 'CNY', 'r', now() - interval '1 hour')`, fp[:]); err != nil {
		t.Fatal(err)
	}
	a, err := s.client(t, pspserver.Options{}).Charge(ctx, "k-once-stale", "3.00", "CNY", "r")
	if err != nil || a.Status != psp.StatusSucceeded || a.ID != "ch_stale" {
		t.Fatalf("charge of an abandoned key: %+v, %v; want ch_stale succeeded", a, err)
	}
	if s.count(t, `SELECT count(*) FROM psp_charges WHERE idempotency_key = 'k-once-stale' AND state = 'succeeded' AND completed_at IS NOT NULL`) != 1 {
		t.Fatal("the abandoned key was not decided")
	}
}
