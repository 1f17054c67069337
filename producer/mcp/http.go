package mcp

import (
	"bufio"
	"context"
	"encoding/json"
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
// JSON-RPC batch is refused (refuseBatches): one request is one message.
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
	return auth.RequireBearerToken(verify, nil)(refuseBatches(h)), nil
}

// refuseBatches answers a POST whose body is a JSON-RPC batch (its first
// byte past JSON white space is '[') with 400 and a JSON-RPC error
// (Invalid Request), before any of its messages runs. The intake's rate
// limit and its bounds on streams count HTTP requests, so a batch would
// run many tool calls for one token and one slot; the SDK accepts batches
// from a client that sends no MCP-Protocol-Version header (taken for
// 2025-03-26). It reads up to that first byte, within MaxBodyBytes; any
// other body goes on to next whole, and one that cannot be read (empty,
// too large, cut off) is answered by next as before.
func refuseBatches(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		br := bufio.NewReader(body)
		r.Body = struct {
			io.Reader
			io.Closer
		}{br, body}
		if firstNonSpace(br) == '[' {
			writeInvalidRequest(w, "JSON-RPC batches are not accepted on "+Path+": send one message per request")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// firstNonSpace returns the first byte of br that is not JSON white space,
// leaving it unread (0 when br ends or fails first).
func firstNonSpace(br *bufio.Reader) byte {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return 0
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			_ = br.UnreadByte()
			return c
		}
	}
}

// writeInvalidRequest answers 400 with a JSON-RPC 2.0 Invalid Request
// error; its id is null, as the specification has it when the request's
// id was not read.
func writeInvalidRequest(w http.ResponseWriter, msg string) {
	type rpcError struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		JSONRPC string   `json:"jsonrpc"`
		ID      *int     `json:"id"`
		Error   rpcError `json:"error"`
	}{JSONRPC: "2.0", Error: rpcError{Code: jsonrpc.CodeInvalidRequest, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
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
