package mcp

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/auth"
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
// progress notifications go out on the call's own response stream.
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
	return auth.RequireBearerToken(verify, nil)(h), nil
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
