// Package mcp serves orderpipe's Model Context Protocol tools, so that an AI
// agent can place and follow orders: create_order (whose input schema
// requires a request_id, with the HTTP contract's rules), new_order_token
// (a server-issued idempotency token, sent as the request_id by an agent
// that cannot keep an id of its own across retries), get_order and
// wait_for_order (which reports progress while it waits).
//
// The tools call the intake's create and read service directly (not over
// HTTP), so they apply exactly the intake's rules. A failure comes back as
// a tool result with isError set and the problem document of the HTTP API
// as its structured content: the same code and retryable, so an agent knows
// whether to retry (with the same request_id). The server is reachable over
// streamable HTTP at /mcp, behind the intake's bearer authentication
// (HTTPHandler), and over stdio (`orderpipe mcp`, Command).
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/google/uuid"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"orderpipe/producer/problem"
	"orderpipe/shared/idemtoken"
	"orderpipe/shared/order"
)

// Intake is the part of the intake service the tools use
// (producer.Service implements it).
type Intake interface {
	// Create accepts an order, or returns the existing one of the same
	// (client, request_id) and payload (replayed).
	Create(ctx context.Context, clientID uuid.UUID, req order.CreateRequest) (o order.Order, replayed bool, err error)
	// Get returns a client's order (orderstore.ErrNotFound otherwise).
	Get(ctx context.Context, clientID, orderID uuid.UUID) (order.Order, error)
	// GetByRequestID returns a client's order by request_id.
	GetByRequestID(ctx context.Context, clientID uuid.UUID, requestID string) (order.Order, error)
	// DecodeOptions are this deployment's request rules.
	DecodeOptions() order.DecodeOptions
	// IssueToken issues the client an idempotency token.
	IssueToken(ctx context.Context, clientID uuid.UUID) (idemtoken.Token, error)
}

// Waker wakes a waiter when a change of an order may have committed
// (orderstream.Hub implements it). Optional: without it wait_for_order
// polls.
type Waker interface {
	// Subscribe returns a channel that receives a value when a change of
	// the order may have committed, and its cancel.
	Subscribe(orderID uuid.UUID) (<-chan struct{}, func())
	// Done is closed when the waker stops: the process is shutting down.
	// A wait_for_order in progress then answers at once, as if its time
	// were up, so that it does not hold the drain.
	Done() <-chan struct{}
}

// ClientFunc returns the authenticated client of a tool call.
type ClientFunc func(ctx context.Context, req *sdk.CallToolRequest) (uuid.UUID, bool)

// Options configure NewServer.
type Options struct {
	Intake Intake
	// Waker, when set, wakes wait_for_order on a change instead of at its
	// next poll, and answers it at once when the waker stops (shutdown).
	Waker Waker
	// Client identifies the caller of a tool call.
	Client ClientFunc
	Logger *slog.Logger
	// Poll is wait_for_order's re-read interval; default 1s.
	Poll time.Duration
	// ProgressEvery is the interval of progress notifications while
	// nothing changes; default 5s.
	ProgressEvery time.Duration
	// Version is reported to clients; default "dev".
	Version string
}

// Tool names.
const (
	ToolCreateOrder  = "create_order"
	ToolGetOrder     = "get_order"
	ToolWaitForOrder = "wait_for_order"
	ToolNewToken     = "new_order_token"
)

// OrderResult is the structured content of a successful tool call.
type OrderResult struct {
	Order order.Order `json:"order"`
	// Replayed (create_order): the request_id was accepted before; this is
	// that order, as it is now. Nothing new was created.
	Replayed bool `json:"replayed,omitempty"`
	// Terminal (wait_for_order): the order reached a final state.
	Terminal bool `json:"terminal"`
	// TimedOut (wait_for_order): the wait ended before a final state.
	TimedOut bool `json:"timed_out,omitempty"`
}

type server struct {
	opts Options
}

