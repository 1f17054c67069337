package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"orderpipe/producer/client"
)

// A shop backend creates an order. The intake here is a stand-in that is
// unavailable at the first attempt; the client retries with the same
// request_id and gets the order. Against a real intake, use its base URL
// and the api_key of `orderpipe clients create --name <shop>`.
func ExampleClient_CreateOrder() {
	var calls atomic.Int32
	intake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"urn:orderpipe:problem:unavailable","title":"Service unavailable","status":503,"code":101,"retryable":true}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/orders/0192e0f4-6a7b-7c3d-8e9f-0a1b2c3d4e5f")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"order_id":"0192e0f4-6a7b-7c3d-8e9f-0a1b2c3d4e5f","order_no":"ORD20261202143022123a1b2c3d4","request_id":%q,"status":"processing","user_id":42,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY","created_at":"2026-12-02T14:30:22Z","updated_at":"2026-12-02T14:30:22Z"}`,
			r.Header.Get("Idempotency-Key"))
	}))
	defer intake.Close()

	c := client.New(intake.URL, "opk_your_api_key")
	res, err := c.CreateOrder(context.Background(), client.OrderRequest{
		RequestID: "ORD20261202143022a3f9c1", // or leave empty to have one generated
		UserID:    42,
		Items:     []client.Item{{SKU: "SKU-1", Quantity: 2}},
		Amount:    "39.98",
		Currency:  "CNY",
	})
	if err != nil {
		fmt.Println("not accepted:", err) // a *client.Problem (class 2) or a *client.BudgetError
		return
	}
	fmt.Println(res.Order.Status, res.Order.Amount, res.Order.Currency, res.RequestID)
	fmt.Println("attempts:", res.Attempts, "replayed:", res.Replayed)
	// Output:
	// processing 39.98 CNY ORD20261202143022a3f9c1
	// attempts: 2 replayed: false
}
