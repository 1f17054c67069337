package order

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"orderpipe/shared/callbackurl"
)

// Limits of a create-order request. The HTTP layer, the MCP tool schema and
// the OpenAPI document state the same numbers.
const (
	// MaxItems is the most lines an order may have.
	MaxItems = 100
	// MaxQuantity is the largest quantity of one line.
	MaxQuantity = 10000
	// MaxSKULen is the longest SKU accepted.
	MaxSKULen = 64
	// MaxCallbackURLLen is the longest callback URL accepted.
	MaxCallbackURLLen = callbackurl.MaxLen
	// MaxAmountCents bounds an amount (exclusive), in hundredths: amounts
	// are below 10^15 units of the currency.
	MaxAmountCents = int64(1e17)
)

// AmountPattern is the form of an amount given as a string, as the
// OpenAPI document and the MCP schema publish it: digits, then optionally
// a point and digits. Its value rules (greater than 0, below 10^15, a whole
// number of hundredths) are ParseAmount's, which accepts no string outside
// this form.
const AmountPattern = `^[0-9]+(\.[0-9]+)?$`

// SKUPattern is the rule for a stock-keeping unit: 1–64 characters of
// A-Z a-z 0-9 . _ -.
const SKUPattern = `^[A-Za-z0-9._-]{1,64}$`

// ValidSKU reports whether sku follows SKUPattern: the rule of an order's
// items, and of the stock that `inventory set` accepts.
func ValidSKU(sku string) bool { return keyChars(sku, MaxSKULen, 0) }

// ErrRequestIDReused is returned when a request_id comes back with a payload
// whose fingerprint differs from the stored order's. Nothing is changed.
var ErrRequestIDReused = errors.New("request_id was already used with a different payload")

// Item is one line of an order.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// CreateRequest is a validated, normalised create-order request: every
// entry point (HTTP body, MCP tool arguments) produces one with
// DecodeCreateRequest, so they all apply the same rules.
type CreateRequest struct {
	RequestID   string
	UserID      int64
	Items       []Item
	Amount      Amount
	Currency    string
	CallbackURL string
}

// FieldError says what is wrong with one field of a request. Field is the
// JSON path of the field ("amount", "items[2].quantity"), or the header
// name for a header ("Idempotency-Key").
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e FieldError) Error() string { return e.Field + ": " + e.Message }

// ValidationError lists every problem found in a request. The HTTP layer
// answers it with 400 and the list; nothing is written.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		msgs[i] = f.Error()
	}
	return "invalid request: " + strings.Join(msgs, "; ")
}

