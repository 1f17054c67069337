package order

import "testing"

// benchBody is a typical create-order body as the intake receives it:
// three lines, a decimal-string amount and a public https callback.
const benchBody = `{"request_id":"ORD20261202143022a3f9c1","user_id":42,` +
	`"items":[{"sku":"SKU-17","quantity":2},{"sku":"SKU-3","quantity":1},{"sku":"SKU-250","quantity":4}],` +
	`"amount":"129.90","currency":"CNY","callback_url":"https://shop.example/hooks/orders"}`

// BenchmarkDecodeValidate measures the CPU work the intake does on a
// create-order body before it touches the database: DecodeCreateRequest
// (parse, validate, normalise — what POST /v1/orders calls) and the
// request's Fingerprint (what orderstore.InsertBatch stores). No servers:
//
//	go test -run '^$' -bench DecodeValidate -benchmem -count 6 ./shared/order/
func BenchmarkDecodeValidate(b *testing.B) {
	body := []byte(benchBody)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req, err := DecodeCreateRequest(body, DecodeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(req.Fingerprint()) != 32 {
			b.Fatal("fingerprint is not a SHA-256")
		}
	}
}
