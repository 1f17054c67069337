package contract_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.yaml.in/yaml/v3"

	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderevent/contract"
)

func events(t *testing.T) *contract.Events {
	t.Helper()
	ev, err := contract.DefaultEvents()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// full is an event with every field set, so that every field of the Go
// type reaches the JSON.
func full(name orderevent.Name) orderevent.Event {
	return orderevent.Event{Version: orderevent.Version, Name: name, OrderID: uuid.Must(uuid.NewV7()), ClientID: uuid.New(),
		RequestID: "ORD20261202143022a3f9c1", Status: name.Status(), Reason: "out of stock", OccurredAt: time.Now().UTC(), Redrive: 2}
}

func headers(e orderevent.Event) map[string][]string {
	h := map[string][]string{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	for k, v := range e.Headers() {
		h[k] = []string{v}
	}
	return h
}

var topo = orderevent.DefaultTopology

// Every event the Go code can write matches its channel's schemas.
func TestEveryEventMatchesItsSchema(t *testing.T) {
	t.Parallel()
	ev := events(t)
	for _, name := range orderevent.Names() {
		for _, e := range []orderevent.Event{full(name), {Version: orderevent.Version, Name: name, OrderID: uuid.New(),
			ClientID: uuid.New(), RequestID: "r-1", Status: name.Status(), OccurredAt: time.Now()}} {
			b, err := orderevent.Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			if err := ev.Validate(topo, topo.Subject(name), headers(e), b); err != nil {
				t.Errorf("%s: %v\n%s", name, err, b)
			}
			h := headers(e)
			h[orderevent.HeaderMsgID] = []string{e.MsgID() + ":heal42:dlq7.1"}
			h[orderevent.HeaderReplayOf] = []string{"7"}
			if err := ev.Validate(topo, topo.Subject(name), h, b); err != nil {
				t.Errorf("%s healed and replayed: %v", name, err)
			}
		}
	}
}

// The schema of the payload lists exactly the Go type's JSON fields, so
// that a field added to orderevent.Event without the document fails here
// (and, through additionalProperties: false, in the end-to-end test).
func TestPayloadSchemaListsEveryGoField(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Required   []string       `yaml:"required"`
				Properties map[string]any `yaml:"properties"`
				Additional *bool          `yaml:"additionalProperties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(orderevent.AsyncAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schema string
		fields map[string]bool // JSON name → omitempty
	}{
		{"OrderEvent", jsonFields(reflect.TypeFor[orderevent.Event]())},
	} {
		s, ok := doc.Components.Schemas[c.schema]
		if !ok {
			t.Fatalf("no schema %s", c.schema)
		}
		if s.Additional == nil || *s.Additional {
			t.Errorf("%s: additionalProperties must be false", c.schema)
		}
		for f, omit := range c.fields {
			if _, ok := s.Properties[f]; !ok {
				t.Errorf("%s: Go field %q is not in the schema", c.schema, f)
			}
			if !omit && !slices.Contains(s.Required, f) {
				t.Errorf("%s: Go field %q is always written but not required", c.schema, f)
			}
			if omit && slices.Contains(s.Required, f) {
				t.Errorf("%s: Go field %q is omitted when empty but required", c.schema, f)
			}
		}
		for f := range s.Properties {
			if _, ok := c.fields[f]; !ok {
				t.Errorf("%s: schema property %q is not a Go field", c.schema, f)
			}
		}
	}
}

func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = strings.Contains(opts, "omitempty")
	}
	return out
}

// Every header the code defines is documented, and an undocumented one is
// refused.
func TestHeadersDocumented(t *testing.T) {
	t.Parallel()
	ev := events(t)
	e := full(orderevent.Paid)
	for _, k := range []string{orderevent.HeaderMsgID, orderevent.HeaderRequestID, orderevent.HeaderOrderID,
		orderevent.HeaderClientID, orderevent.HeaderEvent} {
		h := headers(e)
		delete(h, k)
		if err := ev.ValidateHeaders(h); !errors.Is(err, contract.ErrViolation) {
			t.Errorf("headers without %s: %v, want a violation", k, err)
		}
	}
	h := headers(e)
	h[orderevent.HeaderReplayOf] = []string{"x"}
	if err := ev.ValidateHeaders(h); !errors.Is(err, contract.ErrViolation) {
		t.Errorf("%s not a dead letter id: %v, want a violation", orderevent.HeaderReplayOf, err)
	}
	h = headers(e)
	h["Orderpipe-Something-New"] = []string{"x"}
	if err := ev.ValidateHeaders(h); !errors.Is(err, contract.ErrViolation) {
		t.Errorf("an undocumented header: %v, want a violation", err)
	}
	h = headers(e)
	h[orderevent.HeaderEvent] = []string{"paid", "paid"}
	if err := ev.ValidateHeaders(h); !errors.Is(err, contract.ErrViolation) {
		t.Errorf("a header twice: %v, want a violation", err)
	}
}

// Payloads that drift from the schema are refused: a required field
// missing, a wrong type, an unknown field, a value out of its enum.
func TestDriftIsRejected(t *testing.T) {
	t.Parallel()
	ev := events(t)
	e := full(orderevent.Paid)
	good, err := orderevent.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for what, b := range map[string][]byte{
		"order_id missing":       mutate(func(m map[string]any) { delete(m, "order_id") }),
		"occurred_at missing":    mutate(func(m map[string]any) { delete(m, "occurred_at") }),
		"version a string":       mutate(func(m map[string]any) { m["version"] = "1" }),
		"version 2":              mutate(func(m map[string]any) { m["version"] = 2 }),
		"redrive a string":       mutate(func(m map[string]any) { m["redrive"] = "1" }),
		"redrive zero":           mutate(func(m map[string]any) { m["redrive"] = 0 }),
		"a new field":            mutate(func(m map[string]any) { m["amount"] = "10.00" }),
		"order_id not a uuid":    mutate(func(m map[string]any) { m["order_id"] = "42" }),
		"order_id nil":           mutate(func(m map[string]any) { m["order_id"] = uuid.Nil.String() }),
		"occurred_at not a time": mutate(func(m map[string]any) { m["occurred_at"] = "yesterday" }),
		"status of another":      mutate(func(m map[string]any) { m["status"] = "reserved" }),
		"event of another":       mutate(func(m map[string]any) { m["event"] = "reserved" }),
		"unknown status":         mutate(func(m map[string]any) { m["status"] = "shipped" }),
		"empty reason":           mutate(func(m map[string]any) { m["reason"] = "" }),
		"bad request_id":         mutate(func(m map[string]any) { m["request_id"] = "a b" }),
		"not JSON":               []byte(`{`),
		"an array":               []byte(`[]`),
	} {
		if err := ev.ValidatePayload(orderevent.Paid, b); !errors.Is(err, contract.ErrViolation) {
			t.Errorf("%s: %v, want a violation", what, err)
		}
	}
	// Headers and payload must agree, and the subject must name the event.
	for what, c := range map[string]struct {
		subject string
		h       func(h map[string][]string)
	}{
		"another subject":      {topo.Subject(orderevent.Reserved), nil},
		"another prefix":       {"other.paid", nil},
		"an unknown subject":   {"orders.shipped", nil},
		"another order header": {topo.Subject(orderevent.Paid), func(h map[string][]string) { h[orderevent.HeaderOrderID] = []string{uuid.NewString()} }},
		"another event header": {topo.Subject(orderevent.Paid), func(h map[string][]string) { h[orderevent.HeaderEvent] = []string{"reserved"} }},
		"a foreign msg id":     {topo.Subject(orderevent.Paid), func(h map[string][]string) { h[orderevent.HeaderMsgID] = []string{uuid.NewString() + ":paid"} }},
		"a msg id of another re-drive": {topo.Subject(orderevent.Paid), func(h map[string][]string) {
			h[orderevent.HeaderMsgID] = []string{orderevent.MsgID(e.OrderID, e.Name, 3)}
		}},
	} {
		h := headers(e)
		if c.h != nil {
			c.h(h)
		}
		if err := ev.Validate(topo, c.subject, h, good); !errors.Is(err, contract.ErrViolation) {
			t.Errorf("%s: %v, want a violation", what, err)
		}
	}
}

// The document has one channel per event name, and a document missing
// one is refused.
func TestEveryNameHasAChannel(t *testing.T) {
	t.Parallel()
	doc := string(orderevent.AsyncAPI())
	for _, n := range orderevent.Names() {
		if !strings.Contains(doc, "address: '{prefix}."+string(n)+"'") {
			t.Errorf("no channel for %s", n)
		}
	}
	broken := strings.Replace(doc, "address: '{prefix}.paid'", "address: '{prefix}.charged'", 1)
	if _, err := contract.LoadEvents([]byte(broken)); err == nil || !strings.Contains(err.Error(), "paid") {
		t.Errorf("a document without the paid channel: %v", err)
	}
	if _, err := contract.LoadEvents([]byte("asyncapi: [")); err == nil {
		t.Error("a document that is not YAML was loaded")
	}
	if _, err := contract.LoadEvents([]byte("asyncapi: 2.6.0\n")); err == nil {
		t.Error("an AsyncAPI 2 document was loaded")
	}
}

// The description states the semantics a subscriber relies on.
func TestDocumentStatesTheSemantics(t *testing.T) {
	t.Parallel()
	var doc struct {
		Info struct {
			Description string `yaml:"description"`
		} `yaml:"info"`
	}
	if err := yaml.Unmarshal(orderevent.AsyncAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"at least once", "Nats-Msg-Id", ":heal<n>", "ordering is not guaranteed",
		"additive", "new `version`", "both versions", "orderpipe events tail"} {
		if !strings.Contains(doc.Info.Description, want) {
			t.Errorf("the description does not say %q", want)
		}
	}
	if !strings.Contains(doc.Info.Description, orderevent.DefaultTopology.Stream) {
		t.Errorf("the description does not name the stream")
	}
}