func (e *ValidationError) add(field, format string, args ...any) {
	e.Fields = append(e.Fields, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// DecodeOptions are the deployment-dependent parts of the rules.
type DecodeOptions struct {
	// AllowPrivateCallbacks lets callback_url be http and point at
	// loopback or private addresses (dev, tests).
	AllowPrivateCallbacks bool
	// IdempotencyKey is the Idempotency-Key header of the request, if
	// any. It may carry the request_id in place of the body field; when
	// both are given they must be equal.
	IdempotencyKey string
	// HasIdempotencyKey says the header was present (even empty).
	HasIdempotencyKey bool
}

// Members of a request body and of an item line, by their position in
// what decodeObject returns.
var (
	requestMembers = []string{"request_id", "user_id", "items", "amount", "currency", "callback_url"}
	itemMembers    = []string{"sku", "quantity"}
)

const (
	mRequestID = iota
	mUserID
	mItems
	mAmount
	mCurrency
	mCallbackURL
)

const (
	mSKU = iota
	mQuantity
)

// DecodeCreateRequest parses and validates a create-order body (a JSON
// object; unknown fields are refused) and returns the normalised request.
// Every rule violation is reported in one *ValidationError; numbers are
// never read through float64.
func DecodeCreateRequest(body []byte, opts DecodeOptions) (CreateRequest, error) {
	w, err := decodeObject(body, requestMembers)
	if err != nil {
		return CreateRequest{}, &ValidationError{Fields: []FieldError{{Field: "body", Message: err.Error()}}}
	}
	var ve ValidationError
	var req CreateRequest

	// request_id, from the body and/or the Idempotency-Key header.
	bodyID, hasBodyID := decodeString(&ve, "request_id", w[mRequestID])
	if hasBodyID {
		if err := ValidateRequestID(bodyID); err != nil {
			ve.add("request_id", "%v", err)
		}
	}
	if opts.HasIdempotencyKey {
		if err := ValidateRequestID(opts.IdempotencyKey); err != nil {
			ve.add("Idempotency-Key", "%v", err)
		}
	}
	switch {
	case hasBodyID && opts.HasIdempotencyKey && bodyID != opts.IdempotencyKey:
		ve.add("request_id", "differs from the Idempotency-Key header; send one, or both equal")
	case hasBodyID:
		req.RequestID = bodyID
	case opts.HasIdempotencyKey:
		req.RequestID = opts.IdempotencyKey
	case isAbsent(w[mRequestID]):
		ve.add("request_id", "is required (in the body or as the Idempotency-Key header)")
	}

	// user_id: a positive 64-bit integer.
	if isAbsent(w[mUserID]) {
		ve.add("user_id", "is required")
	} else if n, ok := decodeInt(w[mUserID]); !ok || n <= 0 {
		ve.add("user_id", "must be a positive integer (at most %d)", int64(1<<63-1))
	} else {
		req.UserID = n
	}

	req.Items = decodeItems(&ve, w[mItems])

	if isAbsent(w[mAmount]) {
		ve.add("amount", "is required")
	} else if a, err := amountFromJSON(w[mAmount]); err != nil {
		ve.add("amount", "%v", err)
	} else {
		req.Amount = a
	}

	if cur, ok := decodeString(&ve, "currency", w[mCurrency]); !ok {
		if isAbsent(w[mCurrency]) {
			ve.add("currency", "is required")
		}
	} else if minor, known := CurrencyMinorUnits(cur); !known {
		ve.add("currency", "%q is not an active ISO 4217 currency code (upper case, e.g. CNY, EUR, USD)", cur)
	} else {
		req.Currency = cur
		if req.Amount.Cents() > 0 && minor < 2 && req.Amount.Cents()%100 != 0 {
			ve.add("amount", "%s has no minor unit: the amount must be a whole number", cur)
		}
	}

	if u, ok := decodeString(&ve, "callback_url", w[mCallbackURL]); ok && u != "" {
		if err := ValidateCallbackURL(u, opts.AllowPrivateCallbacks); err != nil {
			ve.add("callback_url", "%v", err)
		} else {
			req.CallbackURL = u
		}
	}

	if len(ve.Fields) > 0 {
		return CreateRequest{}, &ve
	}
	return req, nil
}

// decodeObject reads exactly one JSON object whose member names are all in
// allowed (matched exactly, case included), each at most once, and returns
// the raw members by their position in allowed (nil: not given). Trailing
// data is refused.
//
// encoding/json checks the syntax (json.Valid, which allocates nothing);
// the members of the object it accepted are then found by skipping over
// valid JSON (jsonMembers). json.Decoder's token API did the same work
// about ten times slower, most of it in building an error for the end of
// every value.
func decodeObject(data []byte, allowed []string) ([]json.RawMessage, error) {
	if !json.Valid(data) {
		return nil, describeInvalidJSON(data)
	}
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return nil, errors.New("must be a JSON object")
	}
	return objectMembers(data, i, allowed)
}

// CheckMembers reports whether data is one JSON object whose member names
// are all in allowed, each given once, with the create request's
// decoder's errors ("has the field "x" twice"): a caller that decodes the
// object with encoding/json, where the last of a repeated member wins,
// checks it first.
func CheckMembers(data []byte, allowed ...string) error {
	_, err := decodeObject(data, allowed)
	return err
}

// objectMembers is decodeObject for the object that starts at data[i]
// ('{') in JSON that json.Valid accepted, such as an item line of a
// checked body.
func objectMembers(data []byte, i int, allowed []string) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(allowed))
	err := jsonMembers(data, i, func(rawName, value []byte) error {
		inner := rawName[1 : len(rawName)-1]
		k := slices.IndexFunc(allowed, func(a string) bool { return string(inner) == a })
		if k < 0 {
			// The name may be written with escapes ("request\u005fid").
			name := unquote(rawName)
			if k = slices.Index(allowed, name); k < 0 {
				return fmt.Errorf("has an unknown field %q (known: %s)", name, strings.Join(allowed, ", "))
			}
		}
		if out[k] != nil {
			return fmt.Errorf("has the field %q twice", allowed[k])
		}
		out[k] = value
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// describeInvalidJSON says what is wrong with a body that json.Valid
// refused.
func describeInvalidJSON(data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("is empty; want a JSON object")
	}
	// json.Unmarshal reports where the syntax breaks; "unexpected end of
	// JSON input" is its word for a body cut short.
	var syn *json.SyntaxError
	if !errors.As(json.Unmarshal(data, new(json.RawMessage)), &syn) {
		return errors.New("is not valid JSON")
	}
	if strings.Contains(syn.Error(), "end of JSON input") {
		return errors.New("is truncated JSON")
	}
	return fmt.Errorf("is not valid JSON (at byte %d): %w", syn.Offset, syn)
}

// The functions below walk JSON that json.Valid accepted; they do not
// check syntax and must not be given anything else.

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at the
// quote data[i].
func skipString(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++ // the escaped byte cannot end the string
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the value that starts at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				i = skipString(data, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	// A number, true, false or null: up to the next delimiter.
	for i < len(data) && !strings.ContainsRune(",}] \t\n\r", rune(data[i])) {
		i++
	}
	return i
}

// jsonMembers calls f with the quoted name and the raw value of each
// member of the object that starts at data[i] ('{'), in order, and stops
// at f's first error.
func jsonMembers(data []byte, i int, f func(rawName, value []byte) error) error {
	i = skipSpace(data, i+1)
	for data[i] != '}' {
		end := skipString(data, i)
		name := data[i:end]
		i = skipSpace(data, skipSpace(data, end)+1) // past the colon
		end = skipValue(data, i)
		if err := f(name, data[i:end]); err != nil {
			return err
		}
		if i = skipSpace(data, end); data[i] == ',' {
			i = skipSpace(data, i+1)
		}
	}
	return nil
}

// jsonElements returns the raw elements of the array that starts at
// data[i] ('[').
func jsonElements(data []byte, i int) []json.RawMessage {
	var out []json.RawMessage
	i = skipSpace(data, i+1)
	for data[i] != ']' {
		end := skipValue(data, i)
		out = append(out, data[i:end])
		if i = skipSpace(data, end); data[i] == ',' {
			i = skipSpace(data, i+1)
		}
	}
	return out
}

// unquote returns the text of a valid JSON string literal, as
// encoding/json decodes it (invalid UTF-8 becomes U+FFFD).
func unquote(raw []byte) string {
	if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner) // nothing to decode: json.Valid refused control characters
	}
	var s string
	_ = json.Unmarshal(raw, &s) // cannot fail: raw is a valid string literal
	return s
}

