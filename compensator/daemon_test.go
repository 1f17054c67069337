package compensator_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"orderpipe/compensator"
	"orderpipe/shared/config"
	"orderpipe/shared/metrics"
	"orderpipe/shared/order"
	"orderpipe/shared/tooling/testenv"
)

// value reads a gauge's or a counter's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// Not parallel: it reads the process-wide metrics.
func TestPassUpdatesMetrics(t *testing.T) {
	w := newWorld(t)
	a := w.newOrder(spec{status: order.StatusReserved})
	b := w.newOrder(spec{status: order.StatusReserved})
	w.newOrder(spec{status: order.StatusPaid})
	w.exec(`UPDATE orders SET created_at = now() - interval '1 hour'`)
	w.age(a, b)
	redrives := value(t, metrics.CompensatorActions.WithLabelValues(string(compensator.KindRedrive)))
	w.pass(w.comp(w.cfg(3), w.psp))
	if got := value(t, metrics.StuckOrders.WithLabelValues("reserved")); got != 2 {
		t.Errorf("stuck reserved %v", got)
	}
	if got := value(t, metrics.StuckOrders.WithLabelValues("paid")); got != 0 {
		t.Errorf("stuck paid %v", got)
	}
	if got := value(t, metrics.CompensatorActions.WithLabelValues(string(compensator.KindRedrive))) - redrives; got != 2 {
		t.Errorf("redrive actions +%v", got)
	}
	if got := testutil.ToFloat64(metrics.OldestOpenOrderAge); got < 3500 || got > 3700 {
		t.Errorf("oldest open order age %v", got)
	}
	// A dry run leaves the gauges alone.
	w.exec(`UPDATE orders SET status = 'confirmed'`)
	cfg := w.cfg(3)
	cfg.DryRun = true
	w.pass(w.comp(cfg, w.psp))
	if got := value(t, metrics.StuckOrders.WithLabelValues("reserved")); got != 2 {
		t.Errorf("a dry run changed the gauge: %v", got)
	}
}

func TestDaemonServesHealthAndMetricsAndStops(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	nats := testenv.OwnNATS(t)
	id := w.newOrder(spec{status: order.StatusProcessing})
	w.exec(`UPDATE orders SET updated_at = now() - interval '2 hours'`)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := config.Config{DatabaseURL: w.db.URL, NATSURL: nats.URL(), PSPURL: w.pspURL, HTTPAddr: addr, ShutdownTimeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := runCtx(ctx, t, compensator.Command(), cfg, "--stuck-after", "1h", "--interval", "1m")
		done <- err
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.WaitFor(t, 20*time.Second, "the daemon's first pass and /readyz", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK && w.int(`SELECT count(*) FROM compensator_actions WHERE order_id = $1`, id) == 1
	})
	testenv.WaitFor(t, 20*time.Second, "the daemon's first pass to end", func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, "orderpipe_compensator_last_success_timestamp_seconds ")
	})
	code, body := get("/metrics")
	for _, name := range []string{"orderpipe_compensator_actions_total", "orderpipe_stuck_orders", "orderpipe_oldest_open_order_age_seconds ",
		"orderpipe_compensator_broker_up ", "orderpipe_refunds_due ", "orderpipe_outbox_oldest_pending_age_seconds "} {
		if code != http.StatusOK || !strings.Contains(body, name) {
			t.Fatalf("/metrics %d lacks %s", code, name)
		}
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	cancel()
	if err := testenv.Receive(t, done, 15*time.Second, "the daemon to stop"); err != nil {
		t.Fatal(err)
	}
}
