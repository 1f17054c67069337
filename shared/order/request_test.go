package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
)

const goodBody = `{"request_id":"ORD20261202143022a3f9c1","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY","callback_url":"https://shop.example/hooks/orders"}`

func TestDecodeCreateRequestGood(t *testing.T) {
	t.Parallel()
	req, err := DecodeCreateRequest([]byte(goodBody), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := CreateRequest{RequestID: "ORD20261202143022a3f9c1", UserID: 42, Items: []Item{{"SKU-1", 2}},
		Amount: AmountFromCents(3998), Currency: "CNY", CallbackURL: "https://shop.example/hooks/orders"}
	if fmt.Sprint(req) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", req, want)
	}
}

// TestDecodeReadsEverySpellingOfABody: the same request written with
// white space everywhere, escapes in member names and values, and members
// in another order decodes to the same request; a name spelled twice, once
// with escapes, is still a duplicate; brackets and quotes inside strings
// do not end a value early.
func TestDecodeReadsEverySpellingOfABody(t *testing.T) {
	t.Parallel()
	want, err := DecodeCreateRequest([]byte(goodBody), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spelled := " \t\r\n{ \"currency\" : \"C\\u004eY\" ,\n \"items\":[ { \"quantity\" : 2 , \"s\\u006bu\":\"SKU-1\" } ] ," +
		"\"amount\":\"39.98\",\"callback_url\":\"https:\\/\\/shop.example\\/hooks\\/orders\",\"user\\u005fid\": 42 ," +
		"\"request_id\" :\"ORD20261202143022a3f9c1\" } \n"
	got, err := DecodeCreateRequest([]byte(spelled), DecodeOptions{})
	if err != nil {
		t.Fatalf("%v\n%s", err, spelled)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !bytes.Equal(got.Fingerprint(), want.Fingerprint()) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}

	cases := map[string]struct{ body, field, says string }{
		"escaped duplicate":    {strings.Replace(goodBody, `"user_id":42`, `"user_id":42,"user\u005fid":42`, 1), "body", `has the field "user_id" twice`},
		"escaped unknown":      {strings.Replace(goodBody, `{`, `{"co\u0075pon":"x",`, 1), "body", `has an unknown field "coupon"`},
		"brackets in a string": {strings.Replace(goodBody, `"amount":"39.98"`, `"amount":"]}\"{[,"`, 1), "amount", "decimal"},
		"empty":                {" \n ", "body", "is empty"},
		"truncated":            {goodBody[:40], "body", "is truncated JSON"},
		"syntax":               {`{"user_id":42,}`, "body", "is not valid JSON (at byte 15)"},
		"trailing":             {goodBody + ` x`, "body", "is not valid JSON"},
		"not an object":        {`[1,2]`, "body", "must be a JSON object"},
	}
	for name, c := range cases {
		_, err := DecodeCreateRequest([]byte(c.body), DecodeOptions{})
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != c.field || !strings.Contains(ve.Fields[0].Message, c.says) {
			t.Errorf("%s: got %v, want %s: …%s…", name, err, c.field, c.says)
		}
	}
}

func TestAmounts(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		`"39.98"`: "39.98", `39.98`: "39.98", `"40"`: "40.00", `40`: "40.00", `"0.01"`: "0.01",
		`"1.500"`: "1.50", `3998e-2`: "39.98", `0.3998E2`: "39.98", `"007.10"`: "7.10",
		`1e2`: "100.00", `"999999999999999.99"`: "999999999999999.99",
		`0.1`: "0.10", `0.2`: "0.20", // the float64 classics, exact here
	}
	for in, want := range good {
		a, err := amountFromJSON(json.RawMessage(in))
		if err != nil || a.String() != want {
			t.Errorf("amount %s = %q, %v; want %q", in, a, err, want)
		}
	}
	bad := []string{`"0"`, `0`, `"0.00"`, `-1`, `"-1.00"`, `"1.001"`, `1.001`, `"1e2"`, `"39,98"`, `" 1"`,
		`"1."`, `".5"`, `"+1"`, `"NaN"`, `"Infinity"`, `""`, `true`, `null`, `[]`, `{}`, `1e1000`, `1e-1000`,
		`"1000000000000000"`, `1e15`, `"` + strings.Repeat("9", 70) + `"`, `0.0001e1`, `"0x10"`}
	for _, in := range bad {
		if a, err := amountFromJSON(json.RawMessage(in)); err == nil {
			t.Errorf("amount %s = %q, want an error", in, a)
		}
	}
	var a Amount
	if err := json.Unmarshal([]byte(`12.3`), &a); err != nil || a.String() != "12.30" {
		t.Fatalf("UnmarshalJSON: %v %v", a, err)
	}
	if b, _ := json.Marshal(a); string(b) != `"12.30"` {
		t.Fatalf("MarshalJSON: %s", b)
	}
}

