// Package contract holds the published documents to the messages the code
// produces: it compiles the JSON Schemas of the AsyncAPI document of the
// ORDERS stream (orderevent.AsyncAPI) and of the OpenAPI document's
// webhooks, and validates real messages against them.
//
// Tests use it (the end-to-end pipeline test validates every event and
// every webhook it sees); the product does not, so the schema library is
// linked into test binaries only.
package contract

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"orderpipe/shared/orderevent"
)

// ErrViolation marks a message that does not match its documented schema.
var ErrViolation = errors.New("message does not match the contract")

const asyncAPIURL = "urn:orderpipe:asyncapi.json"

// Events validates ORDERS messages against the AsyncAPI document.
type Events struct {
	headers  *jsonschema.Schema
	payloads map[orderevent.Name]*jsonschema.Schema
}

// LoadEvents compiles the schemas of the AsyncAPI document doc (YAML or
// JSON). It fails when a name of orderevent.Names has no channel
// "{prefix}.<name>" with one message that has headers and a payload.
func LoadEvents(doc []byte) (*Events, error) {
	var y any
	if err := yaml.Unmarshal(doc, &y); err != nil {
		return nil, fmt.Errorf("parse AsyncAPI document: %w", err)
	}
	root, err := asJSON(y)
	if err != nil {
		return nil, fmt.Errorf("AsyncAPI document: %w", err)
	}
	var d struct {
		AsyncAPI string `json:"asyncapi"`
		Channels map[string]struct {
			Address  string                       `json:"address"`
			Messages map[string]map[string]string `json:"messages"`
		} `json:"channels"`
		Components struct {
			Messages map[string]struct {
				Headers map[string]string `json:"headers"`
				Payload map[string]string `json:"payload"`
			} `json:"messages"`
		} `json:"components"`
	}
	if err := remarshal(root, &d); err != nil {
		return nil, fmt.Errorf("AsyncAPI document: %w", err)
	}
	if !strings.HasPrefix(d.AsyncAPI, "3.") {
		return nil, fmt.Errorf("AsyncAPI document: version %q, want 3.x", d.AsyncAPI)
	}
	c := compiler()
	if err := c.AddResource(asyncAPIURL, root); err != nil {
		return nil, fmt.Errorf("AsyncAPI document: %w", err)
	}
	ev := &Events{payloads: map[orderevent.Name]*jsonschema.Schema{}}
	var headersRef string
	for _, name := range orderevent.Names() {
		var msgRef string
		for _, ch := range d.Channels {
			if ch.Address != "{prefix}."+string(name) {
				continue
			}
			if len(ch.Messages) != 1 {
				return nil, fmt.Errorf("AsyncAPI channel %s: want one message, got %d", ch.Address, len(ch.Messages))
			}
			for _, m := range ch.Messages {
				msgRef = m["$ref"]
			}
		}
		if msgRef == "" {
			return nil, fmt.Errorf("AsyncAPI document: no channel {prefix}.%s with a message $ref", name)
		}
		m, ok := d.Components.Messages[strings.TrimPrefix(msgRef, "#/components/messages/")]
		if !ok || m.Payload["$ref"] == "" || m.Headers["$ref"] == "" {
			return nil, fmt.Errorf("AsyncAPI message %s: want a headers and a payload $ref", msgRef)
		}
		if headersRef != "" && m.Headers["$ref"] != headersRef {
			return nil, fmt.Errorf("AsyncAPI message %s: headers %s differ from %s", msgRef, m.Headers["$ref"], headersRef)
		}
		headersRef = m.Headers["$ref"]
		s, err := c.Compile(asyncAPIURL + m.Payload["$ref"])
		if err != nil {
			return nil, fmt.Errorf("AsyncAPI payload of %s: %w", name, err)
		}
		ev.payloads[name] = s
	}
	if ev.headers, err = c.Compile(asyncAPIURL + headersRef); err != nil {
		return nil, fmt.Errorf("AsyncAPI headers: %w", err)
	}
	return ev, nil
}

// DefaultEvents compiles orderevent.AsyncAPI.
func DefaultEvents() (*Events, error) { return LoadEvents(orderevent.AsyncAPI()) }

