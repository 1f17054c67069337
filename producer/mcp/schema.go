package mcp

import (
	"github.com/google/jsonschema-go/jsonschema"

	"orderpipe/shared/order"
)

func ptr[T any](v T) *T { return &v }

// noMore is the "false" schema: as additionalProperties it refuses any
// property that the schema does not name.
func noMore() *jsonschema.Schema { return &jsonschema.Schema{Not: &jsonschema.Schema{}} }

// requestIDSchema is the request_id rule of the HTTP contract.
func requestIDSchema(desc string) *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:        "string",
		MinLength:   ptr(1),
		MaxLength:   ptr(order.MaxRequestIDLen),
		Pattern:     order.RequestIDPattern,
		Description: desc,
		Examples:    []any{"ORD20261202143022a3f9c1"},
	}
}

func orderIDSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:        "string",
		Format:      "uuid",
		MinLength:   ptr(36),
		MaxLength:   ptr(36),
		Pattern:     `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`,
		Description: "The order_id that create_order returned.",
	}
}

// createOrderSchema states every rule of POST /v1/orders that a JSON
// schema can state; the same decoder as HTTP then checks the rest (an
// active ISO 4217 code, a repeated SKU, decimals of the currency, a member
// given twice). request_id is required: a token from new_order_token is a
// request_id (it has the form), and the intake takes any request_id of
// that form for a token, as over HTTP. The root holds no oneOf, anyOf or
// allOf, which the Anthropic Messages API refuses in a tool's input
// schema.
func createOrderSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:                 "object",
		Required:             []string{"request_id", "user_id", "items", "amount", "currency"},
		AdditionalProperties: noMore(),
		PropertyOrder:        []string{"request_id", "user_id", "items", "amount", "currency", "callback_url"},
		Properties: map[string]*jsonschema.Schema{
			"request_id": requestIDSchema("Your idempotency key for this order: 1-64 characters of A-Z a-z 0-9 . _ : -. " +
				"Generate it ONCE per order (e.g. ORD + UTC time + random hex) and send the SAME value on every retry of this order, " +
				"so a retry after a timeout returns the same order instead of creating a second one. " +
				"If you cannot keep an id of your own across retries, send as request_id the token that new_order_token returned " +
				"for THIS order (opt1. followed by 48 hex digits), the same token on every retry; never fetch a new one to retry. " +
				"A request_id that starts with opt1. is always taken for such a token."),
			"user_id": {Type: "integer", Minimum: ptr(1.0), Maximum: ptr(9223372036854775807.0), Description: "The shop's customer id (a positive integer)."},
			"items": {
				Type: "array", MinItems: ptr(1), MaxItems: ptr(order.MaxItems),
				Description: "1 to 100 lines, one per SKU (a SKU may not repeat).",
				Items: &jsonschema.Schema{
					Type:                 "object",
					Required:             []string{"sku", "quantity"},
					AdditionalProperties: noMore(),
					Properties: map[string]*jsonschema.Schema{
						"sku":      {Type: "string", MinLength: ptr(1), MaxLength: ptr(order.MaxSKULen), Pattern: order.SKUPattern, Examples: []any{"SKU-1"}},
						"quantity": {Type: "integer", Minimum: ptr(1.0), Maximum: ptr(float64(order.MaxQuantity))},
					},
				},
			},
			"amount": {
				Types:            []string{"string", "number"},
				Pattern:          order.AmountPattern,
				ExclusiveMinimum: ptr(0.0),
				Description: "The total, greater than 0, at most 2 decimals (none for currencies without a minor unit, e.g. JPY). " +
					"Prefer a decimal string (\"39.98\"); it is parsed exactly.",
				Examples: []any{"39.98"},
			},
			"currency": {Type: "string", Pattern: `^[A-Z]{3}$`, Description: "An active ISO 4217 code, upper case.", Examples: []any{"CNY"}},
			"callback_url": {
				Type: "string", MinLength: ptr(1), MaxLength: ptr(order.MaxCallbackURLLen), Format: "uri", Pattern: `^https?://`,
				Description: "Optional https URL that receives a signed webhook (Standard Webhooks) on every status change.",
			},
		},
	}
}

// getOrderSchema takes exactly one of order_id and request_id. It says so
// without a root oneOf (which the Anthropic Messages API refuses): with
// no other member allowed, one member at least and at most is one of the
// two.
func getOrderSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:                 "object",
		AdditionalProperties: noMore(),
		MinProperties:        ptr(1),
		MaxProperties:        ptr(1),
		Description:          "Exactly one of order_id and request_id.",
		Properties: map[string]*jsonschema.Schema{
			"order_id":   orderIDSchema(),
			"request_id": requestIDSchema("The request_id the order was created with (or the token, if you sent one as request_id); give it instead of order_id, not with it."),
		},
	}
}

// MaxWait bounds wait_for_order's timeout_seconds.
const MaxWait = 300

func waitSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:                 "object",
		Required:             []string{"order_id"},
		AdditionalProperties: noMore(),
		Properties: map[string]*jsonschema.Schema{
			"order_id": orderIDSchema(),
			"timeout_seconds": {
				Type: "integer", Minimum: ptr(1.0), Maximum: ptr(float64(MaxWait)), Default: []byte("60"),
				Description: "How long to wait for a final state (default 60, at most 300). On timeout the order is returned as it is, with timed_out true; call again to keep waiting.",
			},
		},
	}
}