// fieldsOf returns the sorted field names of a validation error.
func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *ValidationError, got %T %v", err, err)
	}
	var out []string
	for _, f := range ve.Fields {
		if f.Message == "" {
			t.Errorf("field %s without message", f.Field)
		}
		out = append(out, f.Field)
	}
	sort.Strings(out)
	return out
}

func with(field, value string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(goodBody), &m); err != nil {
		panic(err)
	}
	if value == "" {
		delete(m, field)
	} else {
		m[field] = json.RawMessage(value)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestDecodeCreateRequestBad(t *testing.T) {
	t.Parallel()
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf(`{"sku":"S%d","quantity":1}`, i)
	}
	cases := []struct {
		name, body string
		opts       DecodeOptions
		fields     string
	}{
		{"empty", ``, DecodeOptions{}, "body"},
		{"not json", `{"request_id":`, DecodeOptions{}, "body"},
		{"garbage", `hello`, DecodeOptions{}, "body"},
		{"array", `[]`, DecodeOptions{}, "body"},
		{"string", `"x"`, DecodeOptions{}, "body"},
		{"trailing", goodBody + `{}`, DecodeOptions{}, "body"},
		{"unknown field", with("coupon", `"FREE"`), DecodeOptions{}, "body"},
		{"case-folded field", strings.Replace(goodBody, `"amount"`, `"Amount"`, 1), DecodeOptions{}, "body"},
		{"duplicate field", strings.Replace(goodBody, `"user_id":42`, `"user_id":42,"user_id":43`, 1), DecodeOptions{}, "body"},
		{"no request_id", with("request_id", ""), DecodeOptions{}, "request_id"},
		{"null request_id", with("request_id", "null"), DecodeOptions{}, "request_id"},
		{"bad request_id", with("request_id", `"a b"`), DecodeOptions{}, "request_id"},
		{"long request_id", with("request_id", `"`+strings.Repeat("a", 65)+`"`), DecodeOptions{}, "request_id"},
		{"numeric request_id", with("request_id", `12`), DecodeOptions{}, "request_id"},
		{"header differs", goodBody, DecodeOptions{IdempotencyKey: "other", HasIdempotencyKey: true}, "request_id"},
		{"bad header", with("request_id", ""), DecodeOptions{IdempotencyKey: "a b", HasIdempotencyKey: true}, "Idempotency-Key"},
		{"empty header", with("request_id", ""), DecodeOptions{HasIdempotencyKey: true}, "Idempotency-Key"},
		{"no user", with("user_id", ""), DecodeOptions{}, "user_id"},
		{"zero user", with("user_id", `0`), DecodeOptions{}, "user_id"},
		{"negative user", with("user_id", `-3`), DecodeOptions{}, "user_id"},
		{"fraction user", with("user_id", `4.5`), DecodeOptions{}, "user_id"},
		{"float user", with("user_id", `42.0`), DecodeOptions{}, "user_id"},
		{"exp user", with("user_id", `4e1`), DecodeOptions{}, "user_id"},
		{"string user", with("user_id", `"42"`), DecodeOptions{}, "user_id"},
		{"huge user", with("user_id", `9223372036854775808`), DecodeOptions{}, "user_id"},
		{"no items", with("items", ""), DecodeOptions{}, "items"},
		{"empty items", with("items", `[]`), DecodeOptions{}, "items"},
		{"items object", with("items", `{}`), DecodeOptions{}, "items"},
		{"101 items", with("items", "["+strings.Join(many, ",")+"]"), DecodeOptions{}, "items"},
		{"item not object", with("items", `[1]`), DecodeOptions{}, "items[0]"},
		{"item null", with("items", `[null]`), DecodeOptions{}, "items[0]"},
		{"item unknown field", with("items", `[{"sku":"A","quantity":1,"price":3}]`), DecodeOptions{}, "items[0]"},
		{"item no sku", with("items", `[{"quantity":1}]`), DecodeOptions{}, "items[0].sku"},
		{"item bad sku", with("items", `[{"sku":"a b","quantity":1}]`), DecodeOptions{}, "items[0].sku"},
		{"item long sku", with("items", `[{"sku":"`+strings.Repeat("s", 65)+`","quantity":1}]`), DecodeOptions{}, "items[0].sku"},
		{"item dup sku", with("items", `[{"sku":"A","quantity":1},{"sku":"A","quantity":2}]`), DecodeOptions{}, "items[1].sku"},
		{"item zero qty", with("items", `[{"sku":"A","quantity":0}]`), DecodeOptions{}, "items[0].quantity"},
		{"item big qty", with("items", `[{"sku":"A","quantity":10001}]`), DecodeOptions{}, "items[0].quantity"},
		{"item frac qty", with("items", `[{"sku":"A","quantity":1.5}]`), DecodeOptions{}, "items[0].quantity"},
		{"item string qty", with("items", `[{"sku":"A","quantity":"1"}]`), DecodeOptions{}, "items[0].quantity"},
		{"item no qty", with("items", `[{"sku":"A"}]`), DecodeOptions{}, "items[0].quantity"},
		{"no amount", with("amount", ""), DecodeOptions{}, "amount"},
		{"zero amount", with("amount", `"0.00"`), DecodeOptions{}, "amount"},
		{"negative amount", with("amount", `-5`), DecodeOptions{}, "amount"},
		{"3 decimals", with("amount", `"39.985"`), DecodeOptions{}, "amount"},
		{"bool amount", with("amount", `true`), DecodeOptions{}, "amount"},
		{"fraction of yen", strings.Replace(goodBody, `"CNY"`, `"JPY"`, 1), DecodeOptions{}, "amount"},
		{"no currency", with("currency", ""), DecodeOptions{}, "currency"},
		{"lower currency", with("currency", `"cny"`), DecodeOptions{}, "currency"},
		{"made-up currency", with("currency", `"ABC"`), DecodeOptions{}, "currency"},
		{"test currency", with("currency", `"XTS"`), DecodeOptions{}, "currency"},
		{"gold", with("currency", `"XAU"`), DecodeOptions{}, "currency"},
		{"withdrawn currency", with("currency", `"HRK"`), DecodeOptions{}, "currency"},
		{"number currency", with("currency", `156`), DecodeOptions{}, "currency"},
		{"http callback", with("callback_url", `"http://shop.example/h"`), DecodeOptions{}, "callback_url"},
		{"relative callback", with("callback_url", `"/hooks"`), DecodeOptions{}, "callback_url"},
		{"ftp callback", with("callback_url", `"ftp://shop.example/h"`), DecodeOptions{}, "callback_url"},
		{"loopback callback", with("callback_url", `"https://127.0.0.1/h"`), DecodeOptions{}, "callback_url"},
		{"private callback", with("callback_url", `"https://10.1.2.3/h"`), DecodeOptions{}, "callback_url"},
		{"v6 loopback callback", with("callback_url", `"https://[::1]:8443/h"`), DecodeOptions{}, "callback_url"},
		{"localhost callback", with("callback_url", `"https://localhost/h"`), DecodeOptions{}, "callback_url"},
		{"userinfo callback", with("callback_url", `"https://u:p@shop.example/h"`), DecodeOptions{}, "callback_url"},
		{"no host callback", with("callback_url", `"https:///h"`), DecodeOptions{}, "callback_url"},
		{"long callback", with("callback_url", `"https://shop.example/`+strings.Repeat("a", 2048)+`"`), DecodeOptions{}, "callback_url"},
		{"number callback", with("callback_url", `7`), DecodeOptions{}, "callback_url"},
		{"several", `{"request_id":"","user_id":0,"items":[],"amount":"x","currency":"usd"}`, DecodeOptions{}, "amount currency items request_id user_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodeCreateRequest([]byte(c.body), c.opts)
			if got := strings.Join(fieldsOf(t, err), " "); got != c.fields {
				t.Fatalf("fields %q, want %q (%v)", got, c.fields, err)
			}
		})
	}
}

