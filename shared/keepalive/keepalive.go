// Package keepalive gives the HTTP transport of a process that calls one
// service from many goroutines at once: the payment provider from every
// payment worker, the intake from a shop backend's handlers.
//
// net/http's default transport keeps two idle connections per host. Of a
// round of concurrent calls to one host all but two then close their
// connection after the answer, and the next round dials again (and, over
// TLS, shakes hands again): most calls pay for a new connection.
package keepalive

import "net/http"

// IdlePerHost is how many idle connections Transport keeps per host. A
// connection is kept idle only once a call opened it, so the idle ones
// never outnumber the calls that ran at once; they close after the
// default transport's 90 s unused.
const IdlePerHost = 1024

// Transport returns a transport with the default one's settings (proxy
// from the environment, dial and TLS timeouts, HTTP/2) that keeps up to
// IdlePerHost idle connections per host. The pool is the transport's:
// build one per process and share it between the clients that call the
// same service.
func Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = IdlePerHost
	tr.MaxIdleConnsPerHost = IdlePerHost
	return tr
}
