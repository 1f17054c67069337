package orderstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/producer/problem"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
)

// Pattern is the route of the stream, for http.ServeMux.
const Pattern = "GET /v1/orders/{order_id}/events"

// Defaults of Handler.
const (
	DefaultKeepAlive = 15 * time.Second
	DefaultRecheck   = 5 * time.Second
)

// Event is the data of one stream event (one status change).
type Event struct {
	OrderID    uuid.UUID    `json:"order_id"`
	Seq        int          `json:"seq"`
	Status     order.Status `json:"status"`
	Reason     string       `json:"reason,omitempty"`
	OccurredAt time.Time    `json:"occurred_at"`
}

// Handler serves the stream. Mount it behind the intake's authentication.
type Handler struct {
	// Pool reads orders and their history.
	Pool *pgxpool.Pool
	// Hub wakes the stream when a change of its order commits.
	Hub *Hub
	// ClientID returns the authenticated client of a request.
	ClientID func(*http.Request) (uuid.UUID, bool)
	// Logger for failures.
	Logger *slog.Logger
	// KeepAlive is the interval of comment lines on an idle stream;
	// default 15s.
	KeepAlive time.Duration
	// Recheck is the interval of the safety-net re-read; default 5s.
	Recheck time.Duration
	// Timeout bounds each database read; default 5s.
	Timeout time.Duration
}

// ErrBadLastEventID is returned (as an invalid-input problem) for a
// Last-Event-ID header that is not a sequence number.
var ErrBadLastEventID = errors.New("the Last-Event-ID header must be a sequence number (a non-negative integer) sent by this stream")

// ParseLastEventID reads the Last-Event-ID header: empty means from the
// start (0); otherwise a decimal integer 0 … 2^31-1 without sign or
// leading zeros.
func ParseLastEventID(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != s || n > math.MaxInt32 {
		return 0, ErrBadLastEventID
	}
	return int(n), nil
}

func (h *Handler) writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	p := problem.From(err)
	if p.Code.Retryable() && h.Logger != nil {
		h.Logger.Warn("order stream failed", slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	p.Instance = r.URL.Path
	problem.Write(w, p)
}

// ServeHTTP streams one order's status changes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	keepAlive, recheck, timeout := h.KeepAlive, h.Recheck, h.Timeout
	if keepAlive <= 0 {
		keepAlive = DefaultKeepAlive
	}
	if recheck <= 0 {
		recheck = DefaultRecheck
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	clientID, ok := h.ClientID(r)
	if !ok {
		h.writeProblem(w, r, problem.New(problem.Unauthenticated, "send Authorization: Bearer <api key>"))
		return
	}
	orderID, err := uuid.Parse(r.PathValue("order_id"))
	if err != nil {
		h.writeProblem(w, r, problem.New(problem.NotFound, "no such order (order ids are UUIDs)"))
		return
	}
	last, err := ParseLastEventID(r.Header.Get("Last-Event-ID"))
	if err != nil || len(r.Header.Values("Last-Event-ID")) > 1 {
		h.writeProblem(w, r, &order.ValidationError{Fields: []order.FieldError{{Field: "Last-Event-ID", Message: ErrBadLastEventID.Error()}}})
		return
	}
	ctx := r.Context()
	// Subscribe before the first read, so that no change can fall between.
	wake, cancel := h.Hub.Subscribe(orderID)
	defer cancel()
	qctx, qcancel := context.WithTimeout(ctx, timeout)
	_, err = orderstore.Get(qctx, h.Pool, clientID, orderID)
	var ended bool
	if err == nil {
		ended, err = h.endedBy(qctx, orderID, last)
	}
	qcancel()
	if errors.Is(err, orderstore.ErrNotFound) {
		h.writeProblem(w, r, problem.New(problem.NotFound, "no such order"))
		return
	}
	if err != nil {
		h.writeProblem(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if ended {
		// Resumed after the terminal change: nothing will follow. 204 is
		// what tells an EventSource to stop reconnecting.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, "retry: 2000\n\n"); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		return
	}
	ka := time.NewTicker(keepAlive)
	defer ka.Stop()
	re := time.NewTicker(recheck)
	defer re.Stop()
	for {
		qctx, qcancel := context.WithTimeout(ctx, timeout)
		evs, err := h.after(qctx, orderID, last)
		qcancel()
		if err != nil {
			if ctx.Err() == nil && h.Logger != nil {
				h.Logger.Warn("read order events", slog.String("order_id", orderID.String()), slog.Any("error", err))
			}
			// The stream stays open; the next wake-up or recheck reads again.
		}
		for _, ev := range evs {
			b, _ := json.Marshal(ev)
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", ev.Seq, b); err != nil {
				return
			}
			last = ev.Seq
			if ev.Status.Terminal() {
				_ = rc.Flush()
				return
			}
		}
		if len(evs) > 0 {
			if err := rc.Flush(); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-h.Hub.Done():
			return // shutting down: the client reconnects to another replica
		case <-wake:
		case <-re.C:
		case <-ka.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			continue // no re-read needed for a keep-alive
		}
	}
}

// endedBy reports whether the client has already seen the terminal change
// (its Last-Event-ID is at or after it).
func (h *Handler) endedBy(ctx context.Context, orderID uuid.UUID, last int) (bool, error) {
	if last == 0 {
		return false, nil
	}
	var ended bool
	err := h.Pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM order_events
		WHERE order_id = $1 AND seq <= $2 AND status IN ('confirmed', 'rejected', 'cancelled'))`, orderID, last).Scan(&ended)
	if err != nil {
		return false, fmt.Errorf("read history of order %s: %w", orderID, err)
	}
	return ended, nil
}

// after reads the changes of an order after seq, in order.
func (h *Handler) after(ctx context.Context, orderID uuid.UUID, seq int) ([]Event, error) {
	rows, err := h.Pool.Query(ctx, `
		SELECT seq, status, coalesce(reason, ''), occurred_at FROM order_events
		WHERE order_id = $1 AND seq > $2 ORDER BY seq`, orderID, seq)
	if err != nil {
		return nil, fmt.Errorf("read history of order %s: %w", orderID, err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		e := Event{OrderID: orderID}
		var status string
		err := r.Scan(&e.Seq, &status, &e.Reason, &e.OccurredAt)
		e.Status, e.OccurredAt = order.Status(status), e.OccurredAt.UTC()
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read history of order %s: %w", orderID, err)
	}
	return evs, nil
}