func TestIdempotencyKeyAndPrivateCallbacks(t *testing.T) {
	t.Parallel()
	req, err := DecodeCreateRequest([]byte(with("request_id", "")), DecodeOptions{IdempotencyKey: "key-1", HasIdempotencyKey: true})
	if err != nil || req.RequestID != "key-1" {
		t.Fatalf("header only: %+v %v", req, err)
	}
	req, err = DecodeCreateRequest([]byte(goodBody), DecodeOptions{IdempotencyKey: "ORD20261202143022a3f9c1", HasIdempotencyKey: true})
	if err != nil || req.RequestID != "ORD20261202143022a3f9c1" {
		t.Fatalf("both equal: %+v %v", req, err)
	}
	for _, u := range []string{"http://127.0.0.1:9999/h", "https://localhost/h", "http://10.0.0.1/x"} {
		if _, err := DecodeCreateRequest([]byte(with("callback_url", `"`+u+`"`)), DecodeOptions{AllowPrivateCallbacks: true}); err != nil {
			t.Errorf("%s with private callbacks allowed: %v", u, err)
		}
	}
	if req, err := DecodeCreateRequest([]byte(with("callback_url", "null")), DecodeOptions{}); err != nil || req.CallbackURL != "" {
		t.Fatalf("null callback: %v", err)
	}
}

