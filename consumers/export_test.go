package consumers

// WithoutDedupe returns c with the dedupe pre-check and the
// processed_messages row turned off: the same handlers without their
// dedupe, for BenchmarkStep only. A test build is the only way to it.
func WithoutDedupe(c Config) Config {
	c.noDedupe = true
	return c
}
