package devenv

import (
	"testing"

	"orderpipe/shared/tooling/testenv"
)

// TestSyncAlways: ORDERPIPE_DEV_NATS_SYNC_ALWAYS gives the embedded broker
// sync_interval: always; by default it fsyncs lazily.
func TestSyncAlways(t *testing.T) {
	t.Parallel()
	for _, always := range []bool{false, true} {
		cfg := devConfig(t, testenv.PostgresDataDir(t))
		cfg.DevNATSSyncAlways = always
		s, _ := startStack(t, cfg)
		if got := s.nats.JetStreamConfig().SyncAlways; got != always {
			t.Errorf("DevNATSSyncAlways %v: the broker's SyncAlways is %v", always, got)
		}
	}
}
