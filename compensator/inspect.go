package compensator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
	"orderpipe/shared/order"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/postgres"
)

// OrdersCommand is `orderpipe orders inspect ID` and `orderpipe orders
// stats`: the operator's view of one order, and of all of them.
func OrdersCommand() cli.Command {
	return cli.Command{
		Name:    "orders",
		Summary: "operator views: `orders inspect ID` (one order's history, steps, stock, payment, dead letters, compensator actions) and `orders stats`",
		Usage:   "inspect ORDER_ID | stats [--stuck-after D]",
		Env:     cli.Join([]string{config.EnvDatabaseURL}, config.EnvLogLevel),
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) == 0 {
				return cli.Usagef("orders needs a subcommand: inspect ORDER_ID or stats")
			}
			sub, args := inv.Args[0], inv.Args[1:]
			var run func(pool *pgxpool.Pool) error
			switch sub {
			case "inspect":
				if len(args) != 1 {
					return cli.Usagef("orders inspect takes one order id, got %d arguments", len(args))
				}
				id, err := uuid.Parse(args[0])
				if err != nil || id == uuid.Nil {
					return cli.Usagef("orders inspect: %q is not an order id (a UUID)", args[0])
				}
				run = func(pool *pgxpool.Pool) error { return Inspect(ctx, pool, id, inv.Stdout) }
			case "stats":
				fs := flag.NewFlagSet("orders stats", flag.ContinueOnError)
				fs.SetOutput(io.Discard)
				stuck := fs.Duration("stuck-after", DefaultStuckProcessing, "count an open order as stuck after this long without progress")
				if err := cli.Parse(fs, args); errors.Is(err, flag.ErrHelp) {
					return err // the command's usage, exit 0
				} else if err != nil {
					return cli.Usagef("orders stats: %v", err)
				}
				if fs.NArg() > 0 {
					return cli.Usagef("orders stats takes no arguments, got %q", fs.Args())
				}
				if *stuck <= 0 {
					return cli.Usagef("orders stats: --stuck-after must be positive, got %s", *stuck)
				}
				run = func(pool *pgxpool.Pool) error { return Stats(ctx, pool, *stuck, inv.Stdout) }
			default:
				return cli.Usagef("orders: unknown subcommand %q (want inspect or stats)", sub)
			}
			return cli.WithPool(ctx, inv, run)
		},
	}
}

// tableExists reports whether a table is in the schema (the parts' own
// tables may be missing on a database migrated by an older build).
func tableExists(ctx context.Context, q postgres.DB, name string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok)
	return ok, err
}

// section prints a titled table of a query's rows; every column is read as
// text. Optional tables that do not exist are skipped.
func section(ctx context.Context, q postgres.DB, w io.Writer, title, table, sql string, args ...any) error {
	if table != "" {
		ok, err := tableExists(ctx, q, table)
		if err != nil {
			return fmt.Errorf("%s: %w", title, err)
		}
		if !ok {
			return nil
		}
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", title, err)
	}
	defer rows.Close()
	var lines [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return fmt.Errorf("%s: %w", title, err)
		}
		line := make([]string, len(vals))
		for i, v := range vals {
			line[i] = cell(v)
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", title, err)
	}
	fmt.Fprintf(w, "\n%s (%d)\n", title, len(lines))
	if len(lines) == 0 {
		return nil
	}
	var head []string
	for _, f := range rows.FieldDescriptions() {
		head = append(head, strings.ToUpper(f.Name))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+strings.Join(head, "\t"))
	for _, l := range lines {
		fmt.Fprintln(tw, "  "+strings.Join(l, "\t"))
	}
	return tw.Flush()
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case [16]byte:
		return uuid.UUID(x).String()
	case []byte:
		return fmt.Sprintf("%x", x)
	case string:
		return strings.NewReplacer("\n", " ", "\t", " ").Replace(x)
	default:
		return fmt.Sprint(x)
	}
}