// ValidatePayload validates the payload of an event named name.
func (e *Events) ValidatePayload(name orderevent.Name, payload []byte) error {
	s, ok := e.payloads[name]
	if !ok {
		return fmt.Errorf("%w: no schema for event %q", ErrViolation, name)
	}
	return validate(s, payload, "payload of "+string(name))
}

// ValidateHeaders validates a message's headers (a nats.Header): each must
// be documented and carry one value.
func (e *Events) ValidateHeaders(h map[string][]string) error {
	obj := map[string]any{}
	for k, vs := range h {
		if len(vs) != 1 {
			return fmt.Errorf("%w: header %s has %d values, want 1", ErrViolation, k, len(vs))
		}
		obj[k] = vs[0]
	}
	if err := e.headers.Validate(obj); err != nil {
		return fmt.Errorf("%w: headers: %w", ErrViolation, err)
	}
	return nil
}

var msgIDSuffix = regexp.MustCompile(`^(:heal[1-9][0-9]*)?(:dlq[1-9][0-9]*\.[1-9][0-9]*)*$`)

// Validate checks one message of the stream of topology t: its subject is
// "<prefix>.<event>", headers and payload match their schemas, and they
// agree with each other and with orderevent.Decode — the Orderpipe-*
// headers repeat the payload's ids and event, and the Nats-Msg-Id is the
// payload's id with at most a heal and dead-letter replay suffixes.
func (e *Events) Validate(t orderevent.Topology, subject string, h map[string][]string, payload []byte) error {
	rest, ok := strings.CutPrefix(subject, t.Prefix+".")
	name := orderevent.Name(rest)
	if !ok || !name.Valid() {
		return fmt.Errorf("%w: subject %q is not %s.<event>", ErrViolation, subject, t.Prefix)
	}
	if err := e.ValidateHeaders(h); err != nil {
		return err
	}
	if err := e.ValidatePayload(name, payload); err != nil {
		return err
	}
	ev, err := orderevent.Decode(payload)
	if err != nil {
		return fmt.Errorf("%w: the schema accepts a payload that orderevent.Decode refuses: %w", ErrViolation, err)
	}
	get := func(k string) string { return h[k][0] }
	switch {
	case ev.Name != name:
		return fmt.Errorf("%w: event %q on subject %s", ErrViolation, ev.Name, subject)
	case get(orderevent.HeaderEvent) != string(ev.Name):
		return fmt.Errorf("%w: header %s %q, payload event %q", ErrViolation, orderevent.HeaderEvent, get(orderevent.HeaderEvent), ev.Name)
	case get(orderevent.HeaderOrderID) != ev.OrderID.String():
		return fmt.Errorf("%w: header %s differs from the payload's order_id", ErrViolation, orderevent.HeaderOrderID)
	case get(orderevent.HeaderClientID) != ev.ClientID.String():
		return fmt.Errorf("%w: header %s differs from the payload's client_id", ErrViolation, orderevent.HeaderClientID)
	case get(orderevent.HeaderRequestID) != ev.RequestID:
		return fmt.Errorf("%w: header %s differs from the payload's request_id", ErrViolation, orderevent.HeaderRequestID)
	}
	id := get(orderevent.HeaderMsgID)
	suffix, ok := strings.CutPrefix(id, ev.MsgID())
	if !ok || !msgIDSuffix.MatchString(suffix) {
		return fmt.Errorf("%w: %s %q is not the payload's id %q with a heal or replay suffix", ErrViolation, orderevent.HeaderMsgID, id, ev.MsgID())
	}
	return nil
}

// ValidateStream reads every message the stream of t holds and validates
// each one (Validate). It returns the messages and the violations joined
// (nil when every message matches).
func (e *Events) ValidateStream(ctx context.Context, js jetstream.JetStream, t orderevent.Topology) ([]*jetstream.RawStreamMsg, error) {
	st, err := js.Stream(ctx, t.Stream)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", t.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", t.Stream, err)
	}
	var msgs []*jetstream.RawStreamMsg
	var errs []error
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return msgs, fmt.Errorf("read stream %s sequence %d: %w", t.Stream, seq, err)
		}
		msgs = append(msgs, m)
		if err := e.Validate(t, m.Subject, m.Header, m.Data); err != nil {
			errs = append(errs, fmt.Errorf("stream sequence %d (%s, headers %v, payload %s): %w", seq, m.Subject, m.Header, m.Data, err))
		}
	}
	return msgs, errors.Join(errs...)
}

