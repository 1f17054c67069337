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
// active ISO 4217 code, a repeated SKU, decimals of the currency).
func createOrderSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:                 "object",
		Required:             []string{"user_id", "items", "amount", "currency"},
		AdditionalProperties: noMore(),
		PropertyOrder:        []string{"request_id", "token", "user_id", "items", "amount", "currency", "callback_url"},
		OneOf: []*jsonschema.Schema{
			{Required: []string{"request_id"}, Not: &jsonschema.Schema{Required: []string{"token"}}},
			{Required: []string{"token"}, Not: &jsonschema.Schema{Required: []string{"request_id"}}},
		},
		Properties: map[string]*jsonschema.Schema{
			"token": {
				Type: "string", Pattern: `^opt1\.[0-9a-f]{48}$`,
				Description: "In place of request_id: the token that new_order_token returned for THIS order. " +
					"Send the SAME token on every retry of this order; never fetch a new one to retry.",
			},
			"request_id": requestIDSchema("Your idempotency key for this order: 1-64 characters of A-Z a-z 0-9 . _ : -. " +
				"Generate it ONCE per order (e.g. ORD + UTC time + random hex) and send the SAME value on every retry of this order, " +
				"so a retry after a timeout returns the same order instead of creating a second one."),
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

func getOrderSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:                 "object",
		AdditionalProperties: noMore(),
		Properties: map[string]*jsonschema.Schema{
			"order_id":   orderIDSchema(),
			"request_id": requestIDSchema("The request_id the order was created with (instead of order_id)."),
		},
		OneOf: []*jsonschema.Schema{
			{Required: []string{"order_id"}, Not: &jsonschema.Schema{Required: []string{"request_id"}}},
			{Required: []string{"request_id"}, Not: &jsonschema.Schema{Required: []string{"order_id"}}},
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
