// Package pspserver is the payment provider stand-in, `orderpipe psp`: it
// serves the wire contract of shared/psp (charges, refunds and voids with
// Idempotency-Key semantics), keeps its charges in PostgreSQL (psp_charges,
// psp_refunds) and misbehaves on request (latency, declines, errors,
// "charge then time out"). It is tooling: dev, the tests and the chaos run
// use it in place of a real provider.
package pspserver

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/app"
	"orderpipe/shared/groupcommit"
	"orderpipe/shared/psp"
)

// Options make the stand-in behave like a real provider on a bad day.
type Options struct {
	// Latency is added to every charge and refund before it is decided
	// (the key is in flight meanwhile: a repeat gets 409). With none, a
	// charge is recorded decided at once, in one statement.
	Latency time.Duration
	// DeclineRate is the share of new charges declined (402).
	DeclineRate float64
	// ErrorRate is the share of new charges and refunds answered 500
	// without doing anything.
	ErrorRate float64
	// TimeoutRate is the share of new charges that are charged and then
	// not answered: the connection is held for Hang (or until the caller
	// gives up) and dropped. A repeat of the key returns the charge.
	TimeoutRate float64
	// Hang is how long a "charge then time out" holds the connection;
	// default 30s.
	Hang time.Duration
	// InFlightTimeout: a key in flight for longer than this is taken to
	// be abandoned (the stand-in died mid-request) and decided afresh;
	// default 30s.
	InFlightTimeout time.Duration
	// Seed makes the random outcomes reproducible (0: random).
	Seed uint64
}

// Validate checks the rates and durations.
func (o Options) Validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		v    float64
	}{{"decline rate", o.DeclineRate}, {"error rate", o.ErrorRate}, {"timeout rate", o.TimeoutRate}} {
		if !(r.v >= 0 && r.v <= 1) { // also refuses NaN
			errs = append(errs, fmt.Errorf("%s must be between 0 and 1, got %v", r.name, r.v))
		}
	}
	if s := o.DeclineRate + o.ErrorRate + o.TimeoutRate; s > 1 {
		errs = append(errs, fmt.Errorf("decline, error and timeout rates add up to %v, more than 1", s))
	}
	if o.Latency < 0 {
		errs = append(errs, fmt.Errorf("latency must not be negative, got %s", o.Latency))
	}
	if o.Hang < 0 {
		errs = append(errs, fmt.Errorf("hang must not be negative, got %s", o.Hang))
	}
	if o.InFlightTimeout < 0 {
		errs = append(errs, fmt.Errorf("in-flight timeout must not be negative, got %s", o.InFlightTimeout))
	}
	return errors.Join(errs...)
}

// Server is the payment provider stand-in. Its state (charges, refunds,
// idempotency keys) lives in PostgreSQL (psp_charges, psp_refunds), so it
// survives restarts and several replicas agree.
type Server struct {
	pool   *pgxpool.Pool
	opts   Options
	logger *slog.Logger

	mu  sync.Mutex
	rng *rand.Rand
	// charges is the charges' group commit (record.go).
	charges groupcommit.Queue[*newCharge]
}

// NewServer returns a stand-in on pool.
func NewServer(pool *pgxpool.Pool, opts Options, logger *slog.Logger) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Hang == 0 {
		opts.Hang = 30 * time.Second
	}
	if opts.InFlightTimeout == 0 {
		opts.InFlightTimeout = 30 * time.Second
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	if logger == nil {
		logger = slog.Default()
	}
	srv := &Server{pool: pool, opts: opts, logger: logger, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	srv.charges = groupcommit.Queue[*newCharge]{Flush: srv.recordBatch, MaxBatch: maxChargeBatch, Flushers: 1}
	return srv, nil
}

// Handler serves the wire contract and GET /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.charge)
	mux.HandleFunc("POST /v1/refunds", s.refund)
	mux.HandleFunc("POST /v1/charges/void", s.void)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}

type outcome int

const (
	outcomeSucceed outcome = iota
	outcomeDecline
	outcomeError
	outcomeChargeThenTimeout
)

func (s *Server) draw(charge bool) outcome {
	s.mu.Lock()
	r := s.rng.Float64()
	s.mu.Unlock()
	switch {
	case r < s.opts.ErrorRate:
		return outcomeError
	case !charge:
		return outcomeSucceed
	case r < s.opts.ErrorRate+s.opts.DeclineRate:
		return outcomeDecline
	case r < s.opts.ErrorRate+s.opts.DeclineRate+s.opts.TimeoutRate:
		return outcomeChargeThenTimeout
	}
	return outcomeSucceed
}