const openAPIURL = "urn:orderpipe:openapi.json"

// Webhooks validates webhook requests against one webhook of an OpenAPI
// 3.1 document.
type Webhooks struct {
	body    *jsonschema.Schema
	headers []header
}

type header struct {
	name     string
	required bool
	schema   *jsonschema.Schema
}

// LoadWebhooks compiles the request body schema and the header parameters
// of webhook name (its post operation) in the OpenAPI document doc (JSON).
func LoadWebhooks(doc []byte, name string) (*Webhooks, error) {
	root, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("parse OpenAPI document: %w", err)
	}
	var d struct {
		OpenAPI  string `json:"openapi"`
		Webhooks map[string]struct {
			Post *struct {
				Parameters []struct {
					Name     string `json:"name"`
					In       string `json:"in"`
					Required bool   `json:"required"`
				} `json:"parameters"`
				RequestBody struct {
					Content map[string]json.RawMessage `json:"content"`
				} `json:"requestBody"`
			} `json:"post"`
		} `json:"webhooks"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("OpenAPI document: %w", err)
	}
	if !strings.HasPrefix(d.OpenAPI, "3.1") {
		return nil, fmt.Errorf("OpenAPI document: version %q, want 3.1.x", d.OpenAPI)
	}
	op := d.Webhooks[name].Post
	if op == nil {
		return nil, fmt.Errorf("OpenAPI document: no webhook %q with a post operation", name)
	}
	if _, ok := op.RequestBody.Content["application/json"]; !ok {
		return nil, fmt.Errorf("OpenAPI webhook %s: no application/json request body", name)
	}
	c := compiler()
	if err := c.AddResource(openAPIURL, root); err != nil {
		return nil, fmt.Errorf("OpenAPI document: %w", err)
	}
	base := openAPIURL + "#/webhooks/" + name + "/post"
	w := &Webhooks{}
	if w.body, err = c.Compile(base + "/requestBody/content/application~1json/schema"); err != nil {
		return nil, fmt.Errorf("OpenAPI webhook %s body: %w", name, err)
	}
	for i, p := range op.Parameters {
		if p.In != "header" {
			continue
		}
		s, err := c.Compile(fmt.Sprintf("%s/parameters/%d/schema", base, i))
		if err != nil {
			return nil, fmt.Errorf("OpenAPI webhook %s header %s: %w", name, p.Name, err)
		}
		w.headers = append(w.headers, header{name: p.Name, required: p.Required, schema: s})
	}
	return w, nil
}

// Headers lists the documented header names.
func (w *Webhooks) Headers() []string {
	var out []string
	for _, h := range w.headers {
		out = append(out, h.name)
	}
	return out
}

// ValidateBody validates a webhook request body.
func (w *Webhooks) ValidateBody(body []byte) error { return validate(w.body, body, "webhook body") }

// Validate checks a webhook request: every required documented header is
// present once and every documented header that is present matches its
// schema (an http.Header; names are matched case-insensitively, other
// headers are the transport's), and the body matches its schema.
func (w *Webhooks) Validate(h map[string][]string, body []byte) error {
	for _, p := range w.headers {
		var vs []string
		for k, v := range h {
			if strings.EqualFold(k, p.name) {
				vs = append(vs, v...)
			}
		}
		switch {
		case len(vs) == 0 && p.required:
			return fmt.Errorf("%w: header %s is missing", ErrViolation, p.name)
		case len(vs) == 0:
			continue
		case len(vs) > 1:
			return fmt.Errorf("%w: header %s has %d values, want 1", ErrViolation, p.name, len(vs))
		}
		if err := p.schema.Validate(vs[0]); err != nil {
			return fmt.Errorf("%w: header %s: %w", ErrViolation, p.name, err)
		}
	}
	return w.ValidateBody(body)
}

func compiler() *jsonschema.Compiler {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	return c
}

func validate(s *jsonschema.Schema, doc []byte, what string) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("%w: %s is not JSON: %w", ErrViolation, what, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrViolation, what, err)
	}
	return nil
}

// asJSON turns a decoded YAML value into the JSON value the schema library
// expects (string keys, json.Number numbers).
func asJSON(y any) (any, error) {
	b, err := json.Marshal(y)
	if err != nil {
		return nil, err
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

func remarshal(v, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}