// isAbsent reports whether a raw member was missing or null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// decodeString decodes a JSON string member; ok is false when the member
// is absent, null or not a string (the latter reported).
func decodeString(ve *ValidationError, field string, raw json.RawMessage) (string, bool) {
	if isAbsent(raw) {
		return "", false
	}
	if raw[0] != '"' {
		ve.add(field, "must be a string")
		return "", false
	}
	return unquote(raw), true
}

// decodeInt reads a JSON number that is an integer in int64 range, without
// fractions or exponents (1.0 and 1e3 are refused: integers are written as
// integers).
func decodeInt(raw json.RawMessage) (int64, bool) {
	s := string(raw)
	if s == "" || strings.ContainsAny(s, ".eE\"") {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// itemField is the JSON path of line i of items, or of its member sub.
func itemField(i int, sub string) string {
	return "items[" + strconv.Itoa(i) + "]" + sub
}

func decodeItems(ve *ValidationError, raw json.RawMessage) []Item {
	if isAbsent(raw) {
		ve.add("items", "is required: 1 to %d lines", MaxItems)
		return nil
	}
	if raw[0] != '[' {
		ve.add("items", "must be an array of {\"sku\", \"quantity\"} objects")
		return nil
	}
	lines := jsonElements(raw, 0)
	if len(lines) == 0 || len(lines) > MaxItems {
		ve.add("items", "must have 1 to %d lines, got %d", MaxItems, len(lines))
		return nil
	}
	items := make([]Item, 0, len(lines))
	seen := make(map[string]int, len(lines))
	for i, line := range lines {
		if line[0] != '{' {
			ve.add(itemField(i, ""), "must be an object {\"sku\", \"quantity\"}")
			continue
		}
		wi, err := objectMembers(line, 0, itemMembers) // the body was checked whole
		if err != nil {
			ve.add(itemField(i, ""), "%v", err)
			continue
		}
		var it Item
		skuField := itemField(i, ".sku")
		if sku, ok := decodeString(ve, skuField, wi[mSKU]); ok {
			if !ValidSKU(sku) {
				ve.add(skuField, "must be 1-%d characters of A-Z a-z 0-9 . _ -", MaxSKULen)
			} else if j, dup := seen[sku]; dup {
				ve.add(skuField, "repeats items[%d]; put the whole quantity on one line", j)
			} else {
				seen[sku] = i
				it.SKU = sku
			}
		} else if isAbsent(wi[mSKU]) {
			ve.add(skuField, "is required")
		}
		if isAbsent(wi[mQuantity]) {
			ve.add(itemField(i, ".quantity"), "is required")
		} else if q, ok := decodeInt(wi[mQuantity]); !ok || q < 1 || q > MaxQuantity {
			ve.add(itemField(i, ".quantity"), "must be an integer from 1 to %d", MaxQuantity)
		} else {
			it.Quantity = int(q)
		}
		items = append(items, it)
	}
	return items
}

// ValidateCallbackURL checks a callback URL by the rule delivery applies
// (callbackurl.Check): absolute https (http too when private callbacks are
// allowed), a host, no user info, no fragment, at most MaxCallbackURLLen
// bytes, no host that only a browser reads as an IPv4 address ("127.1");
// and, unless private callbacks are allowed, no IP literal outside the
// public unicast ranges and no "localhost". (Names that resolve to such
// addresses are refused by the notifier when it dials.)
func ValidateCallbackURL(raw string, allowPrivate bool) error {
	return callbackurl.Check(raw, allowPrivate)
}

// canonicalPayload is what the fingerprint hashes: the normalised payload
// with a fixed member order, items sorted by SKU. The request_id is not in
// it (it is the key the fingerprint is stored under).
type canonicalPayload struct {
	V           int    `json:"v"`
	UserID      int64  `json:"user_id"`
	Items       []Item `json:"items"`
	Amount      string `json:"amount"`
	Currency    string `json:"currency"`
	CallbackURL string `json:"callback_url"`
}

// Fingerprint is the SHA-256 of the canonical JSON of the normalised
// payload. Two bodies that differ only in member order, whitespace, the
// order of their items, or "39.98" against 39.98 have the same fingerprint.
func (r CreateRequest) Fingerprint() []byte {
	items := append([]Item(nil), r.Items...)
	sort.Slice(items, func(i, j int) bool { return items[i].SKU < items[j].SKU })
	b, err := json.Marshal(canonicalPayload{
		V: 1, UserID: r.UserID, Items: items, Amount: r.Amount.String(),
		Currency: r.Currency, CallbackURL: r.CallbackURL,
	})
	if err != nil {
		panic(fmt.Sprintf("order: marshal canonical payload: %v", err)) // only plain types: cannot fail
	}
	h := sha256.Sum256(b)
	return h[:]
}

// Amount is an exact, positive money amount with at most two decimals,
// kept in hundredths. It marshals as a JSON string like "39.98" and
// unmarshals from a decimal string or a JSON number, never through float64.
type Amount struct {
	cents int64
}

// AmountFromCents returns the amount of n hundredths.
func AmountFromCents(n int64) Amount { return Amount{cents: n} }

// Cents returns the amount in hundredths.
func (a Amount) Cents() int64 { return a.cents }

// IsZero reports whether a is the zero value (no amount).
func (a Amount) IsZero() bool { return a.cents == 0 }

// String is the canonical form: digits, a point and exactly two decimals.
func (a Amount) String() string {
	sign := ""
	c := a.cents
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

// MarshalJSON writes the canonical string.
func (a Amount) MarshalJSON() ([]byte, error) {
	return []byte(`"` + a.String() + `"`), nil
}

// UnmarshalJSON accepts a decimal string or a JSON number.
func (a *Amount) UnmarshalJSON(b []byte) error {
	v, err := amountFromJSON(b)
	if err != nil {
		return fmt.Errorf("amount: %w", err)
	}
	*a = v
	return nil
}

func amountFromJSON(raw json.RawMessage) (Amount, error) {
	if len(raw) > 0 && raw[0] == '"' {
		if !json.Valid(raw) {
			return Amount{}, errors.New("must be a decimal string or a JSON number")
		}
		return ParseAmount(unquote(raw))
	}
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) || !json.Valid(raw) {
		return Amount{}, errors.New("must be a decimal string like \"39.98\" or a JSON number")
	}
	return parseDecimal(string(raw), true)
}

// ParseAmount parses a decimal string like "39.98" or "40": digits, an
// optional point and decimals. The value must be above zero, below 10^15
// and have at most two decimals (trailing zeros do not count: "1.500" is
// 1.50).
func ParseAmount(s string) (Amount, error) {
	return parseDecimal(s, false)
}

var (
	decimalRe = regexp.MustCompile(`^(-?)([0-9]+)(?:\.([0-9]+))?$`)
	numberRe  = regexp.MustCompile(`^(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$`)
)

// parseDecimal parses exactly: the digits become an integer mantissa and
// a power of ten, and the value is accepted only when it is a whole number
// of hundredths in range. Exponents are allowed for JSON numbers only.
func parseDecimal(s string, allowExp bool) (Amount, error) {
	const want = "must be a decimal like \"39.98\""
	if len(s) > 64 {
		return Amount{}, errors.New(want + " of at most 64 characters")
	}
	re := decimalRe
	if allowExp {
		re = numberRe
	}
	m := re.FindStringSubmatch(s)
	if m == nil {
		return Amount{}, errors.New(want)
	}
	neg, intPart, frac := m[1] == "-", m[2], m[3]
	exp := 0
	if allowExp && m[4] != "" {
		e, err := strconv.Atoi(m[4])
		if err != nil || e > 1000 || e < -1000 {
			return Amount{}, errors.New("is out of range")
		}
		exp = e
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	scale := len(frac) - exp // value = digits × 10^-scale
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		scale--
	}
	if digits == "" || neg {
		return Amount{}, errors.New("must be greater than 0")
	}
	if scale > 2 {
		return Amount{}, errors.New("must have at most 2 decimals")
	}
	// digits × 10^(2-scale) hundredths; at most 17 digits keeps it below 10^17.
	if len(digits)+2-scale > 17 {
		return Amount{}, fmt.Errorf("must be less than %d", MaxAmountCents/100)
	}
	cents, err := strconv.ParseInt(digits+strings.Repeat("0", 2-scale), 10, 64)
	if err != nil || cents >= MaxAmountCents {
		return Amount{}, fmt.Errorf("must be less than %d", MaxAmountCents/100)
	}
	return Amount{cents: cents}, nil
}