// NewServer returns the MCP server with orderpipe's tools.
func NewServer(opts Options) (*sdk.Server, error) {
	if opts.Intake == nil || opts.Client == nil {
		return nil, errors.New("mcp server: Intake and Client are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.ProgressEvery <= 0 {
		opts.ProgressEvery = 5 * time.Second
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	s := &server{opts: opts}
	srv := sdk.NewServer(&sdk.Implementation{Name: "orderpipe", Title: "orderpipe orders", Version: opts.Version}, &sdk.ServerOptions{
		Instructions: "Place orders with create_order. Generate a request_id once per order and reuse it on every retry of that order: " +
			"a retry then returns the same order instead of creating a second one. If you cannot keep an id across retries " +
			"(you rebuild the call from scratch after a timeout), call new_order_token ONCE per order and send its token as the " +
			"request_id of every create_order attempt of that order. Follow an order with wait_for_order or get_order. " +
			"Errors carry a code and retryable: retry only when retryable is true, with the same request_id.",
		Logger: opts.Logger,
	})
	tools := []struct {
		tool    *sdk.Tool
		handler func(context.Context, uuid.UUID, *sdk.CallToolRequest, json.RawMessage) (*sdk.CallToolResult, error)
	}{
		{&sdk.Tool{
			Name:  ToolCreateOrder,
			Title: "Create an order",
			Description: "Create an order, safely retryable. request_id is required: generate it once for this order " +
				"(for example ORD + UTC time + random hex, like ORD20261202143022a3f9c1) and reuse the SAME request_id on every retry " +
				"of this order, including after a timeout or an error whose retryable is true; never generate a new one for a retry. " +
				"If you cannot keep an id across retries, call new_order_token once for this order and send its token as request_id, " +
				"the SAME token on every retry. " +
				"The answer is the order in status processing (or, on a retry, the same order as it is now, with replayed true). " +
				"The order then moves on asynchronously; follow it with wait_for_order. On error the result has isError, " +
				"a code and retryable: retry (same request_id) only if retryable is true; code 104 means the first attempt " +
				"with this token is still running (retry the same call shortly); codes 208 and 209 mean the token is unknown or expired " +
				"(get a new token with new_order_token, then create the order with it as request_id).",
			InputSchema: createOrderSchema(),
			Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
		}, s.createOrder},
		{&sdk.Tool{
			Name:  ToolNewToken,
			Title: "Get an idempotency token for one order",
			Description: "Return a fresh idempotency token (and when it expires, 15 minutes by default) for ONE order you are about to create. " +
				"Call it ONCE per order, BEFORE the first create_order attempt, remember the token, and pass it to create_order as request_id " +
				"on the first attempt and on EVERY retry of that order: the first attempt creates the order, every retry returns the same order. " +
				"Never fetch a new token to retry; a new token means a new order. Use it when you cannot keep a request_id of your own.",
			InputSchema: &jsonschema.Schema{Type: "object", AdditionalProperties: noMore()},
			Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
		}, s.newToken},
		{&sdk.Tool{
			Name:        ToolGetOrder,
			Title:       "Get an order",
			Description: "Return one of your orders as it is now, by order_id or by the request_id it was created with (give exactly one).",
			InputSchema: getOrderSchema(),
			Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
		}, s.getOrder},
		{&sdk.Tool{
			Name:  ToolWaitForOrder,
			Title: "Wait for an order's final state",
			Description: "Wait until the order reaches a final state (confirmed, rejected or cancelled) or timeout_seconds pass, " +
				"sending progress notifications meanwhile; returns the order with terminal true, or as it is with timed_out true " +
				"(then call again to keep waiting; a server that shuts down answers so at once).",
			InputSchema: waitSchema(),
			Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
		}, s.waitForOrder},
	}
	for _, t := range tools {
		resolved, err := t.tool.InputSchema.(*jsonschema.Schema).Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
		if err != nil {
			return nil, fmt.Errorf("resolve the input schema of %s: %w", t.tool.Name, err)
		}
		srv.AddTool(t.tool, s.wrap(t.tool.Name, resolved, t.handler))
	}
	return srv, nil
}

// wrap authenticates the call, validates its arguments against the tool's
// schema and refuses a member given twice (an invalid-input problem, code
// 201), and turns a handler error into a problem result.
func (s *server) wrap(name string, schema *jsonschema.Resolved,
	h func(context.Context, uuid.UUID, *sdk.CallToolRequest, json.RawMessage) (*sdk.CallToolResult, error),
) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		clientID, ok := s.opts.Client(ctx, req)
		if !ok {
			return problemResult(problem.New(problem.Unauthenticated, "this session has no API client")), nil
		}
		args := req.Params.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		if p := checkArgs(schema, name, args); p != nil {
			return problemResult(p), nil
		}
		res, err := h(ctx, clientID, req, args)
		if err != nil {
			p := problem.From(err)
			if p.Code.Retryable() {
				s.opts.Logger.Warn("tool call failed", slog.String("tool", name), slog.Int("code", int(p.Code)), slog.Any("error", err))
			}
			return problemResult(p), nil
		}
		return res, nil
	}
}

// checkArgs validates arguments against a tool's schema; nil when they
// match.
func checkArgs(schema *jsonschema.Resolved, tool string, args json.RawMessage) *problem.Problem {
	var inst any
	if json.Unmarshal(args, &inst) != nil {
		return invalid("arguments", "must be a JSON object")
	}
	if err := schema.Validate(inst); err != nil {
		return invalid("arguments", "do not match the input schema of "+tool+": "+err.Error())
	}
	// The schema saw the arguments decoded, where the last of a member
	// given twice won; such arguments are refused, as over HTTP.
	if err := order.CheckMembers(args, slices.Collect(maps.Keys(schema.Schema().Properties))...); err != nil {
		return invalid("arguments", err.Error())
	}
	return nil
}

func invalid(field, msg string) *problem.Problem {
	p := problem.New(problem.InvalidInput, "the arguments break the rules listed in errors")
	p.Errors = []order.FieldError{{Field: field, Message: msg}}
	return p
}

// problemResult is a failed tool call: isError, the problem document as
// structured content and as text.
func problemResult(p *problem.Problem) *sdk.CallToolResult {
	b, _ := json.Marshal(p)
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, StructuredContent: p}
}