// readRequest reads a request's Idempotency-Key header and its body with
// decode; when either is bad it answers 400 and reports false.
func readRequest[T any](w http.ResponseWriter, r *http.Request, decode func(io.Reader) (T, error)) (key string, req T, ok bool) {
	key = r.Header.Get(psp.HeaderIdempotencyKey)
	if !psp.ValidKey(key) {
		problem(w, http.StatusBadRequest, "invalid_request", "Idempotency-Key header must be 1-255 printable characters")
		return "", req, false
	}
	req, err := decode(http.MaxBytesReader(w, r.Body, psp.MaxBodyBytes))
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid_request", err.Error())
		return "", req, false
	}
	return key, req, true
}

func fingerprint(parts ...string) []byte {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key, req, ok := readRequest(w, r, psp.DecodeCharge)
	if !ok {
		return
	}
	fp := fingerprint("charge", req.Amount, req.Currency, req.Reference)
	chargeID := "ch_" + uuid.NewString()
	// The outcome is drawn first. With no latency nothing needs to be in
	// flight: the charge is recorded decided, one statement instead of
	// two. An injected error records nothing, so it goes the way in
	// flight: a repeat of a decided key gets its answer, not the error.
	o := s.draw(true)
	state, reason := "in_flight", ""
	if s.opts.Latency == 0 {
		state, reason = chargeState(o)
	}
	inserted, err := s.record(&newCharge{key: key, fp: fp, chargeID: chargeID, amount: req.Amount, currency: req.Currency,
		reference: req.Reference, state: state, reason: reason})
	if err == nil && !inserted {
		if chargeID, ok = s.repeat(w, r, "psp_charges", "charge_id", key, fp); !ok {
			return
		}
		state = "in_flight" // an abandoned key, taken over
	} else if err != nil {
		s.storeFailed(w, "record charge", err)
		return
	}
	if state == "in_flight" {
		if !app.Sleep(ctx, s.opts.Latency) {
			// The caller gave up before anything was decided: forget the key.
			_, _ = s.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM psp_charges WHERE idempotency_key = $1 AND state = 'in_flight'`, key)
			return
		}
		if o == outcomeError {
			// Nothing was charged: forget the key so that a retry decides afresh.
			_, _ = s.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM psp_charges WHERE idempotency_key = $1 AND state = 'in_flight'`, key)
			problem(w, http.StatusInternalServerError, "provider_error", "injected provider error")
			return
		}
		state, reason = chargeState(o)
		if !s.finishCharge(w, ctx, key, state, reason) {
			return
		}
	}
	switch o {
	case outcomeDecline:
		writeJSON(w, http.StatusPaymentRequired, psp.Answer{ID: chargeID, Status: psp.StatusDeclined, Reason: declineReason})
	case outcomeChargeThenTimeout:
		s.logger.Info("psp: charged, now not answering", slog.String("key", key), slog.String("charge_id", chargeID))
		app.Sleep(ctx, s.opts.Hang)
		panic(http.ErrAbortHandler) // drop the connection without an answer
	default:
		writeJSON(w, http.StatusCreated, psp.Answer{ID: chargeID, Status: psp.StatusSucceeded})
	}
}

// declineReason is the reason of every declined charge.
const declineReason = "card declined"

// chargeState is the state and reason a charge with outcome o is recorded
// with; in_flight for an injected error, which records nothing.
func chargeState(o outcome) (state, reason string) {
	switch o {
	case outcomeError:
		return "in_flight", ""
	case outcomeDecline:
		return psp.StatusDeclined, declineReason
	}
	return psp.StatusSucceeded, ""
}

func (s *Server) finishCharge(w http.ResponseWriter, ctx context.Context, key, state, reason string) bool {
	_, err := s.pool.Exec(context.WithoutCancel(ctx), `
		UPDATE psp_charges SET state = $2, reason = NULLIF($3, ''), completed_at = now()
		WHERE idempotency_key = $1 AND state = 'in_flight'`, key, state, reason)
	if err != nil {
		s.storeFailed(w, "finish charge", err)
		return false
	}
	return true
}

