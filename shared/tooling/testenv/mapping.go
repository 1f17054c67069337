package testenv

import "testing"

// Mapping checks a string function against a table: for every input in
// cases that fn does not map to its wanted output it reports an error
// naming fn as name, and goes on with the other inputs.
func Mapping(t testing.TB, name string, fn func(string) string, cases map[string]string) {
	t.Helper()
	for in, want := range cases {
		if got := fn(in); got != want {
			t.Errorf("%s(%q) = %q, want %q", name, in, got, want)
		}
	}
}
