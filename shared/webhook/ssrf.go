package webhook

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrForbiddenAddress is returned (wrapped) when a callback would reach an
// address that is not public: loopback, private, link-local, CGNAT,
// multicast, unspecified, documentation or otherwise reserved ranges.
var ErrForbiddenAddress = errors.New("callback address is not a public address")

// ErrForbiddenURL is returned (wrapped) by CheckURL for a callback URL that
// can never be delivered to (not https, credentials in it, no host, …).
var ErrForbiddenURL = errors.New("callback URL not allowed")

// blocked lists the ranges that are not public unicast besides what
// netip.Addr's predicates catch (loopback, private, link-local, multicast,
// unspecified).
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),      // CGNAT (RFC 6598)
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),       // TEST-NET-1
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),    // TEST-NET-2
	netip.MustParsePrefix("203.0.113.0/24"),     // TEST-NET-3
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),       // NAT64: may embed a private IPv4
	netip.MustParsePrefix("64:ff9b:1::/48"),     // local-use NAT64
	netip.MustParsePrefix("100::/64"),           // discard
	netip.MustParsePrefix("2001::/23"),          // IETF protocol assignments (Teredo, ORCHID …)
	netip.MustParsePrefix("2001:db8::/32"),      // documentation
	netip.MustParsePrefix("2002::/16"),          // 6to4: may embed a private IPv4
	netip.MustParsePrefix("fc00::/7"),           // unique local (ULA)
	netip.MustParsePrefix("fec0::/10"),          // site-local (deprecated)
	netip.MustParsePrefix("::/128"),             // unspecified
	netip.MustParsePrefix("::ffff:0:0/96"),      // IPv4-mapped: refused whatever it maps to
	netip.MustParsePrefix("::ffff:0:0:0/96"),    // IPv4-translated
	netip.MustParsePrefix("5f00::/16"),          // SRv6 SIDs
	netip.MustParsePrefix("3fff::/20"),          // documentation (2024)
	netip.MustParsePrefix("2620:4f:8000::/48"),  // AS112 DNS sinks
	netip.MustParsePrefix("192.31.196.0/24"),    // AS112
	netip.MustParsePrefix("192.52.193.0/24"),    // AMT
	netip.MustParsePrefix("192.175.48.0/24"),    // AS112 direct delegation
	netip.MustParsePrefix("255.255.255.255/32"), // limited broadcast
}

// PublicAddr reports whether a callback may connect to addr: a global
// unicast address outside every private, shared, documentation and
// reserved range. IPv4-mapped IPv6 addresses are refused outright.
func PublicAddr(addr netip.Addr) bool {
	if !addr.IsValid() || addr.Zone() != "" {
		return false
	}
	if addr.Is4In6() {
		return false
	}
	if !addr.IsGlobalUnicast() || addr.IsPrivate() || addr.IsLoopback() ||
		addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() ||
		addr.IsInterfaceLocalMulticast() || addr.IsMulticast() || addr.IsUnspecified() {
		return false
	}
	for _, p := range blocked {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// dialControl is the net.Dialer Control hook: it runs after DNS resolution,
// on the very address about to be connected to, before the connect system
// call, so a name that resolves (or re-resolves, DNS rebinding) to a private
// address is refused without a packet being sent to it.
func dialControl(network, address string, _ syscall.RawConn) error {
	if network != "tcp4" && network != "tcp6" {
		return fmt.Errorf("dial %s %s: %w (network not allowed)", network, address, ErrForbiddenAddress)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w (unparsable address)", address, ErrForbiddenAddress)
	}
	if !PublicAddr(ap.Addr()) {
		return fmt.Errorf("dial %s: %w", address, ErrForbiddenAddress)
	}
	return nil
}

// ClientOptions configures NewClient.
type ClientOptions struct {
	// AllowPrivate lets callbacks use http and reach any address (dev and
	// tests only: ORDERPIPE_ALLOW_PRIVATE_CALLBACKS).
	AllowPrivate bool
	// Timeout bounds a whole request: dial, TLS, sending, the response
	// headers and reading the bounded body. Default 10s.
	Timeout time.Duration
	// TLSConfig replaces the default TLS configuration (tests pass one that
	// trusts their server's certificate).
	TLSConfig *tls.Config
}

// MaxResponseBody is the most bytes of a receiver's response that are
// read; the rest is dropped with the connection.
const MaxResponseBody = 64 << 10

// NewClient returns the HTTP client that sends callbacks: the dial-time
// address check (unless AllowPrivate), no proxy, no redirects followed (the
// 3xx answer is returned as is and counts as a failed attempt), bounded
// time. Read responses through ReadBounded.
func NewClient(opts ClientOptions) *http.Client {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second}
	if !opts.AllowPrivate {
		dialer.Control = dialControl
	}
	tr := &http.Transport{
		Proxy:                  nil, // a proxy would dial on our behalf, past the check
		DialContext:            dialer.DialContext,
		TLSClientConfig:        opts.TLSConfig,
		TLSHandshakeTimeout:    opts.Timeout,
		ResponseHeaderTimeout:  opts.Timeout,
		ExpectContinueTimeout:  time.Second,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 16 << 10,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   opts.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// CheckURL validates a callback URL before it is stored or sent to: https
// (http only when allowPrivate), a host, no user info, no fragment, at most
// 2048 bytes; an IP literal must be public (unless allowPrivate). A host
// name is checked again, on the resolved address, when dialing.
func CheckURL(raw string, allowPrivate bool) error {
	if len(raw) > 2048 {
		return fmt.Errorf("%w: longer than 2048 bytes", ErrForbiddenURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrForbiddenURL, err)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowPrivate:
	default:
		return fmt.Errorf("%w: scheme must be https, got %q", ErrForbiddenURL, u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("%w: no host", ErrForbiddenURL)
	}
	if u.User != nil {
		return fmt.Errorf("%w: user info is not allowed", ErrForbiddenURL)
	}
	if u.Fragment != "" {
		return fmt.Errorf("%w: fragment is not allowed", ErrForbiddenURL)
	}
	if allowPrivate {
		return nil
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, host)
	}
	if a, err := netip.ParseAddr(host); err == nil && !PublicAddr(a) {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, a)
	}
	return nil
}

// checkSendURL is CheckURL at send time, with the context that the dialer
// cannot give: the scheme.
func checkSendURL(raw string, allowPrivate bool) (*url.URL, error) {
	if err := CheckURL(raw, allowPrivate); err != nil {
		return nil, err
	}
	return url.Parse(raw)
}
