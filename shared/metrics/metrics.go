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

// handlerBuckets reach the 2 minutes that bound one handler run
// (redelivery.Policy.MaxProcessing): a payment step waiting on a slow
// provider takes that long, far past the default buckets' 10 s.
var handlerBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

var (
	// IntakeRequests counts order-create requests by outcome. Its ratio
	// replayed / (created + replayed) is the duplicate request rate.
	IntakeRequests = counterVec("orderpipe_intake_requests_total", "Order-create requests by outcome: created, replayed, rejected_invalid, rejected_mismatch, unauthenticated, rate_limited, unavailable.", "outcome")

	// IntakeDuration is the latency of order-create requests.
	IntakeDuration = histogramVec("orderpipe_intake_request_duration_seconds", prometheus.DefBuckets, "Latency of order-create requests by outcome.", "outcome")

	// UniqueConflicts counts unique-constraint conflicts at insert: a
	// concurrent duplicate request_id, or a colliding order_no.
	UniqueConflicts = counterVec("orderpipe_unique_conflicts_total", "Unique-constraint conflicts on order insert, by constraint: request_id or order_no.", "constraint")

	// IntakeCoalesced counts create requests that arrived while a request
	// of the same client and request_id was in flight in the same process
	// and were answered from its result, without a row of their own in the
	// group commit. They are counted among the request_id conflicts too.
	IntakeCoalesced = prometheus.NewCounter(prometheus.CounterOpts{Name: "orderpipe_intake_coalesced_total", Help: "Create requests answered from a concurrent request of the same (client, request_id) in the same intake process."})

	// OrdersFinished counts orders reaching a terminal state.
	OrdersFinished = counterVec("orderpipe_orders_finished_total", "Orders that reached a terminal state, by status: confirmed, rejected, cancelled.", "status")

	// StageSeconds is the time from acceptance to an order entering a status.
	StageSeconds = histogramVec("orderpipe_order_stage_seconds", stageBuckets, "Time from acceptance until the order entered the status.", "status")

	// HandlerMessages counts messages per consumer handler and outcome.
	HandlerMessages = counterVec("orderpipe_handler_messages_total", "Messages handled per consumer handler, by outcome: processed, duplicate, retried, dead_lettered.", "handler", "outcome")

	// HandlerDuration is the latency of one handler run.
	HandlerDuration = histogramVec("orderpipe_handler_duration_seconds", handlerBuckets, "Latency of one consumer handler run.", "handler")

	// StepBatchSize is how many messages one transaction of a step's
	// group commit carried.
	StepBatchSize = histogramVec("orderpipe_step_batch_messages", []float64{1, 2, 4, 8, 16, 32, 64}, "Messages per transaction of a step's group commit.", "handler")

	// StepBatchDuration is how long one transaction of a step's group
	// commit took, from its begin to its commit.
	StepBatchDuration = histogramVec("orderpipe_step_batch_duration_seconds", prometheus.DefBuckets, "Duration of one transaction of a step's group commit, begin to commit.", "handler")

	// DeadLetters counts messages put in the dead_letters table.
	DeadLetters = counterVec("orderpipe_dead_letters_total", "Messages dead-lettered into PostgreSQL, by handler.", "handler")

	// StuckOrders is the number of non-terminal orders past their
	// state's deadline, by status, as of the compensator's last pass.
	StuckOrders = gaugeVec("orderpipe_stuck_orders", "Non-terminal orders past their state's deadline, by status, at the compensator's last pass.", "status")

	// OldestOpenOrderAge is the age of the oldest non-terminal order.
	OldestOpenOrderAge = lazyGauge("orderpipe_oldest_open_order_age_seconds", "Age of the oldest non-terminal order at the compensator's last pass (0 when none).")

	// CompensatorActions counts what the compensator did.
	CompensatorActions = counterVec("orderpipe_compensator_actions_total", "Compensator actions by kind: redrive, unwind, refund, renotify, heal, skip.", "action")

	// CompensatorBrokerUp is 1 when the compensator's last pass reached the
	// broker, 0 when it could not (and so re-drove and unwound nothing) or
	// when the broker did not acknowledge one of its re-drives (taken back
	// and not counted; the pass stopped re-driving there).
	CompensatorBrokerUp = lazyGauge("orderpipe_compensator_broker_up", "1 when the compensator's last pass reached the broker; 0 when it could not (nothing re-driven or unwound), or when the broker did not acknowledge one of its re-drives (taken back, the pass stopped re-driving).")

	// CompensatorLastSuccess is when the compensator's last completed pass
	// ended: every phase succeeded, or failed only because the broker was
	// unavailable (CompensatorBrokerUp) or the payment provider did not
	// make a refund (RefundFailures, OldestRefundDueAge).
	CompensatorLastSuccess = lazyGauge("orderpipe_compensator_last_success_timestamp_seconds", "Unix time at which the compensator's last completed pass ended (every phase succeeded, or failed only for the broker being unavailable or the payment provider not making a refund).")

	// CompensatorPassFailures counts the compensator's passes in which a
	// phase failed, by phase.
	CompensatorPassFailures = counterVec("orderpipe_compensator_pass_failures_total", "Compensator passes in which the phase failed, by phase: measure, broker, heal, scan, refunds, renotify, republish, sweep, tokens.", "phase")

	// RefundsDue is the number of payments of cancelled or rejected orders
	// that may still hold the customer's money (a succeeded charge with its
	// refund due, or a charge of unknown outcome to void), after the
	// compensator's last pass asked the provider for them.
	RefundsDue = lazyGauge("orderpipe_refunds_due", "Payments of cancelled or rejected orders that may still hold the customer's money (a charge to refund, or one of unknown outcome to void), after the refunds of the compensator's last pass.")

	// OldestRefundDueAge is how long ago the order of the oldest payment in
	// RefundsDue was cancelled or rejected.
	OldestRefundDueAge = lazyGauge("orderpipe_oldest_refund_due_age_seconds", "Time since the order of the oldest refund still due (orderpipe_refunds_due) was cancelled or rejected, after the compensator's last pass (0 when none).")

	// RefundFailures counts refunds (and voids) of cancelled orders that
	// the compensator asked for and did not get: the provider refused or
	// failed, or the compensator has no provider.
	RefundFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "orderpipe_compensator_refund_failures_total", Help: "Refunds or voids of cancelled orders that the compensator asked for and did not get (the provider refused or failed, or no provider is configured)."})

	// OutboxOldestPendingAge is the age of the oldest outbox row not
	// published yet, at the start of the compensator's last pass.
	OutboxOldestPendingAge = lazyGauge("orderpipe_outbox_oldest_pending_age_seconds", "Age of the oldest outbox event not published yet, at the start of the compensator's last pass (0 when none).")

	// WebhookDeliveries counts webhook delivery attempts by outcome.
	WebhookDeliveries = counterVec("orderpipe_webhook_deliveries_total", "Webhook delivery attempts by outcome: delivered, retry, failed (given up), refused (unsafe URL).", "outcome")

	// TokensIssued counts idempotency tokens issued by the intake.
	TokensIssued = prometheus.NewCounter(prometheus.CounterOpts{Name: "orderpipe_idempotency_tokens_issued_total", Help: "Idempotency tokens issued (POST /v1/idempotency-tokens, MCP new_order_token)."})

	// TokensUsed counts idempotency tokens that became used: their order
	// committed.
	TokensUsed = prometheus.NewCounter(prometheus.CounterOpts{Name: "orderpipe_idempotency_tokens_used_total", Help: "Idempotency tokens that became used: their order committed (marked by the intake, or by the compensator for a holder that died)."})

	// Tokens is the number of idempotency tokens not used yet by state
	// (unused, processing, expired), as of the compensator's last pass.
	Tokens = gaugeVec("orderpipe_idempotency_tokens", "Idempotency tokens not used yet, by state (unused, processing, expired: unused past its expiry, not yet swept), at the compensator's last pass. Used tokens: orderpipe_idempotency_tokens_used_total.", "state")

	// OutboxPublished counts events published from the outbox.
	OutboxPublished = counterVec("orderpipe_outbox_published_total", "Events published from the outbox, by path: inline (right after commit) or relay (a later pass).", "path")
)

