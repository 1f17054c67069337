package webhook_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/consumers/webhook"
	"orderpipe/shared/callbackurl"
	"orderpipe/shared/tooling/testenv"
)

// TestSendTimeRuleIsTheIntakeRule: the sender checks callback URLs and
// dial addresses by the intake's rule, whose table of cases is
// shared/callbackurl's test; here, only that the webhook names are that
// rule (same answers, same sentinels).
func TestSendTimeRuleIsTheIntakeRule(t *testing.T) {
	t.Parallel()
	if !errors.Is(webhook.ErrForbiddenURL, callbackurl.ErrForbiddenURL) || !errors.Is(webhook.ErrForbiddenAddress, callbackurl.ErrForbiddenAddress) {
		t.Fatal("the webhook sentinels are not callbackurl's")
	}
	for _, s := range []string{"127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1", "64:ff9b::a00:1", "8.8.8.8", "2606:4700:4700::1111"} {
		a := netip.MustParseAddr(s)
		if got, want := webhook.PublicAddr(a), callbackurl.PublicAddr(a); got != want {
			t.Errorf("PublicAddr(%s) = %v, callbackurl.PublicAddr = %v", s, got, want)
		}
	}
	for _, tc := range []struct {
		url          string
		allowPrivate bool
	}{
		{"https://shop.example/hooks/orders", false},
		{"https://8.8.8.8/h", false},
		{"http://shop.example/h", false},
		{"http://shop.example/h", true},
		{"http://127.0.0.1:9/h", true},
		{"ftp://shop.example/h", true},
		{"https://127.0.0.1/h", false},
		{"https://localhost/h", false},
		{"https://user:pw@shop.example/h", false},
		{"https://%zz/h", false},
	} {
		got, want := webhook.CheckURL(tc.url, tc.allowPrivate), callbackurl.Check(tc.url, tc.allowPrivate)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("CheckURL(%q, %v) = %v, callbackurl.Check = %v", tc.url, tc.allowPrivate, got, want)
		}
	}
}

func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{"https://shop.example/h", "http://127.0.0.1/", "https://[::1]:8/", "https://u@h/", "%"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, allow bool) {
		err := webhook.CheckURL(s, allow)
		if err == nil && !allow && !strings.HasPrefix(s, "https://") && !strings.HasPrefix(strings.ToLower(s), "https:") {
			t.Fatalf("CheckURL(%q) accepted a non-https URL", s)
		}
	})
}

// tlsServer starts an HTTPS server on loopback that counts the TCP
// connections it accepts.
func tlsServer(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	return testenv.CountingServer(t, h, true)
}

func trust(srv *httptest.Server) *tls.Config {
	return srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
}

// TestDialRefusesNonPublicAddresses sends through the strict client,
// bypassing CheckURL, so that only the dial-time hook stands in the way. No
// packet may leave: the live loopback server must see no connection, and
// every other address is refused before connect (nothing listens there and
// nothing is sent).
func TestDialRefusesNonPublicAddresses(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv, conns := tlsServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ps := strconv.Itoa(port)
	client := webhook.NewClient(webhook.ClientOptions{TLSConfig: trust(srv), Timeout: 5 * time.Second})
	t.Cleanup(client.CloseIdleConnections)
	urls := []string{
		"https://127.0.0.1:" + ps + "/h",
		"https://localhost:" + ps + "/h", // a name that resolves to loopback
		"https://[::1]:" + ps + "/h",
		"https://10.0.0.1/h",
		"https://10.255.1.2:8443/h",
		"https://172.16.0.1/h",
		"https://172.31.9.9/h",
		"https://192.168.1.1/h",
		"https://169.254.169.254/latest/meta-data/",
		"https://100.64.0.1/h",
		"https://0.0.0.0:" + ps + "/h",
		"https://[fd00::1]/h",
		"https://[fe80::1]/h",
		"https://[::ffff:127.0.0.1]:" + ps + "/h",
		"https://224.0.0.1/h",
	}
	for _, u := range urls {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader("{}"))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			t.Errorf("POST %s: got %d, want the dial refused", u, resp.StatusCode)
			continue
		}
		if !errors.Is(err, webhook.ErrForbiddenAddress) {
			t.Errorf("POST %s: %v, want ErrForbiddenAddress", u, err)
		}
	}
	if n := conns.Load(); n != 0 || hits.Load() != 0 {
		t.Fatalf("the loopback server saw %d connections and %d requests; want none", n, hits.Load())
	}
}

