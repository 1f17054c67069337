package chaos

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// receiver is the clients' webhook endpoint: it verifies every callback's
// Standard Webhooks signature with an independent implementation and keeps,
// per webhook-id, the body it got (a second copy of one id must carry the
// same body: the id is stable per event).
type receiver struct {
	wh  *standardwebhooks.Webhook
	srv *http.Server
	ln  net.Listener

	mu       sync.Mutex
	bodies   map[string][32]byte // webhook-id -> body hash
	orderOf  map[string]string   // webhook-id -> order id
	copies   int
	problems []string
}

func newReceiver(secret string) (*receiver, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{wh: wh, ln: ln, bodies: map[string][32]byte{}, orderOf: map[string]string{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve)}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) url() string { return "http://" + r.ln.Addr().String() + "/hooks" }

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.wh.Verify(body, req.Header); err != nil {
		r.problems = append(r.problems, fmt.Sprintf("webhook %s: signature does not verify: %v", id, err))
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var p struct {
		Data struct {
			OrderID string `json:"order_id"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &p)
	sum := sha256.Sum256(body)
	if prev, ok := r.bodies[id]; ok {
		r.copies++
		if prev != sum {
			r.problems = append(r.problems, fmt.Sprintf("webhook %s came twice with different bodies", id))
		}
	}
	r.bodies[id], r.orderOf[id] = sum, p.Data.OrderID
	w.WriteHeader(http.StatusNoContent)
}

// seen returns the webhook ids received and what was wrong.
func (r *receiver) seen() (map[string]string, int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make(map[string]string, len(r.orderOf))
	for k, v := range r.orderOf {
		ids[k] = v
	}
	return ids, r.copies, append([]string(nil), r.problems...)
}

func (r *receiver) close() { _ = r.srv.Close() }