// Inspect prints everything known about one order: the order, its status
// history, the outbox events and the consumers' processed steps, its stock
// reservations, its payment and the provider's side of it, its dead
// letters, the compensator's actions and its webhook deliveries. It reads
// in one READ ONLY transaction.
func Inspect(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, w io.Writer) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("begin read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var (
		orderNo, status, requestID, currency, amount string
		clientID                                     uuid.UUID
		userID                                       int64
		reason, redriveStatus, callback              *string
		attempts                                     int
		created, updated                             time.Time
		redrivenAt                                   *time.Time
		items                                        string
	)
	err = tx.QueryRow(ctx, `
		SELECT order_no, status, client_id, request_id, user_id, items::text, amount::text, currency, callback_url,
		       reason, created_at, updated_at, redrive_attempts, redrive_status, redriven_at
		FROM orders WHERE order_id = $1`, id).Scan(&orderNo, &status, &clientID, &requestID, &userID, &items, &amount, &currency,
		&callback, &reason, &created, &updated, &attempts, &redriveStatus, &redrivenAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("inspect order %s: %w", id, orderstore.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("inspect order %s: %w", id, err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	kv := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	kv("order", id.String())
	kv("order_no", orderNo)
	kv("status", status)
	if reason != nil {
		kv("reason", *reason)
	}
	kv("client_id", clientID.String())
	kv("request_id", requestID)
	kv("user_id", fmt.Sprint(userID))
	kv("amount", amount+" "+currency)
	kv("items", items)
	kv("callback_url", cell(callbackOrNil(callback)))
	kv("created_at", cell(created))
	kv("updated_at", cell(updated))
	if !order.Status(status).Terminal() {
		kv("open for", time.Since(created).Round(time.Second).String())
	}
	if redriveStatus != nil {
		kv("re-drives", fmt.Sprintf("%d in %s, last at %s", attempts, *redriveStatus, cell(deref2(redrivenAt))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	prefix := id.String() + ":%"
	// Queries take the order id as $1, or (byPrefix) the message-id prefix
	// "<order_id>:%".
	steps := []struct {
		title, table, sql string
		byPrefix          bool
	}{
		{"history (order_events)", "", `SELECT seq, status, reason, occurred_at FROM order_events WHERE order_id = $1 ORDER BY seq`, false},
		{"events (outbox)", "", `SELECT msg_id, event, created_at, published_at FROM outbox WHERE msg_id LIKE $1 ORDER BY id`, true},
		{"processed steps (processed_messages)", "", `SELECT consumer, message_id, processed_at FROM processed_messages WHERE message_id LIKE $1 ORDER BY processed_at, consumer`, true},
		{"reservations", "reservations", `SELECT sku, quantity, reserved_at, released_at FROM reservations WHERE order_id = $1 ORDER BY sku`, false},
		{"payment", "payments", `SELECT status, amount::text, currency, idempotency_key, charge_id, decline_reason, refund_key, refund_id, refunded_at FROM payments WHERE order_id = $1`, false},
		{"provider charges (psp_charges)", "psp_charges", `SELECT charge_id, state, amount::text, currency, idempotency_key, created_at FROM psp_charges WHERE reference = $1::text ORDER BY created_at`, false},
		{"provider refunds (psp_refunds)", "psp_refunds", `SELECT r.refund_id, r.state, r.charge_id, r.idempotency_key, r.created_at FROM psp_refunds r JOIN psp_charges c ON c.charge_id = r.charge_id WHERE c.reference = $1::text ORDER BY r.created_at`, false},
		{"dead letters", "dead_letters", `SELECT id, consumer, message_id, attempts, error, created_at, replayed_at FROM dead_letters WHERE order_id = $1 ORDER BY id`, false},
		{"compensator actions", "compensator_actions", `SELECT created_at, action, from_status, attempt, actor, reason FROM compensator_actions WHERE order_id = $1 ORDER BY id`, false},
		{"webhook deliveries", "webhook_deliveries", `SELECT seq, webhook_id, status, attempts, last_status_code, last_error, delivered_at FROM webhook_deliveries WHERE order_id = $1 ORDER BY seq`, false},
	}
	for _, s := range steps {
		var arg any = id
		if s.byPrefix {
			arg = prefix
		}
		if err := section(ctx, tx, w, s.title, s.table, s.sql, arg); err != nil {
			return fmt.Errorf("inspect order %s: %w", id, err)
		}
	}
	return nil
}

func deref2(t *time.Time) any {
	if t == nil {
		return nil
	}
	return *t
}

// Stats prints the status distribution, the open orders past stuckAfter
// per state, the oldest open order, dead letters, webhook failures, the
// outbox backlog, the compensator's recent actions, payments and the
// idempotency tokens by state.
func Stats(ctx context.Context, pool *pgxpool.Pool, stuckAfter time.Duration, w io.Writer) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("begin read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	secs := stuckAfter.Seconds()
	parts := []struct{ title, table, sql string }{
		{"orders by status", "", `SELECT s.status, count(o.order_id) AS orders
			FROM unnest(ARRAY['processing','reserved','paid','confirmed','rejected','cancelled']) WITH ORDINALITY AS s(status, n)
			LEFT JOIN orders o ON o.status = s.status GROUP BY s.status, s.n ORDER BY s.n`},
		{fmt.Sprintf("open orders without progress for %s, counted from the broker's return after an outage (stuck)", stuckAfter), "", `SELECT s.status,
			count(o.order_id) FILTER (WHERE ` + sinceExpr + ` <= now() - make_interval(secs => $1::float8)) AS stuck,
			count(o.order_id) AS open,
			coalesce(max(o.redrive_attempts) FILTER (WHERE o.redrive_status = s.status), 0) AS max_redrives,
			coalesce(date_trunc('second', now() - min(o.created_at))::text, '-') AS oldest
			FROM unnest(ARRAY['processing','reserved','paid']) WITH ORDINALITY AS s(status, n)
			LEFT JOIN orders o ON o.status = s.status GROUP BY s.status, s.n ORDER BY s.n`},
		{"dead letters by consumer", "dead_letters", `SELECT consumer, count(*) AS total, count(*) FILTER (WHERE replayed_at IS NULL) AS not_replayed,
			max(created_at) AS latest FROM dead_letters GROUP BY consumer ORDER BY consumer`},
		{"webhook deliveries by status", "webhook_deliveries", `SELECT status, count(*) AS deliveries, max(created_at) AS latest FROM webhook_deliveries GROUP BY status ORDER BY status`},
		{"outbox", "", `SELECT count(*) FILTER (WHERE published_at IS NULL) AS pending, min(created_at) FILTER (WHERE published_at IS NULL) AS oldest_pending FROM outbox`},
		{"compensator actions in the last 24h", "compensator_actions", `SELECT action, count(*) AS actions, max(created_at) AS latest FROM compensator_actions
			WHERE created_at > now() - interval '24 hours' GROUP BY action ORDER BY action`},
		{"payments by status", "payments", `SELECT status, count(*) AS payments FROM payments GROUP BY status ORDER BY status`},
		{"idempotency tokens by state", "idempotency_tokens", `SELECT s.state, count(t.token) AS tokens
			FROM unnest(ARRAY['unused','processing','used','expired']) WITH ORDINALITY AS s(state, n)
			LEFT JOIN idempotency_tokens t ON (CASE WHEN t.state = 'unused' AND t.expires_at <= now() THEN 'expired' ELSE t.state END) = s.state
			GROUP BY s.state, s.n ORDER BY s.n`},
	}
	for _, p := range parts {
		var args []any
		if strings.Contains(p.sql, "$1") {
			args = []any{secs}
		}
		if err := section(ctx, tx, w, p.title, p.table, p.sql, args...); err != nil {
			return fmt.Errorf("order stats: %w", err)
		}
	}
	return nil
}

func callbackOrNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
