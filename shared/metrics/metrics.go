// Package metrics defines every orderpipe metric in one place, with bounded
// label sets: no request_id, order_id or client_id is ever a label. The
// parts update these collectors; app.NewRegistry registers them all, so
// every process's /metrics exposes the same names, and the alert rules and
// the dashboard in deploy/ are checked against Names.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Intake outcomes (label "outcome" of IntakeRequests).
const (
	OutcomeCreated         = "created"
	OutcomeReplayed        = "replayed"
	OutcomeRejectedInvalid = "rejected_invalid"
	OutcomeMismatch        = "rejected_mismatch"
	OutcomeUnauthenticated = "unauthenticated"
	OutcomeRateLimited     = "rate_limited"
	OutcomeUnavailable     = "unavailable"
)

// Handler outcomes (label "outcome" of HandlerMessages).
const (
	HandlerProcessed    = "processed"
	HandlerDuplicate    = "duplicate"
	HandlerRetried      = "retried"
	HandlerDeadLettered = "dead_lettered"
)

var stageBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

var (
	// IntakeRequests counts order-create requests by outcome. Its ratio
	// replayed / (created + replayed) is the duplicate request rate.
	IntakeRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_intake_requests_total",
		Help: "Order-create requests by outcome: created, replayed, rejected_invalid, rejected_mismatch, unauthenticated, rate_limited, unavailable.",
	}, []string{"outcome"})

	// IntakeDuration is the latency of order-create requests.
	IntakeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "orderpipe_intake_request_duration_seconds",
		Help:    "Latency of order-create requests by outcome.",
		Buckets: prometheus.DefBuckets,
	}, []string{"outcome"})

	// UniqueConflicts counts unique-constraint conflicts at insert: a
	// concurrent duplicate request_id, or a colliding order_no.
	UniqueConflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_unique_conflicts_total",
		Help: "Unique-constraint conflicts on order insert, by constraint: request_id or order_no.",
	}, []string{"constraint"})

	// OrdersFinished counts orders reaching a terminal state.
	OrdersFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_orders_finished_total",
		Help: "Orders that reached a terminal state, by status: confirmed, rejected, cancelled.",
	}, []string{"status"})

	// StageSeconds is the time from acceptance to an order entering a status.
	StageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "orderpipe_order_stage_seconds",
		Help:    "Time from acceptance until the order entered the status.",
		Buckets: stageBuckets,
	}, []string{"status"})

	// HandlerMessages counts messages per consumer handler and outcome.
	HandlerMessages = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_handler_messages_total",
		Help: "Messages handled per consumer handler, by outcome: processed, duplicate, retried, dead_lettered.",
	}, []string{"handler", "outcome"})

	// HandlerDuration is the latency of one handler run.
	HandlerDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "orderpipe_handler_duration_seconds",
		Help:    "Latency of one consumer handler run.",
		Buckets: prometheus.DefBuckets,
	}, []string{"handler"})

	// DeadLetters counts messages put in the dead_letters table.
	DeadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_dead_letters_total",
		Help: "Messages dead-lettered into PostgreSQL, by handler.",
	}, []string{"handler"})

	// StuckOrders is the number of non-terminal orders past their
	// state's deadline, by status, as of the compensator's last pass.
	StuckOrders = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "orderpipe_stuck_orders",
		Help: "Non-terminal orders past their state's deadline, by status, at the compensator's last pass.",
	}, []string{"status"})

	// OldestOpenOrderAge is the age of the oldest non-terminal order.
	OldestOpenOrderAge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orderpipe_oldest_open_order_age_seconds",
		Help: "Age of the oldest non-terminal order at the compensator's last pass (0 when none).",
	})

	// CompensatorActions counts what the compensator did.
	CompensatorActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_compensator_actions_total",
		Help: "Compensator actions by kind: redrive, unwind, refund, renotify, heal, skip.",
	}, []string{"action"})

	// CompensatorBrokerUp is 1 when the compensator's last pass reached the
	// broker, 0 when it could not (and so re-drove and unwound nothing).
	CompensatorBrokerUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orderpipe_compensator_broker_up",
		Help: "1 when the compensator's last pass reached the broker; 0 when it could not, and so re-drove and unwound nothing.",
	})

	// WebhookDeliveries counts webhook delivery attempts by outcome.
	WebhookDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_webhook_deliveries_total",
		Help: "Webhook delivery attempts by outcome: delivered, retry, failed (given up), refused (unsafe URL).",
	}, []string{"outcome"})

	// TokensIssued counts idempotency tokens issued by the intake.
	TokensIssued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "orderpipe_idempotency_tokens_issued_total",
		Help: "Idempotency tokens issued (POST /v1/idempotency-tokens, MCP new_order_token).",
	})

	// Tokens is the number of idempotency tokens by state (unused,
	// processing, used, expired), as of the compensator's last pass.
	Tokens = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "orderpipe_idempotency_tokens",
		Help: "Idempotency tokens by state (unused, processing, used, expired: unused past its expiry, not yet swept), at the compensator's last pass.",
	}, []string{"state"})

	// OutboxPublished counts events published from the outbox.
	OutboxPublished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orderpipe_outbox_published_total",
		Help: "Events published from the outbox, by path: inline (right after commit) or relay (a later pass).",
	}, []string{"path"})
)

// Collectors returns every orderpipe collector.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{IntakeRequests, IntakeDuration, UniqueConflicts, OrdersFinished, StageSeconds,
		HandlerMessages, HandlerDuration, DeadLetters, StuckOrders, OldestOpenOrderAge, CompensatorActions, CompensatorBrokerUp,
		WebhookDeliveries, OutboxPublished, TokensIssued, Tokens}
}

// Names returns the metric names as exposed (histograms with their
// _bucket, _sum and _count series).
func Names() map[string]bool {
	out := map[string]bool{}
	reg := prometheus.NewPedanticRegistry()
	for _, c := range Collectors() {
		reg.MustRegister(c)
	}
	for _, c := range Collectors() {
		ch := make(chan *prometheus.Desc, 4)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			name := descName(d)
			out[name] = true
			if _, ok := c.(*prometheus.HistogramVec); ok {
				out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
			}
		}
	}
	return out
}
