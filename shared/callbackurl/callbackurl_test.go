package callbackurl_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"orderpipe/shared/callbackurl"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestPublicAddr(t *testing.T) {
	t.Parallel()
	refused := []string{
		"127.0.0.1", "127.1.2.3", "10.0.0.1", "10.255.255.255", "172.16.0.1", "172.31.255.254",
		"192.168.0.1", "169.254.169.254", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3",
		"224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1", "192.0.2.1", "198.51.100.7",
		"203.0.113.9", "198.18.0.1", "198.19.255.254", "192.0.0.8",
		"::1", "::", "::7f00:1", "fd00::1", "fc00::1", "fe80::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:8.8.8.8",
		"64:ff9b::a00:1", "64:ff9b::7f00:1", "2002:a00:1::1", "2002:7f00:1::", "2001:db8::1", "3fff::1", "fec0::1", "100::1",
	}
	for _, s := range refused {
		if callbackurl.PublicAddr(netip.MustParseAddr(s)) {
			t.Errorf("PublicAddr(%s) = true, want false", s)
		}
	}
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "93.184.215.14", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "2a00:1450:4001::1"} {
		if !callbackurl.PublicAddr(netip.MustParseAddr(s)) {
			t.Errorf("PublicAddr(%s) = false, want true", s)
		}
	}
	if callbackurl.PublicAddr(netip.Addr{}) {
		t.Error("the zero Addr is public")
	}
	if callbackurl.PublicAddr(netip.MustParseAddr("fe80::1%eth0")) {
		t.Error("a zoned address is public")
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url          string
		allowPrivate bool
		ok           bool
	}{
		{"https://shop.example/hooks/orders", false, true},
		{"https://shop.example:8443/h?x=1", false, true},
		{"https://8.8.8.8/h", false, true},
		{"https://[2606:4700:4700::1111]/h", false, true},
		{"https://b\u00fccher.example/h", false, true},
		{"https://my_host.example/h", false, true},
		{"https://1.2.3.example/h", false, true},
		{"https://0x.example/h", false, true},
		{"http://shop.example/h", false, false},
		{"http://shop.example/h", true, true},
		{"http://127.0.0.1:9/h", true, true},
		{"http://[::1]:9/h", true, true},
		{"ftp://shop.example/h", true, false},
		{"https://user:pw@shop.example/h", false, false},
		{"https://shop.example/h#frag", false, false},
		{"https://shop.example/h#", false, false},
		{"https:///nohost", false, false},
		{"https://:443/h", false, false},
		{"https://shop.example:0/h", false, false},
		{"https://shop.example:65536/h", false, false},
		{"shop.example/h", false, false},
		{"/hooks", false, false},
		{"", false, false},
		{"https://shop.example/" + strings.Repeat("a", 2100), false, false},
		{"https://shop example/h", false, false},
		{"https://%zz/h", false, false},
		{"mailto:a@b.c", true, false},
		// Hosts that end in a number but are not IPv4 addresses, and
		// non-canonical IPv4 forms: refused even with private allowed, since
		// name resolution never finds them.
		{"https://1.2.3.4.5/h", false, false},
		{"https://shop.1/h", false, false},
		{"https://shop.0x1f/h", false, false},
		{"https://08.8.8.8/h", false, false},
		{"https://256.1.1.1/h", false, false},
		{"https://1.2.3.256/h", false, false},
		{"https://4294967296/h", false, false},
		{"https://99999999999999999999999/h", false, false},
		{"https://0x08080808/h", false, false},
		{"http://127.1:9/h", true, false},
		{"http://2130706433/h", true, false},
	} {
		err := callbackurl.Check(tc.url, tc.allowPrivate)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q, %v) = %v, want ok=%v", tc.url, tc.allowPrivate, err, tc.ok)
		}
		if err != nil && !errors.Is(err, callbackurl.ErrForbiddenURL) && !errors.Is(err, callbackurl.ErrForbiddenAddress) {
			t.Errorf("Check(%q): error %v wraps neither sentinel", tc.url, err)
		}
	}
	for _, u := range testenv.RefusedCallbackURLs() {
		if err := callbackurl.Check(u, false); err == nil {
			t.Errorf("Check(%q, false) = nil, want a refusal", u)
		}
	}
}

func TestCheckExplainsNumericHosts(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]string{
		"0x7f000001":   "127.0.0.1",
		"2130706433":   "127.0.0.1",
		"017700000001": "127.0.0.1",
		"127.1":        "127.0.0.1",
		"0x08080808":   "8.8.8.8",
		"1.0x2.03":     "1.2.0.3",
	} {
		err := callbackurl.Check("https://"+host+"/h", true)
		if err == nil || !strings.Contains(err.Error(), "write it as "+want) {
			t.Errorf("Check(https://%s/h) = %v, want it to name %s", host, err, want)
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"https://shop.example/h", "http://127.0.0.1/", "https://[::1]:8/", "https://u@h/", "%", "https://0x7f.1/"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, allow bool) {
		u, err := callbackurl.Parse(s, allow)
		if err != nil {
			return
		}
		if !allow && u.Scheme != "https" {
			t.Fatalf("Check(%q) accepted a non-https URL", s)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && !allow && !callbackurl.PublicAddr(a) {
			t.Fatalf("Check(%q) accepted the non-public literal %s", s, a)
		}
	})
}

func TestRedact(t *testing.T) {
	t.Parallel()
	testenv.Mapping(t, "Redact", callbackurl.Redact, map[string]string{
		"https://shop.example/hooks?token=s3cret&x=1": "https://shop.example/hooks?REDACTED",
		"https://shop.example/hooks":                  "https://shop.example/hooks",
		"https://shop.example/hooks?":                 "https://shop.example/hooks?REDACTED",
		"https://u:pw@shop.example/h?t=1#frag":        "https://REDACTED@shop.example/h?REDACTED",
		"https://shop.example:8443/a/b#tok":           "https://shop.example:8443/a/b",
		"mailto:a@b.c?x":                              "mailto:REDACTED",
		"https://%zz/h?token=s3cret":                  "(unparsable URL REDACTED)",
	})
}

func TestScrub(t *testing.T) {
	t.Parallel()
	raw := "https://shop.example/h?token=s3cret"
	testenv.Mapping(t, "Scrub", func(msg string) string { return callbackurl.Scrub(msg, raw) }, map[string]string{
		`Post "https://shop.example/h?token=s3cret": EOF`: `Post "https://shop.example/h?REDACTED": EOF`,
		`dial: lookup shop.example: no such host`:         `dial: lookup shop.example: no such host`,
		`something about ?token=s3cret`:                   `something about ?REDACTED`,
	})
	if got := callbackurl.Scrub("x", ""); got != "x" {
		t.Errorf("Scrub with no URL = %q", got)
	}
}
