package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// baselineTable is the scratch table's definition: an order row as a
// shop without idempotency would write it (generated key, unique order
// number), durable like the orders table.
const baselineTable = `CREATE TABLE %s (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_no   text NOT NULL UNIQUE,
	user_id    bigint NOT NULL,
	items      jsonb NOT NULL,
	amount     numeric(20, 2) NOT NULL,
	currency   text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`

// openBaselinePool opens a pool of exactly n connections on the stack's
// database, all connected before it returns.
func openBaselinePool(ctx context.Context, dsn string, n int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("parse the database URL: not a PostgreSQL connection string")
	}
	cfg.MaxConns, cfg.MinConns = int32(n), int32(n)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create the baseline pool: %w", err)
	}
	// Connect all n now, so that the first seconds of the run do not pay
	// for connection set-up.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Release()
			_, errs[i] = c.Exec(ctx, "SELECT 1")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// runBaseline is the article's plain path: s.Concurrency clients, each
// running one single-row INSERT per transaction (autocommit) into a
// scratch table, for s.Duration. The table is created first and dropped
// after, whatever happens.
func runBaseline(ctx context.Context, s Settings, progress io.Writer, round int) (run Measurement, err error) {
	pool, err := openBaselinePool(ctx, s.DatabaseURL, s.Concurrency)
	if err != nil {
		return Measurement{}, err
	}
	defer pool.Close()
	name := strings.ReplaceAll(newRunID(), "-", "_")
	table := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, fmt.Sprintf(baselineTable, table)); err != nil {
		return Measurement{}, fmt.Errorf("create the scratch table %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := pool.Exec(dctx, "DROP TABLE IF EXISTS "+table); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop the scratch table %s: %w", name, derr))
		}
	}()
	insert := "INSERT INTO " + table + " (order_no, user_id, items, amount, currency) VALUES ($1, $2, $3, $4, $5)"
	items := []byte(`[{"sku":"SKU-1","quantity":1}]`)

	c := newCollector("baseline", s.Concurrency, pool)
	rctx, cancel := context.WithTimeout(ctx, s.Duration)
	defer cancel()
	results := make(chan *vegeta.Result, 1024)
	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)
	for range s.Concurrency {
		wg.Go(func() {
			for rctx.Err() == nil {
				i := n.Add(1)
				t0 := time.Now()
				_, err := pool.Exec(ctx, insert, fmt.Sprintf("%s-%d", name, i), i, items, "39.98", "CNY")
				res := &vegeta.Result{Timestamp: t0, Latency: time.Since(t0), Code: 200}
				if err != nil {
					res.Code, res.Error = 0, err.Error()
				}
				results <- res
			}
		})
	}
	go func() {
		wg.Wait()
		close(results)
	}()
	run = c.collect(results, progress, nil)
	run.Round = round
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	var rows int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
		return run, fmt.Errorf("count the scratch table's rows: %w", err)
	}
	run.OrdersInDB = rows
	if rows != run.OK {
		run.Errors = append(run.Errors, fmt.Sprintf("%d inserts committed, %d rows in the table", run.OK, rows))
	}
	return run, nil
}