func TestFingerprintIsCanonical(t *testing.T) {
	t.Parallel()
	variants := []string{
		goodBody,
		`{ "currency" : "CNY", "amount" : 39.98, "user_id":42, "callback_url":"https://shop.example/hooks/orders",
		   "items":[ {"quantity":2, "sku":"SKU-1"} ], "request_id":"ORD20261202143022a3f9c1" }`,
		with("amount", `"39.980"`),
		with("amount", `3998e-2`),
		with("request_id", ""), // the key comes from the header instead
	}
	var first []byte
	for i, v := range variants {
		req, err := DecodeCreateRequest([]byte(v), DecodeOptions{IdempotencyKey: "ORD20261202143022a3f9c1", HasIdempotencyKey: true})
		if err != nil {
			t.Fatalf("variant %d: %v", i, err)
		}
		if i == 0 {
			first = req.Fingerprint()
		} else if !bytes.Equal(first, req.Fingerprint()) {
			t.Errorf("variant %d has another fingerprint", i)
		}
	}
	two := `[{"sku":"A","quantity":1},{"sku":"B","quantity":2}]`
	swapped := `[{"sku":"B","quantity":2},{"sku":"A","quantity":1}]`
	a, _ := DecodeCreateRequest([]byte(with("items", two)), DecodeOptions{})
	b, _ := DecodeCreateRequest([]byte(with("items", swapped)), DecodeOptions{})
	if !bytes.Equal(a.Fingerprint(), b.Fingerprint()) {
		t.Error("item order changes the fingerprint")
	}
	for _, diff := range []string{with("amount", `"39.99"`), with("user_id", "43"), with("currency", `"USD"`),
		with("items", `[{"sku":"SKU-1","quantity":3}]`), with("callback_url", ""), with("callback_url", `"https://shop.example/other"`)} {
		req, err := DecodeCreateRequest([]byte(diff), DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(first, req.Fingerprint()) {
			t.Errorf("same fingerprint for a different payload: %s", diff)
		}
	}
}

func TestCurrencies(t *testing.T) {
	t.Parallel()
	for code, minor := range map[string]int{"CNY": 2, "EUR": 2, "USD": 2, "JPY": 0, "KWD": 3, "XCG": 2} {
		if m, ok := CurrencyMinorUnits(code); !ok || m != minor {
			t.Errorf("%s: %d %v", code, m, ok)
		}
	}
	list := Currencies()
	if !sort.StringsAreSorted(list) || len(list) < 150 {
		t.Fatalf("Currencies: %d codes, sorted %v", len(list), sort.StringsAreSorted(list))
	}
}

// FuzzDecodeCreateRequest checks that the decoder never panics, that what
// it accepts obeys every rule, and that accepting is stable: the accepted
// request, written back as JSON, decodes to the same fingerprint.
func FuzzDecodeCreateRequest(f *testing.F) {
	f.Add([]byte(goodBody), "")
	f.Add([]byte(with("amount", `3998e-2`)), "")
	f.Add([]byte(with("request_id", "")), "k")
	f.Add([]byte(`{"items":[{"sku":"A","quantity":1},{"sku":"A"}]}`), "")
	f.Add([]byte(`{"amount":1e999999999}`), "")
	f.Add([]byte(`[`), "x y")
	f.Fuzz(func(t *testing.T, body []byte, key string) {
		opts := DecodeOptions{IdempotencyKey: key, HasIdempotencyKey: key != ""}
		req, err := DecodeCreateRequest(body, opts)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Fields) == 0 {
				t.Fatalf("error is not a field list: %v", err)
			}
			return
		}
		if !requestIDRe.MatchString(req.RequestID) || req.UserID <= 0 || len(req.Items) == 0 || len(req.Items) > MaxItems ||
			req.Amount.Cents() <= 0 || req.Amount.Cents() >= MaxAmountCents {
			t.Fatalf("accepted a request that breaks a rule: %+v", req)
		}
		if _, ok := CurrencyMinorUnits(req.Currency); !ok {
			t.Fatalf("accepted currency %q", req.Currency)
		}
		for _, it := range req.Items {
			if !skuRe.MatchString(it.SKU) || it.Quantity < 1 || it.Quantity > MaxQuantity {
				t.Fatalf("accepted item %+v", it)
			}
		}
		again, err := json.Marshal(map[string]any{"request_id": req.RequestID, "user_id": req.UserID, "items": req.Items,
			"amount": req.Amount, "currency": req.Currency, "callback_url": req.CallbackURL})
		if err != nil {
			t.Fatal(err)
		}
		req2, err := DecodeCreateRequest(again, DecodeOptions{})
		if err != nil {
			t.Fatalf("re-encoded request refused: %v\n%s", err, again)
		}
		if !bytes.Equal(req.Fingerprint(), req2.Fingerprint()) {
			t.Fatalf("fingerprint changed after a round trip: %s", again)
		}
	})
}