// repeat answers a request whose key exists: the first answer, 409 while in
// flight, 422 for another body. It returns the row's id and true when the
// caller should go on deciding (an abandoned in-flight key it took over).
func (s *Server) repeat(w http.ResponseWriter, r *http.Request, table, idCol, key string, fp []byte) (string, bool) {
	ctx := r.Context()
	var (
		gotFP  []byte
		state  string
		id     string
		reason *string
		stale  bool
	)
	q := fmt.Sprintf(`SELECT fingerprint, state, %s, %s, created_at < now() - make_interval(secs => $2) FROM %s WHERE idempotency_key = $1`,
		idCol, reasonCol(table), table)
	if err := s.pool.QueryRow(ctx, q, key, s.opts.InFlightTimeout.Seconds()).Scan(&gotFP, &state, &id, &reason, &stale); err != nil {
		if errors.Is(err, pgx.ErrNoRows) { // an injected error deleted it meanwhile
			problem(w, http.StatusConflict, "in_flight", "the request with this key is being processed; retry later")
			return "", false
		}
		s.storeFailed(w, "read idempotency key", err)
		return "", false
	}
	if state == psp.StatusVoided {
		// The key was voided before it was ever charged: it is dead.
		writeJSON(w, http.StatusGone, psp.Answer{Status: psp.StatusVoided})
		return "", false
	}
	if string(gotFP) != string(fp) {
		problem(w, http.StatusUnprocessableEntity, "idempotency_key_reused", "this Idempotency-Key was used with another request body")
		return "", false
	}
	switch state {
	case "in_flight":
		if stale {
			tag, err := s.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET created_at = now() WHERE idempotency_key = $1 AND state = 'in_flight' AND created_at < now() - make_interval(secs => $2)`, table),
				key, s.opts.InFlightTimeout.Seconds())
			if err == nil && tag.RowsAffected() == 1 {
				return id, true
			}
		}
		problem(w, http.StatusConflict, "in_flight", "the request with this key is being processed; retry later")
		return "", false
	case psp.StatusDeclined:
		writeJSON(w, http.StatusPaymentRequired, declined(id, reason))
	default:
		writeJSON(w, http.StatusCreated, psp.Answer{ID: id, Status: psp.StatusSucceeded})
	}
	return "", false
}

func reasonCol(table string) string {
	if table == "psp_charges" {
		return "reason"
	}
	return "NULL::text"
}

func (s *Server) refund(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key, req, ok := readRequest(w, r, psp.DecodeRefund)
	if !ok {
		return
	}
	fp := fingerprint("refund", req.ChargeID)
	// A repeat of the key first: it answers even after the charge changed.
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM psp_refunds WHERE idempotency_key = $1)`, key).Scan(&exists); err != nil {
		s.storeFailed(w, "read refund key", err)
		return
	}
	refundID := "re_" + uuid.NewString()
	if !exists {
		var state string
		err := s.pool.QueryRow(ctx, `SELECT state FROM psp_charges WHERE charge_id = $1`, req.ChargeID).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			problem(w, http.StatusNotFound, "no_such_charge", "no charge "+req.ChargeID)
			return
		case err != nil:
			s.storeFailed(w, "read charge", err)
			return
		case state != psp.StatusSucceeded:
			problem(w, http.StatusUnprocessableEntity, "charge_not_refundable", "charge "+req.ChargeID+" is "+state)
			return
		}
		tag, err := s.pool.Exec(ctx, `
			INSERT INTO psp_refunds (idempotency_key, fingerprint, state, refund_id, charge_id)
			VALUES ($1, $2, 'in_flight', $3, $4)
			ON CONFLICT DO NOTHING`, key, fp, refundID, req.ChargeID)
		if err != nil {
			s.storeFailed(w, "record refund", err)
			return
		}
		if tag.RowsAffected() == 0 {
			var sameKey bool
			if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM psp_refunds WHERE idempotency_key = $1)`, key).Scan(&sameKey); err != nil {
				s.storeFailed(w, "read refund key", err)
				return
			}
			if !sameKey {
				problem(w, http.StatusUnprocessableEntity, "charge_already_refunded", "charge "+req.ChargeID+" was refunded under another key")
				return
			}
			exists = true
		}
	}
	if exists {
		if refundID, ok = s.repeat(w, r, "psp_refunds", "refund_id", key, fp); !ok {
			return
		}
	}
	if !app.Sleep(ctx, s.opts.Latency) {
		_, _ = s.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM psp_refunds WHERE idempotency_key = $1 AND state = 'in_flight'`, key)
		return
	}
	if s.draw(false) == outcomeError {
		_, _ = s.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM psp_refunds WHERE idempotency_key = $1 AND state = 'in_flight'`, key)
		problem(w, http.StatusInternalServerError, "provider_error", "injected provider error")
		return
	}
	if _, err := s.pool.Exec(context.WithoutCancel(ctx), `
		UPDATE psp_refunds SET state = 'succeeded', completed_at = now()
		WHERE idempotency_key = $1 AND state = 'in_flight'`, key); err != nil {
		s.storeFailed(w, "finish refund", err)
		return
	}
	writeJSON(w, http.StatusCreated, psp.Answer{ID: refundID, Status: psp.StatusSucceeded})
}

// void resolves a charge key without charging: a key never seen is stored
// as voided (and any later charge with it gets 410); a key already decided
// answers its stored outcome; a key in flight answers 409.
func (s *Server) void(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key, req, ok := readRequest(w, r, psp.DecodeVoid)
	if !ok {
		return
	}
	if !app.Sleep(ctx, s.opts.Latency) {
		return
	}
	if s.draw(false) == outcomeError {
		problem(w, http.StatusInternalServerError, "provider_error", "injected provider error")
		return
	}
	tag, err := s.pool.Exec(ctx, `
		INSERT INTO psp_charges (idempotency_key, fingerprint, state, charge_id, reference, completed_at)
		VALUES ($1, $2, 'voided', $3, $4, now())
		ON CONFLICT (idempotency_key) DO NOTHING`, key, fingerprint("void", req.Reference), "vo_"+uuid.NewString(), req.Reference)
	if err != nil {
		s.storeFailed(w, "record void", err)
		return
	}
	if tag.RowsAffected() == 1 {
		writeJSON(w, http.StatusOK, psp.Answer{Status: psp.StatusVoided})
		return
	}
	var (
		state, id string
		reason    *string
		stale     bool
	)
	if err := s.pool.QueryRow(ctx, `
		SELECT state, charge_id, reason, created_at < now() - make_interval(secs => $2)
		FROM psp_charges WHERE idempotency_key = $1`, key, s.opts.InFlightTimeout.Seconds()).Scan(&state, &id, &reason, &stale); err != nil {
		if errors.Is(err, pgx.ErrNoRows) { // an injected error deleted an in-flight charge meanwhile
			problem(w, http.StatusConflict, "in_flight", "the charge with this key is being processed; retry later")
			return
		}
		s.storeFailed(w, "read idempotency key", err)
		return
	}
	switch state {
	case "in_flight":
		if stale {
			// Abandoned mid-request (the stand-in died): nothing was
			// decided, so the key can be voided.
			tag, err := s.pool.Exec(ctx, `
				UPDATE psp_charges SET state = 'voided', completed_at = now()
				WHERE idempotency_key = $1 AND state = 'in_flight' AND created_at < now() - make_interval(secs => $2)`,
				key, s.opts.InFlightTimeout.Seconds())
			if err == nil && tag.RowsAffected() == 1 {
				writeJSON(w, http.StatusOK, psp.Answer{Status: psp.StatusVoided})
				return
			}
		}
		problem(w, http.StatusConflict, "in_flight", "the charge with this key is being processed; retry later")
	case psp.StatusVoided:
		writeJSON(w, http.StatusOK, psp.Answer{Status: psp.StatusVoided})
	case psp.StatusDeclined:
		writeJSON(w, http.StatusOK, declined(id, reason))
	default:
		writeJSON(w, http.StatusOK, psp.Answer{ID: id, Status: psp.StatusSucceeded})
	}
}

func (s *Server) storeFailed(w http.ResponseWriter, what string, err error) {
	s.logger.Warn("psp: store", slog.String("op", what), slog.Any("error", err))
	problem(w, http.StatusServiceUnavailable, "unavailable", what+": storage unavailable")
}

// declined is the answer of a declined charge, with its reason when known.
func declined(id string, reason *string) psp.Answer {
	a := psp.Answer{ID: id, Status: psp.StatusDeclined}
	if reason != nil {
		a.Reason = *reason
	}
	return a
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, psp.Problem{Error: msg, Code: code})
}