// TestSendRefusesWithoutAllowFlag goes through Send (CheckURL, then the
// dialer) with the flag off: every private target is refused, permanently.
func TestSendRefusesWithoutAllowFlag(t *testing.T) {
	t.Parallel()
	srv, conns := tlsServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	client := webhook.NewClient(webhook.ClientOptions{TLSConfig: trust(srv)})
	t.Cleanup(client.CloseIdleConnections)
	for _, u := range []string{
		srv.URL + "/h", // https://127.0.0.1:port
		strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/h",
		"http://8.8.8.8/h", // http is refused before any dial
		"https://192.168.0.10/h",
		// The intake's rule (callbackurl.Check) is the sender's: these are
		// refused before any lookup or dial, permanently.
		"https://100.64.0.1/h", "https://192.0.2.1/h", "https://[64:ff9b::7f00:1]/h", "https://[2002:7f00:1::]/h",
		"https://[fe80::1%25eth0]/h", "https://0x7f000001/h", "https://2130706433/h", "https://017700000001/h",
		strings.Replace(srv.URL, "127.0.0.1", "127.1", 1) + "/h",
	} {
		r := webhook.Send(t.Context(), client, false, delivery(u), secret(t))
		if r.Err == nil || !r.Permanent {
			t.Errorf("Send(%s) = %+v, want a permanent refusal", u, r)
		}
	}
	if conns.Load() != 0 {
		t.Fatalf("server saw %d connections", conns.Load())
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	var targetHits atomic.Int64
	target, _ := tlsServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { targetHits.Add(1) }))
	// The first hop is a loopback server standing in for a public host
	// (the allow flag lets the test reach it); its redirect must not be
	// followed, whatever the target.
	redirector, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/internal", http.StatusTemporaryRedirect)
	}))
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(redirector)})
	t.Cleanup(client.CloseIdleConnections)
	r := webhook.Send(t.Context(), client, true, delivery(redirector.URL+"/hook"), secret(t))
	if r.StatusCode != http.StatusTemporaryRedirect || r.Err == nil || r.Permanent {
		t.Fatalf("Send = %+v, want a 307 counted as a failed attempt", r)
	}
	if targetHits.Load() != 0 {
		t.Fatal("the redirect was followed")
	}
	// The strict client (flag off) follows no redirect either.
	strict := webhook.NewClient(webhook.ClientOptions{})
	if strict.CheckRedirect == nil || !errors.Is(strict.CheckRedirect(nil, nil), http.ErrUseLastResponse) {
		t.Fatal("the strict client would follow redirects")
	}
}

func TestResponsesAreTimeAndSizeBounded(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before slow.Close
	big, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 1000 { // 64 MiB unless the client hangs up
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	client := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(slow), Timeout: 300 * time.Millisecond})
	t.Cleanup(client.CloseIdleConnections)
	start := time.Now()
	r := webhook.Send(t.Context(), client, true, delivery(slow.URL), secret(t))
	if r.Err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("slow receiver: %+v after %s", r, time.Since(start))
	}
	client2 := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true, TLSConfig: trust(big), Timeout: 10 * time.Second})
	t.Cleanup(client2.CloseIdleConnections)
	r = webhook.Send(t.Context(), client2, true, delivery(big.URL), secret(t))
	if r.StatusCode != 200 || r.Err != nil {
		t.Fatalf("big answer: %+v (the body is read up to the bound and dropped)", r)
	}
}

func delivery(url string) webhook.Delivery {
	id := uuid.New()
	return webhook.Delivery{WebhookID: webhook.ID(id, 1), OrderID: id, Seq: 1, URL: url, Payload: []byte(`{"type":"order.status_changed"}`)}
}

// TestConcurrentSendsToOneHostReuseTheirConnections: many clients may
// share one receiver (a platform's endpoint), and the webhook workers send
// to it at once. Each round of concurrent sends must find the connections
// of the round before idle, not dial (and shake TLS hands) again because
// the client keeps only a few per host.
func TestConcurrentSendsToOneHostReuseTheirConnections(t *testing.T) {
	t.Parallel()
	const senders, rounds = 16, 5
	hs, opened := testenv.CountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), false)
	c := webhook.NewClient(webhook.ClientOptions{AllowPrivate: true})
	testenv.ConcurrentRounds(t, rounds, senders, func(int, int) error {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL, strings.NewReader("{}"))
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
	if n := opened.Load(); n > 2*senders {
		t.Fatalf("%d rounds of %d concurrent sends to one host opened %d connections; want at most %d", rounds, senders, n, 2*senders)
	}
	t.Logf("%d sends over %d connections", rounds*senders, opened.Load())
}
