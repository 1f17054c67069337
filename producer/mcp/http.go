package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"orderpipe/producer/orderstream"
	"orderpipe/shared/app"
)

// Path is where the streamable HTTP endpoint is mounted.
const Path = "/mcp"

// MaxBodyBytes is the largest /mcp request body accepted (413 past it):
// the intake's limit, producer.MaxBodyBytes (a producer test holds them
// equal).
const MaxBodyBytes = 64 << 10

// tokenClient reads the client that HTTPHandler put in the call's token
// info.
func tokenClient(_ context.Context, req *sdk.CallToolRequest) (uuid.UUID, bool) {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(req.Extra.TokenInfo.UserID)
	return id, err == nil
}

// HTTPHandler serves the tools over streamable HTTP. Mount it behind the
// intake's authentication: clientID returns the client that it
// authenticated (from the bearer API key). The handler is stateless (no
// session is kept between requests), so any replica can serve any call;
// progress notifications go out on the call's own response stream. A
// body that is not one JSON-RPC 2.0 message (a batch among them) is
// answered with a JSON-RPC error (checkMessage).
func HTTPHandler(intake Intake, waker Waker, logger *slog.Logger, clientID func(*http.Request) (uuid.UUID, bool)) (http.Handler, error) {
	srv, err := NewServer(Options{Intake: intake, Waker: waker, Client: tokenClient, Logger: logger})
	if err != nil {
		return nil, err
	}
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Stateless:           true,
		Logger:              logger,
		MaxRequestBodyBytes: MaxBodyBytes,
	})
	// The intake authenticated the key already; this hands the client to
	// the SDK as token info, which it passes to each tool call.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		id, ok := clientID(r)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: id.String(), Expiration: time.Now().Add(time.Hour)}, nil
	}
	return auth.RequireBearerToken(verify, nil)(checkMessage(h)), nil
}

// checkMessage answers a POST whose body is not one JSON-RPC 2.0 message
// with a JSON-RPC error (id null unless the message's own was read) before
// the SDK sees it, which answered most of them in plain text and took a
// message with an id but neither a method nor a result for a response
// (202, dropped):
//   - a body that is empty, not JSON, or cut off: 400, Parse error;
//   - a batch: 400, Invalid Request. The intake's rate limit and its
//     bounds on streams count HTTP requests, so a batch would run many tool
//     calls for one token and one slot; the SDK accepts batches from a
//     client that sends no MCP-Protocol-Version header (taken for
//     2025-03-26);
//   - anything but an object with "jsonrpc": "2.0" and a method (or, for
//     a response, a result or an error): 400, Invalid Request;
//   - a body over MaxBodyBytes: 413.
//
// The body, read whole within MaxBodyBytes, goes on to next as it came.
func checkMessage(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeRPCError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeInvalidRequest, nil,
				fmt.Sprintf("the body is over %d bytes", MaxBodyBytes))
			return
		case err != nil:
			writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeParseError, nil, "the body could not be read: "+err.Error())
			return
		}
		if id, code, msg := invalidMessage(body); code != 0 {
			writeRPCError(w, http.StatusBadRequest, code, id, msg)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// invalidMessage returns the JSON-RPC error code and message for a body
// that is not one JSON-RPC 2.0 message (code 0 when it is one), with the
// message's id when it could be read.
func invalidMessage(body []byte) (id json.RawMessage, code int64, msg string) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(trimmed) == 0:
		return nil, jsonrpc.CodeParseError, "the body is empty: send one JSON-RPC message"
	case trimmed[0] == '[':
		return nil, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not accepted on " + Path + ": send one message per request"
	}
	var m struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  *string         `json:"method"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			what := "the message"
			if typeErr.Field != "" {
				what = fmt.Sprintf("%q", typeErr.Field)
			}
			return nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("%s is a JSON %s; a JSON-RPC message is an object with a string method", what, typeErr.Value)
		}
		return nil, jsonrpc.CodeParseError, "the body is not JSON: " + err.Error()
	}
	if len(m.ID) > 0 && (m.ID[0] == '"' || m.ID[0] == '-' || (m.ID[0] >= '0' && m.ID[0] <= '9')) {
		id = m.ID // a string or a number: the client can match the answer
	}
	switch {
	case m.JSONRPC == nil || *m.JSONRPC != "2.0":
		return id, jsonrpc.CodeInvalidRequest, `"jsonrpc" must be "2.0"`
	case m.Method == nil && m.Result == nil && m.Error == nil:
		return id, jsonrpc.CodeInvalidRequest, `a request needs a "method"`
	}
	return nil, 0, ""
}

// writeRPCError answers status with a JSON-RPC 2.0 error response; its id
// is null when id is nil, as the specification has it when the request's
// id was not read.
func writeRPCError(w http.ResponseWriter, status int, code int64, id json.RawMessage, msg string) {
	type rpcError struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	}
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: rpcError{Code: code, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Routes starts the process's order-event hub (one LISTEN connection) and
// returns the intake's extra routes (producer.Options.Extra): the events
// stream (GET /v1/orders/{order_id}/events) and the MCP endpoint (/mcp),
// both behind the intake's authentication. wait returns once ctx ended and
// the hub stopped.
func Routes(ctx context.Context, env *app.Env, intake Intake, clientID func(*http.Request) (uuid.UUID, bool)) (
	extra func(mux *http.ServeMux, auth func(http.Handler) http.Handler), wait func(), err error,
) {
	hub := orderstream.NewHub(env.Pool, env.Logger)
	mcpHandler, err := HTTPHandler(intake, hub, env.Logger.With(slog.String("part", "mcp")), clientID)
	if err != nil {
		return nil, nil, err
	}
	stream := &orderstream.Handler{Pool: env.Pool, Hub: hub, ClientID: clientID, Logger: env.Logger}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hub.Run(ctx); err != nil {
			env.Logger.Error("order event listener stopped", slog.Any("error", err))
		}
	}()
	return func(mux *http.ServeMux, auth func(http.Handler) http.Handler) {
		mux.Handle(orderstream.Pattern, auth(stream))
		mux.Handle(Path, auth(mcpHandler))
	}, func() { <-done }, nil
}