// The constructors of the labelled collectors keep each definition to its
// name, help text, buckets and labels.

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func histogramVec(name string, buckets []float64, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func lazyGauge(name, help string) *LazyGauge {
	return &LazyGauge{vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, nil)}
}

// LazyGauge is a gauge that a process exports only once it has set it.
// Every process registers every collector (app.NewRegistry), and a plain
// gauge is exported at 0 by all of them: a producer would export
// orderpipe_oldest_open_order_age_seconds 0 forever, which hides a dead
// compensator from max() and fires an "== 0" rule. A value that only the
// compensator measures is therefore a LazyGauge: absent from the other
// processes' /metrics, and from a compensator's until its first pass.
type LazyGauge struct{ vec *prometheus.GaugeVec }

// Set sets the gauge; the process exports it from then on.
func (g *LazyGauge) Set(v float64) { g.vec.WithLabelValues().Set(v) }

// Describe implements prometheus.Collector.
func (g *LazyGauge) Describe(ch chan<- *prometheus.Desc) { g.vec.Describe(ch) }

// Collect implements prometheus.Collector: nothing until Set was called.
func (g *LazyGauge) Collect(ch chan<- prometheus.Metric) { g.vec.Collect(ch) }

// Collectors returns every orderpipe collector.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{IntakeRequests, IntakeDuration, UniqueConflicts, IntakeCoalesced, OrdersFinished, StageSeconds,
		HandlerMessages, HandlerDuration, StepBatchSize, StepBatchDuration, DeadLetters, StuckOrders, OldestOpenOrderAge, CompensatorActions, CompensatorBrokerUp,
		CompensatorLastSuccess, CompensatorPassFailures, RefundsDue, OldestRefundDueAge, RefundFailures, OutboxOldestPendingAge,
		WebhookDeliveries, OutboxPublished, TokensIssued, TokensUsed, Tokens}
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
