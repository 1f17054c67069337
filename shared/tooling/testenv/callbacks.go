package testenv

// RefusedCallbackURLs returns callback URLs that must be refused with
// private callbacks off: by callbackurl.Check, which delivery applies, and
// so by the intake, which must not accept an order whose callback can never
// be delivered. The callbackurl and producer tests both send this list.
func RefusedCallbackURLs() []string {
	return []string{
		"https://127.0.0.1/h",
		"https://10.1.2.3/h",
		"https://[::1]/h",
		"https://[::ffff:10.0.0.1]/h",
		"https://localhost/h",
		"https://LOCALHOST./h",
		"https://a.b.localhost/h",
		"https://100.64.0.1/h",            // CGNAT
		"https://192.0.2.1/h",             // TEST-NET-1
		"https://198.51.100.1/h",          // TEST-NET-2
		"https://203.0.113.1/h",           // TEST-NET-3
		"https://198.18.0.1/h",            // benchmarking
		"https://240.0.0.1/h",             // reserved
		"https://255.255.255.255/h",       // broadcast
		"https://0.0.0.0/h",               // this network
		"https://0.1.2.3/h",               // this network
		"https://[64:ff9b::7f00:1]/h",     // NAT64 of 127.0.0.1
		"https://[2002:7f00:1::]/h",       // 6to4 of 127.0.0.1
		"https://[2001:db8::1]/h",         // documentation
		"https://[fe80::1%25eth0]/h",      // link-local with a zone
		"https://[2606:4700::1%25eth0]/h", // a zone on a public address
		"https://0x7f000001/h",            // WHATWG: 127.0.0.1
		"https://2130706433/h",            // WHATWG: 127.0.0.1
		"https://017700000001/h",          // WHATWG: 127.0.0.1
		"https://127.1/h",                 // WHATWG: 127.0.0.1
		"https://127.0.1/h",
		"https://0177.0.0.1/h",
		"https://0x7f.1/h",
		"https://127.0.0.1./h",
		"https://0/h",
		"https://shop.1/h",                   // ends in a number, not an IPv4 address
		"https://%31%32%37.0.0.1/h",          // percent-encoded
		"https://\uff11\uff12\uff17.0.0.1/h", // full-width digits, mapped by IDNA
	}
}
