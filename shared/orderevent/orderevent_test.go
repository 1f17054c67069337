package orderevent

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/shared/order"
)

func sample() Event {
	return Event{Version: Version, Name: Reserved, OrderID: uuid.Must(uuid.NewV7()), ClientID: uuid.New(),
		RequestID: "r-1", Status: order.StatusReserved, OccurredAt: time.Now().UTC()}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	e := sample()
	b, err := Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.MsgID() != e.MsgID() || got.Name != e.Name || !got.OccurredAt.Equal(e.OccurredAt) {
		t.Fatalf("round trip: %+v != %+v", got, e)
	}
}

func TestMsgIDDeterministic(t *testing.T) {
	t.Parallel()
	e := sample()
	if e.MsgID() != MsgID(e.OrderID, Reserved, 0) {
		t.Fatal("msg id not deterministic")
	}
	e2 := e
	e2.Redrive = 1
	if e2.MsgID() == e.MsgID() {
		t.Fatal("re-drive shares the original id")
	}
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, `{`, `[]`, `{"version":2}`, `{"version":1,"event":"shipped"}`,
		`{"version":1,"event":"paid","order_id":"00000000-0000-0000-0000-000000000000"}`,
		`{"version":1,"event":"paid","order_id":"not-a-uuid"}`} {
		if _, err := Decode([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%q) = %v, want ErrMalformed", in, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(sample())
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Decode(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if _, err := Encode(e); err != nil {
			t.Fatalf("decoded event does not encode: %v", err)
		}
	})
}

func TestStatusNames(t *testing.T) {
	t.Parallel()
	for _, s := range order.Statuses() {
		if ForStatus(s).Status() != s {
			t.Errorf("%s does not round-trip", s)
		}
	}
}
