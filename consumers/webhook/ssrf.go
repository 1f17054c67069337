package webhook

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"

	"orderpipe/shared/callbackurl"
)

// ErrForbiddenAddress is returned (wrapped) when a callback would reach an
// address that is not public; it is callbackurl.ErrForbiddenAddress.
var ErrForbiddenAddress = callbackurl.ErrForbiddenAddress

// ErrForbiddenURL is returned (wrapped) by CheckURL for a callback URL that
// can never be delivered to; it is callbackurl.ErrForbiddenURL.
var ErrForbiddenURL = callbackurl.ErrForbiddenURL

// PublicAddr reports whether a callback may connect to addr
// (callbackurl.PublicAddr).
func PublicAddr(addr netip.Addr) bool { return callbackurl.PublicAddr(addr) }

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
		Proxy:                 nil, // a proxy would dial on our behalf, past the check
		DialContext:           dialer.DialContext,
		TLSClientConfig:       opts.TLSConfig,
		TLSHandshakeTimeout:   opts.Timeout,
		ResponseHeaderTimeout: opts.Timeout,
		ExpectContinueTimeout: time.Second,
		// As many idle per host as in all: many clients may share one
		// receiver, sent to by every worker at once, and each send that
		// found no idle connection dialled and shook hands anew. Idle
		// connections are only those that sends opened at once; they
		// close after IdleConnTimeout.
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    100,
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

// CheckURL validates a callback URL before it is sent to, by the same
// rule the intake applies (callbackurl.Check). A host name is checked
// again, on the resolved address, when dialing.
func CheckURL(raw string, allowPrivate bool) error {
	return callbackurl.Check(raw, allowPrivate)
}

// checkSendURL is CheckURL at send time, returning the parsed URL.
func checkSendURL(raw string, allowPrivate bool) (*url.URL, error) {
	return callbackurl.Parse(raw, allowPrivate)
}