// okResult is a successful tool call: r (an OrderResult, or the
// idemtoken.Token of new_order_token) as structured content and as text.
func okResult(r any) *sdk.CallToolResult {
	b, _ := json.Marshal(r)
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, StructuredContent: r}
}

func (s *server) newToken(ctx context.Context, clientID uuid.UUID, _ *sdk.CallToolRequest, _ json.RawMessage) (*sdk.CallToolResult, error) {
	t, err := s.opts.Intake.IssueToken(ctx, clientID)
	if err != nil {
		return nil, err
	}
	return okResult(t), nil
}

// createOrder hands the arguments as they came to the HTTP intake's
// decoder, which refuses a member given twice at any depth (checkArgs
// refuses one at the top). A token arrives as the request_id;
// the intake takes it for one.
func (s *server) createOrder(ctx context.Context, clientID uuid.UUID, _ *sdk.CallToolRequest, args json.RawMessage) (*sdk.CallToolResult, error) {
	req, err := order.DecodeCreateRequest(args, s.opts.Intake.DecodeOptions())
	if err != nil {
		return nil, err
	}
	o, replayed, err := s.opts.Intake.Create(ctx, clientID, req)
	if err != nil {
		return nil, err
	}
	return okResult(OrderResult{Order: o, Replayed: replayed, Terminal: o.Status.Terminal()}), nil
}

func (s *server) getOrder(ctx context.Context, clientID uuid.UUID, _ *sdk.CallToolRequest, args json.RawMessage) (*sdk.CallToolResult, error) {
	var in struct {
		OrderID   string `json:"order_id"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return nil, invalid("arguments", err.Error())
	}
	if (in.OrderID == "") == (in.RequestID == "") {
		return nil, invalid("arguments", "give exactly one of order_id and request_id")
	}
	var o order.Order
	var err error
	if in.OrderID != "" {
		id, perr := uuid.Parse(in.OrderID)
		if perr != nil {
			return nil, invalid("order_id", "must be a UUID")
		}
		o, err = s.opts.Intake.Get(ctx, clientID, id)
	} else {
		o, err = s.opts.Intake.GetByRequestID(ctx, clientID, in.RequestID)
	}
	if err != nil {
		return nil, err
	}
	return okResult(OrderResult{Order: o, Terminal: o.Status.Terminal()}), nil
}

func (s *server) waitForOrder(ctx context.Context, clientID uuid.UUID, req *sdk.CallToolRequest, args json.RawMessage) (*sdk.CallToolResult, error) {
	in := struct {
		OrderID        string `json:"order_id"`
		TimeoutSeconds int    `json:"timeout_seconds"`
	}{TimeoutSeconds: 60}
	if err := json.Unmarshal(args, &in); err != nil {
		return nil, invalid("arguments", err.Error())
	}
	id, err := uuid.Parse(in.OrderID)
	if err != nil {
		return nil, invalid("order_id", "must be a UUID")
	}
	timeout := time.Duration(in.TimeoutSeconds) * time.Second
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var wake, stopping <-chan struct{}
	if s.opts.Waker != nil {
		var cancel func()
		wake, cancel = s.opts.Waker.Subscribe(id)
		defer cancel()
		stopping = s.opts.Waker.Done()
	}
	poll := time.NewTicker(s.opts.Poll)
	defer poll.Stop()
	token := req.Params.GetProgressToken()
	var lastStatus order.Status
	var lastNotified time.Time
	for {
		o, err := s.opts.Intake.Get(ctx, clientID, id)
		if err != nil {
			return nil, err
		}
		if o.Status.Terminal() {
			return okResult(OrderResult{Order: o, Terminal: true}), nil
		}
		if token != nil && req.Session != nil && (o.Status != lastStatus || time.Since(lastNotified) >= s.opts.ProgressEvery) {
			lastStatus, lastNotified = o.Status, time.Now()
			err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: token,
				Progress:      time.Since(start).Seconds(),
				Total:         timeout.Seconds(),
				Message:       fmt.Sprintf("order %s is %s; waiting for confirmed, rejected or cancelled", o.ID, o.Status),
			})
			if err != nil && ctx.Err() == nil {
				s.opts.Logger.Debug("progress notification", slog.Any("error", err))
			}
		}
		select {
		case <-ctx.Done():
			return nil, problem.New(problem.Unavailable, "the wait was cancelled; call wait_for_order again")
		case <-deadline.C:
			return s.waitEnded(ctx, clientID, id)
		case <-stopping:
			// The process is shutting down: the agent calls again (on
			// another replica) as after a timeout.
			return s.waitEnded(ctx, clientID, id)
		case <-wake:
		case <-poll.C:
		}
	}
}

// waitEnded is wait_for_order's answer when its time is up (or the
// process stops): the order as it is now, timed_out unless it is final.
func (s *server) waitEnded(ctx context.Context, clientID, id uuid.UUID) (*sdk.CallToolResult, error) {
	o, err := s.opts.Intake.Get(ctx, clientID, id)
	if err != nil {
		return nil, err
	}
	return okResult(OrderResult{Order: o, Terminal: o.Status.Terminal(), TimedOut: !o.Status.Terminal()}), nil
}
