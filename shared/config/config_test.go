package config

import (
	"strings"
	"testing"
	"time"
)

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := fromLookup(lookup(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8080" || c.DataDir != ".data" || c.StreamReplicas != 1 || c.AllowPrivateCallbacks || c.DBMaxConns != DefaultDBMaxConns {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestMalformed(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, value string }{
		{EnvAllowPrivateCallbacks, "maybe"},
		{EnvStreamReplicas, "2"},
		{EnvShutdownTimeout, "-1s"},
		{EnvLogFormat, "xml"},
		{EnvLogLevel, "loud"},
		{EnvOTLPEndpoint, "otel-collector:4318"},
		{EnvPSPURL, "psp:8090"},
		{EnvPSPURL, "localhost:8090"},
		{EnvPSPURL, "ftp://x"},
		{EnvPSPURL, "http://"},
		{EnvPSPURL, "//psp:8090"},
		{EnvDBMaxConns.Name, "0"},
		{EnvDBMaxConns.Name, "10001"},
		{EnvDBMaxConns.Name, "4294967297"}, // a pool of 1 once truncated to int32
		{EnvDevNATSSyncAlways, "sometimes"},
		{EnvDevPGStatements, "maybe"},
	}
	for _, c := range cases {
		_, err := fromLookup(lookup(map[string]string{c.name: c.value}))
		if err == nil || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), c.value) {
			t.Errorf("%s=%q: err = %v, want one naming the variable and the value", c.name, c.value, err)
		}
	}
	for _, bad := range []string{"psp:8090", "ftp://x"} {
		_, err := fromLookup(lookup(map[string]string{EnvPSPURL: bad}))
		if err == nil || !strings.Contains(err.Error(), "PSP_URL: want an http(s) URL") {
			t.Errorf("PSP_URL=%q: err = %v", bad, err)
		}
	}
	for _, good := range []string{"http://psp:8080", "https://psp.example/v2/", "http://127.0.0.1:8090"} {
		if c, err := fromLookup(lookup(map[string]string{EnvPSPURL: good})); err != nil || c.PSPURL != good {
			t.Errorf("PSP_URL=%q: %+v, %v", good, c.PSPURL, err)
		}
	}
}

func TestRequire(t *testing.T) {
	t.Parallel()
	err := Config{}.Require(EnvDatabaseURL, EnvNATSURL)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL, NATS_URL") {
		t.Fatalf("Require: %v", err)
	}
	if err := (Config{DatabaseURL: "x", NATSURL: "y"}).Require(EnvDatabaseURL, EnvNATSURL); err != nil {
		t.Fatal(err)
	}
}

// A Setting's default is written once: Vars documents it and Get returns
// it when the variable is unset; a malformed value names the variable.
func TestSettings(t *testing.T) {
	d := DurationSetting("ORDERPIPE_TEST_SETTING_D", "a test duration", 15*time.Minute)
	n := IntSetting("ORDERPIPE_TEST_SETTING_N", "a test integer", 8, 2)
	db := DurationSettingBetween("ORDERPIPE_TEST_SETTING_DB", "a bounded test duration", time.Minute, time.Second, 24*time.Hour)
	nb := IntSettingBetween("ORDERPIPE_TEST_SETTING_NB", "a bounded test integer", 8, 1, 100)
	doc := map[string]string{}
	for _, v := range Vars() {
		doc[v.Name] = v.Default
	}
	if doc[d.Name] != "15m" || doc[n.Name] != "8" {
		t.Fatalf("documented defaults %q and %q", doc[d.Name], doc[n.Name])
	}
	env := lookup(map[string]string{})
	if v, err := d.lookup(env); err != nil || v != 15*time.Minute {
		t.Fatalf("unset duration: %v %v", v, err)
	}
	if v, err := n.lookup(lookup(map[string]string{n.Name: " 5 "})); err != nil || v != 5 {
		t.Fatalf("set integer: %v %v", v, err)
	}
	for _, bad := range []struct {
		s   interface{ String() string }
		get func() error
	}{
		{d, func() error { _, err := d.lookup(lookup(map[string]string{d.Name: "soon"})); return err }},
		{d, func() error { _, err := d.lookup(lookup(map[string]string{d.Name: "-1s"})); return err }},
		{n, func() error { _, err := n.lookup(lookup(map[string]string{n.Name: "1"})); return err }},
		{n, func() error { _, err := n.lookup(lookup(map[string]string{n.Name: "many"})); return err }},
	} {
		if err := bad.get(); err == nil || !strings.Contains(err.Error(), bad.s.String()) {
			t.Errorf("malformed %s: %v", bad.s, err)
		}
	}
	for v, want := range map[string]time.Duration{"": time.Minute, "1s": time.Second, "24h": 24 * time.Hour} {
		if got, err := db.lookup(lookup(map[string]string{db.Name: v})); err != nil || got != want {
			t.Errorf("%s=%q: %s, %v; want %s", db.Name, v, got, err, want)
		}
	}
	for _, v := range []string{"1ms", "0.5s", "25h", "soon", "-1s", "0"} {
		_, err := db.lookup(lookup(map[string]string{db.Name: v}))
		if want := db.Name + `: want a duration between 1s and 24h, got "` + v + `"`; err == nil || err.Error() != want {
			t.Errorf("%s=%q: %v, want %q", db.Name, v, err, want)
		}
	}
	for v, want := range map[string]int{"": 8, "1": 1, "100": 100} {
		if got, err := nb.lookup(lookup(map[string]string{nb.Name: v})); err != nil || got != want {
			t.Errorf("%s=%q: %d, %v; want %d", nb.Name, v, got, err, want)
		}
	}
	for _, v := range []string{"0", "101", "4294967297", "x"} {
		_, err := nb.lookup(lookup(map[string]string{nb.Name: v}))
		if want := nb.Name + `: want an integer between 1 and 100, got "` + v + `"`; err == nil || err.Error() != want {
			t.Errorf("%s=%q: %v, want %q", nb.Name, v, err, want)
		}
	}
	for in, want := range map[time.Duration]string{5 * time.Second: "5s", 15 * time.Minute: "15m", 2 * time.Hour: "2h", 90 * time.Second: "1m30s"} {
		if got := FormatDuration(in); got != want {
			t.Errorf("FormatDuration(%s) = %q, want %q", in, got, want)
		}
	}
}

// FillZero replaces only zero fields, FillNotPositive negative numbers too;
// a zero default leaves a field alone.
func TestFill(t *testing.T) {
	t.Parallel()
	type opts struct {
		D    time.Duration
		N    int
		F    float64
		S    string
		Keep int
	}
	defaults := opts{D: time.Second, N: 3, F: 0.5, S: "s"}
	zero := opts{D: 0, N: -1, F: 2, Keep: -7}
	FillZero(&zero, defaults)
	if want := (opts{D: time.Second, N: -1, F: 2, S: "s", Keep: -7}); zero != want {
		t.Errorf("FillZero: %+v, want %+v", zero, want)
	}
	neg := opts{D: -time.Second, N: -1, F: -2, S: "x", Keep: -7}
	FillNotPositive(&neg, defaults)
	if want := (opts{D: time.Second, N: 3, F: 0.5, S: "x", Keep: -7}); neg != want {
		t.Errorf("FillNotPositive: %+v, want %+v", neg, want)
	}
}
