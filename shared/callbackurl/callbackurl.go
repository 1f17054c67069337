// Package callbackurl is the one rule for a client's callback URL: the
// intake refuses what this package refuses, and the webhook sender checks
// the same rule again before every send (plus, on its own, the resolved
// address at dial time). It imports nothing of the project so that the
// domain package (shared/order) and the sender (consumers/webhook) can both
// use it.
package callbackurl

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// MaxLen is the longest callback URL accepted, in bytes.
const MaxLen = 2048

// ErrForbiddenAddress is returned (wrapped) when a callback would reach an
// address that is not public: loopback, private, link-local, CGNAT,
// multicast, unspecified, documentation or otherwise reserved ranges.
var ErrForbiddenAddress = errors.New("callback address is not a public address")

// ErrForbiddenURL is returned (wrapped) by Check for a callback URL that
// can never be delivered to (not https, credentials in it, no host, a host
// that is neither a name nor a canonical IP literal, …).
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
	netip.MustParsePrefix("::/96"),              // unspecified and IPv4-compatible (deprecated)
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
// reserved range, without a zone. IPv4-mapped IPv6 addresses are refused
// outright.
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

// Check validates a callback URL before it is stored or sent to:
//
//   - at most MaxLen bytes, absolute, https (http too when allowPrivate);
//   - a host and, if given, a port from 1 to 65535; no user info, no
//     fragment (not even an empty one);
//   - a host that a browser (the WHATWG URL standard) would read as an
//     IPv4 address must be written as that address in dotted-quad form:
//     "127.1", "0x7f000001", "2130706433" or "017700000001" are refused,
//     since they name an address that name resolution does not find, and
//     a host that ends in a number but is not an IPv4 address ("a.1",
//     "1.2.3.4.5") is not a valid host either;
//   - unless allowPrivate: not "localhost" or a name under it, and an IP
//     literal (after the same IDNA mapping the HTTP client applies) must
//     be a PublicAddr (a zone is never public).
//
// A host name is checked again, on the resolved address, when dialing.
// Errors wrap ErrForbiddenURL or ErrForbiddenAddress.
func Check(raw string, allowPrivate bool) error {
	_, err := Parse(raw, allowPrivate)
	return err
}

// Parse is Check that also returns the parsed URL.
func Parse(raw string, allowPrivate bool) (*url.URL, error) {
	if len(raw) > MaxLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrForbiddenURL, MaxLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: not a valid URL", ErrForbiddenURL)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowPrivate:
	case u.Scheme == "http":
		return nil, fmt.Errorf("%w: must use https", ErrForbiddenURL)
	default:
		return nil, fmt.Errorf("%w: must be an absolute https URL", ErrForbiddenURL)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: no host", ErrForbiddenURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: user info is not allowed", ErrForbiddenURL)
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return nil, fmt.Errorf("%w: fragment is not allowed", ErrForbiddenURL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: port %q out of range", ErrForbiddenURL, p)
		}
	}
	host := u.Hostname()
	bracketed := strings.HasPrefix(u.Host, "[")
	if !bracketed {
		// The HTTP client maps a host with IDNA before it resolves or dials
		// it (full-width digits become ASCII ones …): judge what it dials.
		// Like the client, map only a name that is not ASCII already.
		if !isASCII(host) {
			ascii, err := idna.Lookup.ToASCII(host)
			if err != nil {
				return nil, fmt.Errorf("%w: host %q is not a valid name", ErrForbiddenURL, host)
			}
			host = ascii
		}
		host = strings.ToLower(host)
		if endsInNumber(host) {
			a, ok := whatwgIPv4(host)
			if !ok {
				return nil, fmt.Errorf("%w: host %q ends in a number but is not an IPv4 address", ErrForbiddenURL, host)
			}
			if a.String() != host {
				return nil, fmt.Errorf("%w: host %q is the IPv4 address %s; write it as %s", ErrForbiddenURL, host, a, a)
			}
		}
	}
	if allowPrivate {
		return u, nil
	}
	name := strings.TrimSuffix(host, ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return nil, fmt.Errorf("%w: %s", ErrForbiddenAddress, name)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !PublicAddr(a) {
			return nil, fmt.Errorf("%w: %s", ErrForbiddenAddress, a)
		}
	} else if bracketed {
		return nil, fmt.Errorf("%w: %q is not an IPv6 address", ErrForbiddenURL, host)
	}
	return u, nil
}

// endsInNumber is the WHATWG URL standard's "ends in a number" test: the
// last dot-separated label (a trailing empty one dropped) is all digits
// or parses as an IPv4 number ("0x1f").
func endsInNumber(host string) bool {
	parts := strings.Split(host, ".")
	if parts[len(parts)-1] == "" {
		if len(parts) == 1 {
			return false
		}
		parts = parts[:len(parts)-1]
	}
	last := parts[len(parts)-1]
	if last != "" && strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, ok := ipv4Number(last)
	return ok
}

// whatwgIPv4 is the WHATWG URL standard's IPv4 parser: one to four parts,
// each decimal, hex ("0x") or octal (leading "0"); every part but the
// last at most 255, the last filling the remaining bytes.
func whatwgIPv4(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if parts[len(parts)-1] == "" && len(parts) > 1 {
		parts = parts[:len(parts)-1]
	}
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, ok := ipv4Number(p)
		if !ok {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	for _, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
	}
	last := nums[len(nums)-1]
	if last >= uint64(1)<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v := last
	for i, n := range nums[:len(nums)-1] {
		v += n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// ipv4Number parses one part of a WHATWG IPv4 host.
func ipv4Number(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		// Too large for 64 bits is still a number (and out of range).
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 1 << 40, true
		}
		return 0, false
	}
	return n, true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// Redacted replaces a callback URL's query, user info and fragment, where
// clients put tokens, in what is logged or stored about a delivery.
const Redacted = "REDACTED"

// Redact returns raw fit for logs and error columns: the scheme, host and
// path kept, the query (if any) replaced by REDACTED, user info replaced
// by REDACTED, the fragment dropped. Text that does not parse as a URL is
// replaced as a whole.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL " + Redacted + ")"
	}
	if u.Opaque != "" {
		return u.Scheme + ":" + Redacted
	}
	if u.User != nil {
		u.User = url.User(Redacted)
	}
	if u.RawQuery != "" || u.ForceQuery {
		u.RawQuery, u.ForceQuery = Redacted, false
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// Scrub returns msg with every occurrence of the callback URL raw (as
// given and as net/http prints it) replaced by Redact(raw), and its query
// ("?…") and user info ("…@") replaced wherever they still appear.
func Scrub(msg, raw string) string {
	if raw == "" {
		return msg
	}
	red := Redact(raw)
	msg = strings.ReplaceAll(msg, raw, red)
	u, err := url.Parse(raw)
	if err != nil {
		return msg
	}
	if s := u.String(); s != raw {
		msg = strings.ReplaceAll(msg, s, red)
	}
	if u.RawQuery != "" {
		msg = strings.ReplaceAll(msg, "?"+u.RawQuery, "?"+Redacted)
	}
	if u.User != nil {
		msg = strings.ReplaceAll(msg, u.User.String()+"@", Redacted+"@")
	}
	return msg
}
